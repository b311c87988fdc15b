"""The request fields the gateway accepts but does not act on, each with the reason.

Unknown top-level fields are refused (400) unless ``--allow-unknown-fields``; these are not
unknown: OpenAI documents them, clients send them, and what they ask for either does not apply
to a self-hosted server or cannot change the output. Other fields that are accepted only in
their harmless form (``n``-equal ``best_of``, text ``modalities``) are refused otherwise and are
listed in ``CONDITIONAL``. ``tests/unit/gateway/test_accepted_fields.py`` checks this list
against the Structs and against the OpenAI SDK's parameter lists, so neither drifts.
"""

from __future__ import annotations

from typing import Final

IGNORED: Final[dict[str, str]] = {
    "user": "An end-user id for OpenAI's abuse monitoring; nothing here monitors users.",
    "safety_identifier": "Same purpose as `user` (its replacement); no abuse monitoring here.",
    "metadata": "Tags for stored completions; nothing is stored.",
    "store": "Asks OpenAI to store the completion for its dashboard; nothing is stored.",
    "service_tier": "OpenAI's paid processing tiers; every request here is served alike.",
    "prompt_cache_key": "Groups requests for OpenAI's prompt cache; the KV router already finds "
    "shared prefixes from the tokens (use `cache_salt` to separate tenants).",
    "prompt_cache_options": "OpenAI's prompt-cache controls; prefix caching is always on here.",
    "prompt_cache_retention": "OpenAI's prompt-cache lifetime; workers evict by LRU.",
    "prediction": "Predicted output for OpenAI's speculative decoding: a latency hint that "
    "never changes the output.",
    "reasoning_effort": "OpenAI's reasoning models only; here thinking is switched with "
    "`chat_template_kwargs.enable_thinking` and bounded with `nvext.max_thinking_tokens`.",
    "verbosity": "OpenAI's GPT-5 answer-length hint; open models have no such control.",
    "web_search_options": "OpenAI's hosted web search; there is no search tool here.",
    "moderation": "OpenAI's hosted moderation policy; there is no moderation here.",
}
"""Accepted with any valid value and ignored."""

CONDITIONAL: Final[dict[str, str]] = {
    "modalities": 'Only `["text"]`: audio output is refused (400).',
    "audio": "Only `null`: audio output parameters are refused (400).",
    "best_of": "Only `null` or equal to `n`: server-side best-of selection is refused (400).",
    "suffix": "Only `null` or empty: insertion (fill-in-the-middle) is refused (400).",
}
"""Accepted in the form that asks for nothing the gateway cannot do; refused otherwise."""

NVEXT_IGNORED: Final[dict[str, str]] = {
    "session_control": "Dynamo's session open/close calls to workers; a session here is "
    "`agent_context.session_id` (or `x-dynamo-session-id`), kept on one worker by the router.",
    "routing_constraints": "Worker taints; JetServe workers have none (use `allowed_worker_ids`).",
    "request_timestamp_ms": "Trace replay in virtual time; not simulated here.",
    "router": "Parameters for Dynamo's global router; none here.",
}
"""Dynamo ``nvext`` fields accepted and ignored (``nvext`` ignores unknown keys, as Dynamo's)."""

NVEXT_EXTRA_FIELDS: Final[frozenset[str]] = frozenset({"worker_id", "timing"})
"""``nvext.extra_fields`` values served; other names are ignored, as Dynamo ignores them."""

NVEXT_ANNOTATIONS: Final[frozenset[str]] = frozenset(
    {"request_id", "formatted_prompt", "token_ids"}
)
"""``nvext.annotations`` answered as SSE ``event:`` frames; other names are ignored, except
``query_instance_id`` (``QUERY_ANNOTATION``), which asks where the request would go."""

QUERY_ANNOTATION: Final = "query_instance_id"
"""The seed's query-only annotation (also ``query_instance_id:<anything>``): the router answers
with the worker(s) and ranks it would choose and the token ids, generating nothing."""

HEADERS_IGNORED: Final[dict[str, str]] = {}
"""Dynamo's routing headers that have no effect here: none. ``x-dynamo-worker-instance-id`` and
``x-worker-instance-id`` pin a worker, ``x-dynamo-prefill-instance-id`` (``x-prefill-instance-id``)
a prefill worker, ``x-dynamo-dp-rank`` (``x-dp-rank``, ``x-data-parallel-rank``) and
``x-dynamo-prefill-dp-rank`` (``x-prefill-dp-rank``) their ranks; ``x-tenant-id`` salts the KV
cache; ``x-dynamo-request-priority``, ``x-dynamo-request-strict-priority``,
``x-dynamo-meta-policy-class`` and the session headers feed the router queue
(``admission_hints.py``)."""
