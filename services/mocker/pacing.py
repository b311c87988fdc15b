"""When a worker's engine loop sleeps and publishes (decision 005). Pure: clock values come in.

Sleeping (speedup > 0): steps run on a running deadline. A step starts where the last one ended,
or at most ``MAX_TIMING_DEBT_S`` in the past when publishing fell behind, so publishing overhead
does not stretch the simulated rate and a long stall is not made up by a burst. Its tokens go
out at its end, or (Dynamo's step order) after its prefill part, and then it sleeps the rest.

Bursting (speedup 0): steps run back to back; what is buffered goes out (and the loop yields)
every ``FLUSH_EVERY_STEPS`` steps or ``FLUSH_INTERVAL_S``, whichever comes first.
"""

from __future__ import annotations

from dataclasses import dataclass

FLUSH_EVERY_STEPS = 8
"""At speedup 0, publish buffered tokens (and yield) after this many back-to-back steps ..."""
FLUSH_INTERVAL_S = 0.001
"""... or after this much wall time, whichever comes first."""
MAX_TIMING_DEBT_S = 0.05
"""When publishing falls behind the simulated clock, forgive at most this much lag."""


@dataclass(frozen=True, slots=True)
class StepTimes:
    """When one simulated step publishes its tokens, and when it ends after that."""

    emit_at: float
    end_at: float | None
    """``None``: the step ends when its tokens go out; else sleep until then after publishing."""


class Pacer:
    """The pacing of one engine loop run: a deadline when sleeping, a burst count at speedup 0."""

    __slots__ = ("_burst_start", "_burst_steps", "_deadline", "emit_after_prefill", "is_sleeping")

    def __init__(self, *, speedup_ratio: float, emit_after_prefill: bool, now: float) -> None:
        self.is_sleeping = speedup_ratio > 0
        """False at speedup 0: never sleep, burst and flush (``flush_due``)."""
        self.emit_after_prefill = emit_after_prefill
        """Dynamo's step order: tokens go out after the step's prefill part, before its decode."""
        self._deadline = now
        self._burst_start = now
        self._burst_steps = 0

    def step(self, now: float, duration_s: float, prefill_s: float) -> StepTimes:
        """Sleeping: place a step of ``duration_s`` (``prefill_s`` of it first) on the clock."""
        start = max(self._deadline, now - MAX_TIMING_DEBT_S)
        end = self._deadline = start + duration_s
        if self.emit_after_prefill:
            return StepTimes(emit_at=start + prefill_s, end_at=end)
        return StepTimes(emit_at=end, end_at=None)

    def flush_due(self, now: float) -> bool:
        """Bursting: one more step is done at ``now``; whether to publish everything and yield."""
        self._burst_steps += 1
        return self._burst_steps >= FLUSH_EVERY_STEPS or now - self._burst_start >= FLUSH_INTERVAL_S

    def flushed(self, now: float) -> None:
        """Bursting: a flush (and yield) ended at ``now``; the next burst starts counting."""
        self._burst_start, self._burst_steps = now, 0
