"""Speculative prefill bookkeeping (``shared.worker.speculative``): which turns warm what."""

from __future__ import annotations

from shared.messages import Generate, RoutingHints, SamplingParams
from shared.sessions import speculative_request_id
from shared.worker.records import Emission, EngineInput
from shared.worker.speculative import Speculation

PROMPT = (1, 2, 3, 4)


def _gen(*, warm: bool = True, session: str | None = "s", prefill_to: str = "") -> Generate:
    return Generate(
        request_id="r1",
        model="m",
        token_ids=PROMPT,
        sampling=SamplingParams(max_tokens=8),
        stream_to="f.r1",
        routing=RoutingHints(session_id=session, speculative_prefill=warm),
        prefill_to=prefill_to,
    )


def _input(gen: Generate) -> EngineInput:
    return EngineInput(
        request_id=gen.request_id, token_ids=gen.token_ids, sampling=gen.sampling, hash_seed=9
    )


def _followed(**kw: object) -> Speculation:
    speculation = Speculation()
    gen = _gen(**kw)  # type: ignore[arg-type]
    speculation.watch(gen, _input(gen))
    return speculation


def _emit(tokens: tuple[int, ...], index: int, reason: str | None = None) -> Emission:
    return Emission(
        request_id="r1", token_ids=tokens, index=index, finish_reason=reason, done=bool(reason)
    )


def test_a_finished_turn_warms_prompt_and_answer_under_the_sessions_id() -> None:
    speculation = _followed()
    speculation.add(_emit((7, 8), 0))
    last = _emit((9,), 2, "stop")
    speculation.add(last)
    warm = speculation.finished(last, context_length=100)
    assert warm is not None
    assert warm.request_id == speculative_request_id("r1", "m", "s")
    assert (warm.token_ids, warm.sampling.max_tokens, warm.hash_seed) == ((*PROMPT, 7, 8, 9), 1, 9)
    assert speculation.is_speculative(warm.request_id)


def test_a_cancelled_turn_warms_nothing() -> None:
    speculation = _followed()
    speculation.add(_emit((7,), 0))
    assert speculation.finished(_emit((), 1, "cancelled"), context_length=100) is None
    assert not speculation


def test_a_warm_up_past_the_context_length_is_skipped() -> None:
    speculation = _followed()
    speculation.add(_emit((7, 8), 0, "length"))
    assert speculation.finished(_emit((), 2, "length"), context_length=6) is None


def test_turns_without_the_hint_and_prefill_phases_are_not_followed() -> None:
    assert not _followed(warm=False)
    assert not _followed(prefill_to="router.r")


def test_an_ended_warm_up_is_forgotten() -> None:
    speculation = _followed()
    speculation.add(_emit((7,), 0, "stop"))
    warm = speculation.finished(_emit((), 1, "stop"), context_length=100)
    assert warm is not None
    speculation.ended(warm.request_id)
    assert not speculation
