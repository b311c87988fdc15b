"""Speculative prefill (``RoutingHints.speculative_prefill``): warm a session's next turn. Pure.

When a turn that asked for it finishes (``stop`` or ``length``), its worker prefills the
prompt with the answer appended, as a local request of its own (``max_tokens`` 1, nothing
streamed, no lifecycle phases: routers never counted it), so the blocks are cached (and their
KV events go out as for any request) when the next turn, whose prompt starts with them, comes.
Its id is ``shared.sessions.speculative_request_id``: one per session, so a router that sends the
next turn to another worker cancels it by that id (``Cancel`` with this worker's id), and a
new one replaces one still running.

It warms what the worker knows: prompt + generated token ids. A chat template that renders an
earlier assistant turn differently from what was generated (Qwen3 drops its reasoning) makes the
next prompt diverge where the rendering does; the prompt's blocks still match. Every engine
runs it as an ordinary request (the mocker, vLLM and transformers cache its blocks); an engine
without prefix caching computes it for nothing, so leave the hint off for such workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shared.messages import Generate, SamplingParams
from shared.sessions import speculative_request_id
from shared.worker.records import Emission, EngineInput

SPECULATIVE_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)
WARMED_REASONS = frozenset({"stop", "length"})
"""A turn that ended otherwise (cancelled, an error) has no next turn to warm."""


@dataclass(slots=True)
class _Turn:
    request: EngineInput
    spec_id: str
    output: list[int] = field(default_factory=list)


class Speculation:
    """The turns on this worker that asked for a speculative prefill, and the prefills running."""

    def __init__(self) -> None:
        self._turns: dict[str, _Turn] = {}
        self.running: set[str] = set()
        """Speculative prefills handed to the engine and not ended yet."""

    def __bool__(self) -> bool:
        return bool(self._turns) or bool(self.running)

    def watch(self, gen: Generate, request: EngineInput) -> None:
        """Follow ``request`` if it asked for a speculative prefill (aggregated or decode
        phases: a prefill phase's turn continues on its decode worker)."""
        hints = gen.routing
        if hints is None or not hints.speculative_prefill or gen.prefill_to:
            return
        spec_id = speculative_request_id(gen.request_id, gen.model, hints.session_id)
        self._turns[gen.request_id] = _Turn(request, spec_id)

    def add(self, emission: Emission) -> None:
        """Keep a followed turn's generated tokens (its first choice's)."""
        turn = self._turns.get(emission.request_id)
        if turn is not None and emission.choice == 0:
            turn.output.extend(emission.token_ids)

    def finished(self, emission: Emission, context_length: int) -> EngineInput | None:
        """A followed turn's last emission: the speculative prefill to start, if any."""
        turn = self._turns.pop(emission.request_id, None)
        if turn is None or emission.finish_reason not in WARMED_REASONS or not turn.output:
            return None
        tokens = (*turn.request.token_ids, *turn.output)
        if len(tokens) + 1 > context_length:
            return None
        self.running.add(turn.spec_id)
        return replace(
            turn.request,
            request_id=turn.spec_id,
            token_ids=tokens,
            sampling=SPECULATIVE_SAMPLING,
            resumed_tokens=0,
            phase="both",
            kv_transfer_params=None,
        )

    def is_speculative(self, request_id: str) -> bool:
        return request_id in self.running

    def ended(self, request_id: str) -> None:
        """A speculative prefill finished, was cancelled or replaced."""
        self.running.discard(request_id)

    def forget(self, request_id: str) -> None:
        """A followed turn ended without a last emission here (failed, dropped)."""
        self._turns.pop(request_id, None)
