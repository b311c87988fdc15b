"""The worker runtime every engine runs behind (issue 11): registration, subscriptions, token
batching, cancellation, drain, KV events and load; ``engine.py`` is the contract an engine meets.
``simple.py`` is the base of the workers with no engine (tensor echo, embeddings, media);
``presence.py`` the cards-and-subscriptions order both share."""
