"""The worker runtime every engine runs behind (issue 11): registration, subscriptions, token
batching, cancellation, drain, KV events and load; ``engine.py`` is the contract an engine meets."""
