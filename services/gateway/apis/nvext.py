"""Pure: ``nvext``, ``cache_salt`` and the routing headers -> ``RoutingHints`` and a pinned worker.

Headers, named as Dynamo's frontend names them (``lib/llm/src/protocols/common/extensions.rs``):

- ``x-dynamo-worker-instance-id``, or its older alias ``x-worker-instance-id`` (the prefixed one
  wins when both are sent, as in Dynamo), pins a worker, as ``nvext.backend_instance_id`` does.
  Dynamo lets the header silently override the body; here both given must agree (400 otherwise,
  decision 012): silently preferring one would route somewhere the client did not ask.
- ``x-dynamo-prefill-instance-id`` pins the prefill worker of a disaggregated request (as
  ``nvext.prefill_worker_id``), ``x-dynamo-dp-rank`` and ``x-dynamo-prefill-dp-rank`` the ranks
  (as ``nvext.dp_rank`` / ``prefill_dp_rank``), with Dynamo's older aliases. A header and the
  body field given together must agree. The router checks the pins against the fleet (issue 24:
  unknown worker, wrong role or rank out of range -> 400 naming the field; dead -> 503).
- The admission headers (``x-dynamo-request-priority``, ``x-dynamo-request-strict-priority``,
  ``x-dynamo-meta-policy-class``, the session headers) and ``nvext.agent_hints`` /
  ``agent_context`` set the router queue's inputs (issue 26): ``admission_hints.py``.
- ``nvext.annotations: ["query_instance_id"]`` asks where the request would go, without
  generating (``RoutingHints.query_only``).
- ``x-tenant-id`` isolates a tenant's KV cache (Dynamo: it becomes ``nvext.cache_salt``).

Salt precedence. The body salt is ``nvext.cache_salt``, else the top-level ``cache_salt`` (as
Dynamo: ``nvext`` is canonical, the top-level field its fallback). Dynamo then lets
``x-tenant-id`` *replace* it, because routing headers take priority over the body: a header is
what the trusted proxy in front sets, the body what the end client sends. Here too the tenant
cannot be escaped from the body, but a body salt sent with the header is kept *inside* the
tenant instead of being dropped (the effective salt is both, length-prefixed so no two pairs
collide). The reason to differ: ``cache_salt`` exists so that an RL orchestrator's requests after
a weight update never reuse KV computed before it; dropping it whenever a proxy adds a tenant
header would silently bring that reuse back. Header alone or body alone: exactly Dynamo's salt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from services.gateway.apis.accepted_fields import (
    NVEXT_ANNOTATIONS,
    NVEXT_EXTRA_FIELDS,
    QUERY_ANNOTATION,
)
from services.gateway.apis.admission_hints import (
    NO_POLICY,
    Admission,
    AdmissionHeaders,
    AdmissionReader,
    admission,
)
from services.gateway.apis.openai_types import MAX_DP_RANK, Nvext
from shared.errors import InvalidRequest
from shared.messages import RoutingHints
from shared.subjects import is_token

TENANT_HEADER = b"x-tenant-id"
WORKER_HEADER = b"x-worker-instance-id"
DYNAMO_WORKER_HEADER = b"x-dynamo-worker-instance-id"
PREFILL_HEADERS = (b"x-dynamo-prefill-instance-id", b"x-prefill-instance-id")
DP_RANK_HEADERS = (b"x-dynamo-dp-rank", b"x-dp-rank", b"x-data-parallel-rank")
PREFILL_DP_RANK_HEADERS = (b"x-dynamo-prefill-dp-rank", b"x-prefill-dp-rank")
"""Each pin's headers, the prefixed one first: it wins when several are sent, as in Dynamo."""
MAX_SALT_LEN = 256
MAX_ALLOWED_WORKERS = 1024
_PIN_GROUPS = (PREFILL_HEADERS, DP_RANK_HEADERS, PREFILL_DP_RANK_HEADERS)
_PINS = {header: i for i, group in enumerate(_PIN_GROUPS) for header in group}
_ROUTING_NAMES = frozenset({TENANT_HEADER, WORKER_HEADER, DYNAMO_WORKER_HEADER, *_PINS})


@dataclass(frozen=True, slots=True)
class Header:
    """One routing header's value and name (for error messages)."""

    value: str
    name: str


@dataclass(frozen=True, slots=True)
class RoutingHeaders:
    """The routing headers of one HTTP request (``x-tenant-id``, the worker pins)."""

    tenant_id: str | None = None
    worker_instance_id: str | None = None
    worker_header: str = WORKER_HEADER.decode()
    """The header the pin came from (for error messages)."""
    prefill_instance_id: Header | None = None
    dp_rank: Header | None = None
    prefill_dp_rank: Header | None = None
    admission: AdmissionHeaders | None = None
    """Priority, tier, session, policy class and tenant (``admission_hints.py``)."""


NO_HEADERS = RoutingHeaders()


def routing_headers(
    headers: Iterable[tuple[bytes, bytes]], reader: AdmissionReader = NO_POLICY
) -> RoutingHeaders:
    """Pick the routing headers out of raw ASGI headers (names are lower-case there; the last
    of a repeated header counts); a malformed value is an ``InvalidRequest`` at once, before
    the body is looked at. ``reader``: the admission headers and policy of this gateway."""
    names = reader.names
    found: dict[bytes, bytes] | None = None
    for name, value in headers:
        if name in _ROUTING_NAMES or name in names:
            if found is None:
                found = {}
            found[name] = value
    if found is None:
        admitted = reader.read(None, None)
        return NO_HEADERS if admitted is None else RoutingHeaders(admission=admitted)
    tenant = _value(found, TENANT_HEADER)
    worker_header = WORKER_HEADER.decode()
    worker = _value(found, WORKER_HEADER)
    if (dynamo_worker := _value(found, DYNAMO_WORKER_HEADER)) is not None:
        worker, worker_header = dynamo_worker, DYNAMO_WORKER_HEADER.decode()
    prefill, rank, prefill_rank = (_first(found, names) for names in _PIN_GROUPS)
    picked = RoutingHeaders(
        tenant,
        worker,
        worker_header,
        prefill,
        rank,
        prefill_rank,
        reader.read(found, tenant),
    )
    _check_worker_id(picked.worker_instance_id, picked.worker_header)
    if prefill is not None:
        _check_worker_id(prefill.value, prefill.name)
    for header in (rank, prefill_rank):
        if header is not None:
            _rank_of(header)
    effective_salt(None, None, picked.tenant_id)
    return NO_HEADERS if picked == NO_HEADERS else picked


def _value(found: dict[bytes, bytes], name: bytes) -> str | None:
    raw = found.get(name)
    return None if raw is None else raw.decode("latin-1").strip() or None


def _first(found: dict[bytes, bytes], names: tuple[bytes, ...]) -> Header | None:
    for name in names:
        if (text := _value(found, name)) is not None:
            return Header(text, name.decode())
    return None


def routing(
    nvext: Nvext | None, body_salt: str | None, headers: RoutingHeaders
) -> tuple[RoutingHints | None, str | None]:
    """``Preprocess.routing`` and ``Preprocess.worker_id`` (raises ``InvalidRequest``)."""
    ext = nvext or _NO_NVEXT
    decode_param, pinned = _decode_pin(ext)
    worker_id = _pinned_worker(
        pinned, headers.worker_instance_id, headers.worker_header, decode_param
    )
    if worker_id is not None and pinned is None:
        decode_param = headers.worker_header
    allowed = _allowed_workers(ext.allowed_worker_ids)
    if worker_id is not None and allowed is not None and worker_id not in allowed:
        raise InvalidRequest(
            f"The pinned worker `{worker_id}` is not one of `nvext.allowed_worker_ids`.",
            param="nvext.allowed_worker_ids",
        )
    body_prefill = None if ext.prefill_worker_id is None else str(ext.prefill_worker_id)
    header = headers.prefill_instance_id
    prefill = _pinned_worker(
        body_prefill,
        header.value if header is not None else None,
        header.name if header is not None else "",
        "nvext.prefill_worker_id",
    )
    dp_rank = _agreed_rank(ext.dp_rank, headers.dp_rank, "nvext.dp_rank")
    prefill_rank = _agreed_rank(
        ext.prefill_dp_rank, headers.prefill_dp_rank, "nvext.prefill_dp_rank"
    )
    query_only = is_query(ext.annotations)
    salt = effective_salt(body_salt, ext.cache_salt, headers.tenant_id)
    weight, temperature = ext.overlap_score_weight, ext.router_temperature
    pins_given = prefill is not None or dp_rank is not None or prefill_rank is not None
    named = worker_id is not None and decode_param != "nvext.backend_instance_id"
    admitted = admission(ext.agent_hints, ext.agent_context, headers.admission)
    if (
        salt is None
        and weight is None
        and temperature is None
        and allowed is None
        and not pins_given
        and not named
        and not query_only
        and admitted is None
    ):
        return None, worker_id
    if admitted is None:
        admitted = _NO_ADMISSION
    hints = RoutingHints(
        overlap_score_weight=weight,
        router_temperature=temperature,
        cache_salt=salt,
        allowed_worker_ids=allowed,
        dp_rank=dp_rank,
        prefill_worker_id=prefill,
        prefill_dp_rank=prefill_rank,
        decode_worker_id_param=decode_param if worker_id is not None else None,
        query_only=query_only,
        priority=admitted.priority,
        strict_priority=admitted.strict_priority,
        policy_class=admitted.policy_class,
        tenant=admitted.tenant,
        session_id=admitted.session_id,
        osl=admitted.osl,
        speculative_prefill=admitted.speculative_prefill,
    )
    return hints, worker_id


def is_query(annotations: list[str] | None) -> bool:
    """Whether ``nvext.annotations`` asks for query-only mode (``query_instance_id``, also
    with a ``:<value>`` as Dynamo's EPP sends it)."""
    return bool(annotations) and any(
        a == QUERY_ANNOTATION or a.startswith(f"{QUERY_ANNOTATION}:") for a in annotations or ()
    )


def _decode_pin(ext: Nvext) -> tuple[str, str | None]:
    """The body's decode pin and the field it came from (``decode_worker_id`` wins over
    ``backend_instance_id``; both given must agree)."""
    decode = None if ext.decode_worker_id is None else str(ext.decode_worker_id)
    backend = None if ext.backend_instance_id is None else str(ext.backend_instance_id)
    if decode is not None and backend is not None and decode != backend:
        raise InvalidRequest(
            "`nvext.decode_worker_id` and `nvext.backend_instance_id` name different workers.",
            param="nvext.decode_worker_id",
        )
    if decode is not None:
        return "nvext.decode_worker_id", decode
    return "nvext.backend_instance_id", backend


def _agreed_rank(body: int | None, header: Header | None, param: str) -> int | None:
    if header is None:
        return body
    rank = _rank_of(header)
    if body is not None and body != rank:
        raise InvalidRequest(f"`{param}` and `{header.name}` name different ranks.", param=param)
    return rank


def _rank_of(header: Header) -> int:
    value = header.value
    # The length bound first: ``int()`` of a few thousand digits raises (a 500, not a 400).
    if not (value.isascii() and value.isdigit() and len(value) <= 16) or int(value) > MAX_DP_RANK:
        raise InvalidRequest(
            f"`{header.name}` must be a data-parallel rank (an integer from 0 to {MAX_DP_RANK}).",
            param=header.name,
        )
    return int(value)


def effective_salt(body: str | None, nvext: str | None, tenant: str | None) -> str | None:
    """The KV-cache salt from the body (``nvext.cache_salt``, else ``cache_salt``) and the
    tenant header (see the module docstring)."""
    salt = nvext if nvext is not None else body
    if tenant is None:
        return salt
    if len(tenant) > MAX_SALT_LEN:
        raise InvalidRequest(
            f"`x-tenant-id` may be at most {MAX_SALT_LEN} characters.", param="x-tenant-id"
        )
    if salt is None:
        return tenant
    return f"{len(tenant)}:{tenant}:{salt}"


def extra_fields(nvext: Nvext | None) -> tuple[str, ...]:
    """``nvext.extra_fields`` served, sorted; unknown names are ignored (as Dynamo)."""
    if nvext is None or not nvext.extra_fields:
        return ()
    return tuple(sorted(NVEXT_EXTRA_FIELDS.intersection(nvext.extra_fields)))


def annotation_names(nvext: Nvext | None) -> tuple[str, ...]:
    """``nvext.annotations`` answered, in request order without repeats; others ignored."""
    if nvext is None or not nvext.annotations:
        return ()
    return tuple(dict.fromkeys(a for a in nvext.annotations if a in NVEXT_ANNOTATIONS))


def _allowed_workers(ids: list[str | int] | None) -> tuple[str, ...] | None:
    if ids is None:
        return None
    if not ids:
        raise InvalidRequest(
            "`nvext.allowed_worker_ids` must name at least one worker.",
            param="nvext.allowed_worker_ids",
        )
    if len(ids) > MAX_ALLOWED_WORKERS:
        raise InvalidRequest(
            f"`nvext.allowed_worker_ids` may name at most {MAX_ALLOWED_WORKERS} workers.",
            param="nvext.allowed_worker_ids",
        )
    names = tuple(dict.fromkeys(str(i) for i in ids))
    for j, name in enumerate(str(i) for i in ids):
        if not is_token(name):
            raise InvalidRequest(
                "`nvext.allowed_worker_ids` entries must be worker ids "
                "(letters, digits, `_` and `-`).",
                param=f"nvext.allowed_worker_ids[{j}]",
            )
    return tuple(sorted(names))


def _check_worker_id(value: str | None, param: str) -> None:
    if value is not None and not is_token(value):
        raise InvalidRequest(
            f"`{param}` must be a worker id (letters, digits, `_` and `-`).", param=param
        )


def _pinned_worker(
    from_body: str | None,
    from_header: str | None,
    header: str,
    body_param: str = "nvext.backend_instance_id",
) -> str | None:
    _check_worker_id(from_body, body_param)
    _check_worker_id(from_header, header)
    if from_body is not None and from_header is not None and from_body != from_header:
        raise InvalidRequest(
            f"`{body_param}` and `{header}` name different workers.", param=body_param
        )
    return from_body or from_header


_NO_NVEXT = Nvext()
_NO_ADMISSION = Admission()
