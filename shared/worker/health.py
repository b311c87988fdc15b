"""Is this worker's engine alive? The idle canary and the progress watchdog (decision 029). Pure:
``now`` and the engine's progress count are passed in.

A worker's runtime answers routers' pings itself, so an engine that hangs inside a live process
is invisible to them. Two checks go through the engine instead:

- **canary** (Dynamo's ``DYN_CANARY_WAIT_TIME`` / ``DYN_HEALTH_CHECK_REQUEST_TIMEOUT``): when the
  engine has had nothing to do and produced nothing for ``idle_s``, a tiny internal request (the
  payload, ``CanaryPayload``) is sent to it; it must finish within ``timeout_s``;
- **watchdog**: while the engine has work, it must make progress (emit output, step) at least
  every ``stall_s``, counted from its last progress or from when work came to an idle engine:
  generous, since one long prefill step emits nothing. While a canary is out its deadline
  rules instead.

A miss (a canary late or failed, or a stall) makes the engine unhealthy. While unhealthy one
canary is kept in the engine, without a deadline: when it finishes, the engine is healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from shared.messages import SamplingParams

UnhealthyReason = Literal["canary_timeout", "canary_failed", "engine_stalled"]
Action = Literal["send_canary", "unhealthy", "recovered"]

DEFAULT_PAYLOAD = '{"token_ids": [1], "sampling": {"max_tokens": 1, "temperature": 0.0}}'
"""One prompt token, one greedy output token: the least work an engine can be asked for."""
MAX_TICK_S = 1.0
MIN_TICK_S = 0.05
PAUSED_S = 3.0
"""Two looks further apart than a tick and this: the whole process was stopped (SIGSTOP, a VM
pause), not the engine alone; its clocks start again instead of judging the engine by it."""


class CanaryPayload(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The canary's request (``--health-check-payload``, JSON): what ``EngineInput`` gets."""

    token_ids: tuple[int, ...]
    sampling: SamplingParams = msgspec.field(
        default_factory=lambda: SamplingParams(max_tokens=1, temperature=0.0)
    )


def parse_payload(text: str) -> CanaryPayload:
    """Decode and check a payload; ``ValueError`` naming what is wrong."""
    try:
        payload = msgspec.json.decode(text, type=CanaryPayload)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a canary payload: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not payload.token_ids:
        raise ValueError("token_ids must name at least one prompt token")
    if any(t < 0 for t in payload.token_ids):
        raise ValueError("token_ids must be non-negative")
    if payload.sampling.max_tokens < 1:
        raise ValueError("sampling.max_tokens must be at least 1")
    return payload


def check_payload(text: str) -> str:
    """A ``--health-check-payload`` value: checked, kept as given."""
    parse_payload(text)
    return text


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthSettings:
    """The three timings; 0 turns that check off."""

    idle_s: float
    timeout_s: float
    stall_s: float

    @property
    def enabled(self) -> bool:
        return self.idle_s > 0 or self.stall_s > 0

    @property
    def tick_s(self) -> float:
        """How often ``observe`` should be called: a quarter of the shortest timing."""
        timings = [t for t in (self.idle_s, self.timeout_s, self.stall_s) if t > 0]
        if not timings:
            return MAX_TICK_S
        return min(MAX_TICK_S, max(MIN_TICK_S, min(timings) / 4))


class EngineHealth:
    """One engine's health: its last progress, its canary, and the verdict."""

    __slots__ = (
        "_canary_ended_at",
        "_canary_sent_at",
        "_observed_at",
        "_progress",
        "_progress_at",
        "_was_busy",
        "healthy",
        "reason",
        "settings",
    )

    def __init__(self, settings: HealthSettings, now: float) -> None:
        self.settings = settings
        self.healthy = True
        self.reason: UnhealthyReason | None = None
        """Why the engine is unhealthy (None while healthy)."""
        self._progress = 0
        self._progress_at = now
        self._canary_sent_at: float | None = None
        self._canary_ended_at = now
        self._was_busy = False
        self._observed_at = now

    @property
    def canary_in_flight(self) -> bool:
        return self._canary_sent_at is not None

    def since_progress(self, now: float) -> float:
        """Seconds since the engine last made progress (as of the last ``observe``)."""
        return now - self._progress_at

    def observe(self, now: float, progress: int, *, busy: bool) -> Action | None:
        """Look at the engine: ``progress`` counts its outputs so far, ``busy`` says whether it
        has any request (the canary included). At most one action per call."""
        paused = now - self._observed_at > self.settings.tick_s + PAUSED_S
        self._observed_at = now
        if progress != self._progress or (busy and not self._was_busy) or paused:
            # new output, work after an idle spell, or a process that was stopped: the stall
            # clock starts from now
            self._progress, self._progress_at = progress, now
        self._was_busy = busy
        if paused and self._canary_sent_at is not None:
            self._canary_sent_at = now
        s = self.settings
        sent_at = self._canary_sent_at
        if not self.healthy:
            # Keep one canary in the engine; a failed one is sent again after a pause.
            if sent_at is None and now - self._canary_ended_at >= s.timeout_s:
                return self._send(now)
            return None
        if sent_at is not None and s.timeout_s > 0 and now - sent_at >= s.timeout_s:
            return self._fail("canary_timeout")
        if sent_at is None and busy and s.stall_s > 0 and now - self._progress_at >= s.stall_s:
            return self._fail("engine_stalled")
        if not busy and sent_at is None and s.idle_s > 0 and now - self._progress_at >= s.idle_s:
            return self._send(now)
        return None

    def canary_ended(self, now: float, *, ok: bool) -> Action | None:
        """The canary finished (``ok``) or failed: "recovered" when that ends a bad spell; a
        failure of a healthy engine's canary is "unhealthy"."""
        if self._canary_sent_at is None:
            return None
        self._canary_sent_at = None
        self._canary_ended_at = now
        if ok:
            self._progress_at = now
            if not self.healthy:
                self.healthy, self.reason = True, None
                return "recovered"
            return None
        return None if not self.healthy else self._fail("canary_failed")

    def _send(self, now: float) -> Action:
        self._canary_sent_at = now
        return "send_canary"

    def _fail(self, reason: UnhealthyReason) -> Action:
        self.healthy, self.reason = False, reason
        return "unhealthy"
