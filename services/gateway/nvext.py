"""Pure: ``nvext``, ``cache_salt`` and the routing headers -> ``RoutingHints`` and a pinned worker.

Headers, named as Dynamo's frontend names them (``lib/llm/src/protocols/common/extensions.rs``):

- ``x-dynamo-worker-instance-id``, or its older alias ``x-worker-instance-id`` (the prefixed one
  wins when both are sent, as in Dynamo), pins a worker, as ``nvext.backend_instance_id`` does.
  Dynamo lets the header silently override the body; here both given must agree (400 otherwise,
  decision 012): silently preferring one would route somewhere the client did not ask.
- ``x-dynamo-prefill-instance-id``, ``x-dynamo-dp-rank``, ``x-dynamo-prefill-dp-rank``, the
  request-priority headers and their aliases are accepted and have no effect: JetServe workers
  are aggregated, run one engine each and have no queue (``accepted_fields.HEADERS_IGNORED``).
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

from services.gateway.accepted_fields import NVEXT_ANNOTATIONS, NVEXT_EXTRA_FIELDS
from services.gateway.openai_types import Nvext
from shared.errors import InvalidRequest
from shared.messages import RoutingHints
from shared.subjects import is_token

TENANT_HEADER = b"x-tenant-id"
WORKER_HEADER = b"x-worker-instance-id"
DYNAMO_WORKER_HEADER = b"x-dynamo-worker-instance-id"
MAX_SALT_LEN = 256
MAX_ALLOWED_WORKERS = 1024


@dataclass(frozen=True, slots=True)
class RoutingHeaders:
    """The routing headers of one HTTP request (``x-tenant-id``, the worker pin)."""

    tenant_id: str | None = None
    worker_instance_id: str | None = None
    worker_header: str = WORKER_HEADER.decode()
    """The header the pin came from (for error messages)."""


NO_HEADERS = RoutingHeaders()


def routing_headers(headers: Iterable[tuple[bytes, bytes]]) -> RoutingHeaders:
    """Pick the routing headers out of raw ASGI headers (names are lower-case there); a
    malformed value is an ``InvalidRequest`` at once, before the body is looked at."""
    tenant = worker = dynamo_worker = None
    for name, value in headers:
        if name == TENANT_HEADER:
            tenant = value.decode("latin-1").strip() or None
        elif name == DYNAMO_WORKER_HEADER:
            dynamo_worker = value.decode("latin-1").strip() or None
        elif name == WORKER_HEADER:
            worker = value.decode("latin-1").strip() or None
    if tenant is None and worker is None and dynamo_worker is None:
        return NO_HEADERS
    if dynamo_worker is not None:
        picked = RoutingHeaders(tenant, dynamo_worker, DYNAMO_WORKER_HEADER.decode())
    else:
        picked = RoutingHeaders(tenant_id=tenant, worker_instance_id=worker)
    _pinned_worker(None, picked.worker_instance_id, picked.worker_header)
    effective_salt(None, None, picked.tenant_id)
    return picked


def routing(
    nvext: Nvext | None, body_salt: str | None, headers: RoutingHeaders
) -> tuple[RoutingHints | None, str | None]:
    """``Preprocess.routing`` and ``Preprocess.worker_id`` (raises ``InvalidRequest``)."""
    ext = nvext or _NO_NVEXT
    pinned = None if ext.backend_instance_id is None else str(ext.backend_instance_id)
    worker_id = _pinned_worker(pinned, headers.worker_instance_id, headers.worker_header)
    allowed = _allowed_workers(ext.allowed_worker_ids)
    if worker_id is not None and allowed is not None and worker_id not in allowed:
        raise InvalidRequest(
            f"The pinned worker `{worker_id}` is not one of `nvext.allowed_worker_ids`.",
            param="nvext.allowed_worker_ids",
        )
    salt = effective_salt(body_salt, ext.cache_salt, headers.tenant_id)
    weight, temperature = ext.overlap_score_weight, ext.router_temperature
    if salt is None and weight is None and temperature is None and allowed is None:
        return None, worker_id
    hints = RoutingHints(
        overlap_score_weight=weight,
        router_temperature=temperature,
        cache_salt=salt,
        allowed_worker_ids=allowed,
    )
    return hints, worker_id


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


def _pinned_worker(from_body: str | None, from_header: str | None, header: str) -> str | None:
    for value, param in ((from_body, "nvext.backend_instance_id"), (from_header, header)):
        if value is not None and not is_token(value):
            raise InvalidRequest(
                f"`{param}` must be a worker id (letters, digits, `_` and `-`).", param=param
            )
    if from_body is not None and from_header is not None and from_body != from_header:
        raise InvalidRequest(
            f"`nvext.backend_instance_id` and `{header}` name different workers.",
            param="nvext.backend_instance_id",
        )
    return from_body or from_header


_NO_NVEXT = Nvext()
