"""Pure: a request's admission inputs (issue 26) -> the ``RoutingHints`` admission fields.

Read from headers (the same names over gRPC metadata) and from ``nvext`` (Dynamo's names):

- ``x-dynamo-request-priority`` / ``nvext.agent_hints.priority``: seconds the request moves
  ahead in its tier's queue (negative: behind); finite, ``|x| <= 3600``. Dynamo's deprecated
  ``agent_hints.latency_sensitivity`` stands in when ``priority`` is absent.
- ``x-dynamo-request-strict-priority`` / ``nvext.agent_hints.strict_priority``: the queue tier,
  an integer 0..100, higher served first.
- ``nvext.agent_hints.osl`` (expected output tokens, 1..10,000,000) and
  ``nvext.agent_hints.speculative_prefill`` (a boolean): body only.
- The session: ``x-dynamo-session-id``, else an agent's own session header (``SESSION_HEADERS``,
  as Dynamo's ``protocols/agents.rs`` recognises them), and ``nvext.agent_context.session_id``:
  1..256 printable ASCII characters without spaces.
- ``x-dynamo-meta-policy-class`` and the tenant: with ``--admission-config`` every request gets
  its class resolved (``AdmissionPolicy.class_of``; the default class when no header picks
  one) and its tenant (``tenant_of``: the API key's, else ``x-tenant-id``). Without a policy
  file the header may only name the one default class, and changes nothing.

A header and its body field given together must agree (400 otherwise, decision 012, as the
worker pins). Every bad value is an ``InvalidRequest`` naming the header or field (``param``).
Work is done only for what a request carries: a request with none of these, on a gateway
without a policy file, costs one dictionary lookup per header (``HeaderNames``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TypeVar

from services.gateway.apis.openai_types import (
    MAX_PRIORITY_S,
    MAX_STRICT_PRIORITY,
    SESSION_ID_PATTERN,
    AgentContext,
    AgentHints,
)
from shared.admission import CLASS_HEADER, AdmissionPolicy
from shared.errors import InvalidRequest

PRIORITY_HEADER = b"x-dynamo-request-priority"
STRICT_PRIORITY_HEADER = b"x-dynamo-request-strict-priority"
POLICY_CLASS_HEADER = CLASS_HEADER.encode()
DYNAMO_SESSION_HEADER = b"x-dynamo-session-id"
SESSION_HEADERS = (
    DYNAMO_SESSION_HEADER,
    b"x-claude-code-session-id",
    b"x-session-id",
    b"x-agent-session-id",
)
"""The session headers, the first present wins: Dynamo's own, then Claude Code's, OpenCode's
(``x-session-id``) and the generic ``x-agent-session-id``."""
AUTH_HEADERS = (b"authorization", b"x-api-key")
ADMISSION_HEADERS = frozenset(
    {PRIORITY_HEADER, STRICT_PRIORITY_HEADER, POLICY_CLASS_HEADER, *SESSION_HEADERS}
)
T = TypeVar("T", float, int, str)
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_BEARER = b"bearer "
_MAX_NUMBER_LEN = 32
_OPEN_POLICY = AdmissionPolicy(class_header=True)
"""No policy file: the header is checked against the one default class and changes nothing."""


@dataclass(frozen=True, slots=True)
class AdmissionHeaders:
    """The admission headers of one request, checked; class and tenant resolved."""

    priority: float | None = None
    strict_priority: int | None = None
    session_id: str | None = None
    session_header: str = ""
    policy_class: str | None = None
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """The ``RoutingHints`` admission fields of one request (their defaults: nothing asked)."""

    priority: float = 0.0
    strict_priority: int = 0
    policy_class: str | None = None
    tenant: str | None = None
    session_id: str | None = None
    osl: int | None = None
    speculative_prefill: bool = False


class AdmissionReader:
    """What one gateway reads from a request's headers, with its policy (``None``: no
    ``--admission-config``); built once, asked per request."""

    __slots__ = ("_default", "names", "policy")

    def __init__(self, policy: AdmissionPolicy | None = None) -> None:
        self.policy = policy
        self.names = ADMISSION_HEADERS | (
            frozenset(AUTH_HEADERS) if policy is not None and policy.api_keys else frozenset()
        )
        """Header names ``read`` needs (the routing headers' table adds them)."""
        self._default = None if policy is None else self._resolved(None, None, None)

    def read(
        self, found: dict[bytes, bytes] | None, tenant_header: str | None
    ) -> AdmissionHeaders | None:
        """The admission headers among ``found`` (name -> raw value, names from ``names``);
        ``None`` when there are none and no policy file."""
        if not found:
            return self._default
        priority = strict = session = None
        session_header = ""
        if (raw := found.get(PRIORITY_HEADER)) is not None:
            priority = parse_priority(_text(raw), PRIORITY_HEADER.decode())
        if (raw := found.get(STRICT_PRIORITY_HEADER)) is not None:
            strict = parse_strict_priority(_text(raw), STRICT_PRIORITY_HEADER.decode())
        for name in SESSION_HEADERS:
            if (raw := found.get(name)) is not None:
                session_header = name.decode()
                session = check_session_id(_text(raw), session_header)
                break
        class_header = found.get(POLICY_CLASS_HEADER)
        resolved = self._resolved(
            None if class_header is None else _text(class_header),
            tenant_header,
            self._api_key(found),
        )
        if priority is None and strict is None and session is None and resolved is None:
            return None
        return AdmissionHeaders(
            priority=priority,
            strict_priority=strict,
            session_id=session,
            session_header=session_header,
            policy_class=resolved.policy_class if resolved is not None else None,
            tenant=resolved.tenant if resolved is not None else None,
        )

    def _api_key(self, found: dict[bytes, bytes]) -> str | None:
        """The key the request authenticated with (``core/auth.py``: ``Authorization: Bearer``
        or ``x-api-key``); with both, the one the policy knows."""
        if self.policy is None or not self.policy.api_keys:
            return None
        keys = []
        bearer = found.get(b"authorization")
        if bearer is not None and bearer[:7].lower() == _BEARER:
            keys.append(bearer[7:].strip().decode("latin-1"))
        if (key := found.get(b"x-api-key")) is not None:
            keys.append(key.strip().decode("latin-1"))
        known = self.policy.api_keys
        return next((k for k in keys if k in known), keys[0] if keys else None)

    def _resolved(
        self, class_header: str | None, tenant_header: str | None, api_key: str | None
    ) -> AdmissionHeaders | None:
        """Class and tenant; without a policy file only the header's check (``None``)."""
        policy = self.policy
        if policy is None:
            if class_header is not None:
                _OPEN_POLICY.class_of(None, class_header)  # only the default class exists
            return None
        tenant = policy.tenant_of(api_key, tenant_header)
        return AdmissionHeaders(policy_class=policy.class_of(tenant, class_header), tenant=tenant)


NO_POLICY = AdmissionReader()


def admission(
    hints: AgentHints | None, context: AgentContext | None, headers: AdmissionHeaders | None
) -> Admission | None:
    """The admission fields from ``nvext.agent_hints`` / ``agent_context`` and the headers;
    ``None`` when the request asks for nothing (a header and its field must agree)."""
    if hints is None and context is None and headers is None:
        return None
    head = headers or _NO_HEADERS
    body = hints or _NO_HINTS
    body_priority = body.priority if body.priority is not None else body.latency_sensitivity
    priority = _agreed(
        body_priority, head.priority, "nvext.agent_hints.priority", PRIORITY_HEADER.decode()
    )
    strict = _agreed(
        body.strict_priority,
        head.strict_priority,
        "nvext.agent_hints.strict_priority",
        STRICT_PRIORITY_HEADER.decode(),
    )
    body_session = context.session_id if context is not None else None
    if body_session is not None:  # the schema's pattern lets a trailing newline through
        check_session_id(body_session, "nvext.agent_context.session_id")
    session = _agreed(
        body_session, head.session_id, "nvext.agent_context.session_id", head.session_header
    )
    found = Admission(
        priority=float(priority) if priority is not None else 0.0,
        strict_priority=strict or 0,
        policy_class=head.policy_class,
        tenant=head.tenant,
        session_id=session,
        osl=body.osl,
        speculative_prefill=bool(body.speculative_prefill),
    )
    return None if found == _NOTHING else found


def parse_priority(text: str, name: str) -> float:
    """A priority header's seconds: a finite number, at most ``MAX_PRIORITY_S`` either way."""
    try:
        # The length bound first: float() of a huge string costs, and says nothing more.
        value = float(text) if len(text) <= _MAX_NUMBER_LEN else math.nan
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and abs(value) <= MAX_PRIORITY_S):
        raise InvalidRequest(
            f"`{name}` must be a number of seconds from {-MAX_PRIORITY_S:g} to {MAX_PRIORITY_S:g}.",
            param=name,
        )
    return value


def parse_strict_priority(text: str, name: str) -> int:
    """A strict-priority header's tier: an integer from 0 to ``MAX_STRICT_PRIORITY``."""
    if not (text.isascii() and text.isdigit() and len(text) <= 3) or int(text) > (
        MAX_STRICT_PRIORITY
    ):
        raise InvalidRequest(
            f"`{name}` must be a queue tier (an integer from 0 to {MAX_STRICT_PRIORITY}).",
            param=name,
        )
    return int(text)


def check_session_id(text: str, name: str) -> str:
    """A session id: 1 to 256 printable ASCII characters, no spaces."""
    if not _SESSION_ID.fullmatch(text):
        raise InvalidRequest(
            f"`{name}` must be a session id: 1 to 256 printable ASCII characters, no spaces.",
            param=name,
        )
    return text


def _agreed(body: T | None, header: T | None, body_param: str, header_name: str) -> T | None:
    if body is not None and header is not None and body != header:
        raise InvalidRequest(
            f"`{body_param}` and `{header_name}` disagree ({body!r} and {header!r}).",
            param=body_param,
        )
    return header if header is not None else body


def _text(raw: bytes) -> str:
    return raw.decode("latin-1").strip()


_NO_HEADERS = AdmissionHeaders()
_NO_HINTS = AgentHints()
_NOTHING = Admission()
