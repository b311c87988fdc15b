"""A migrated request (``resumed_tokens``) goes on exactly where the lost worker stopped."""

from __future__ import annotations

import pytest

from services.formatter.migration import next_attempt
from services.mocker.engine import Emission, Engine, EngineConfig, EngineError
from shared.messages import Generate, SamplingParams
from tests.unit.migration_support import migratable_open

CORPUS = tuple(range(1000, 1060))  # short, so outputs wrap around the corpus end
EOS = 7
PROMPT = (1, 2, 3, 4, 5)


def _engine() -> Engine:
    return Engine(EngineConfig(speedup_ratio=0.0, eos_token_ids=(EOS,), seed=5), CORPUS)


def _run(engine: Engine, gen: Generate) -> list[int]:
    engine.add(gen.request_id, gen.token_ids, gen.sampling, resumed_tokens=gen.resumed_tokens)
    out: list[Emission] = []
    for _ in range(10_000):
        if not engine.has_work:
            return [t for e in out for t in e.token_ids]
        out += [e for e in engine.step().emissions if e.request_id == gen.request_id]
    raise AssertionError("the engine never went idle")


def _original(sampling: SamplingParams) -> Generate:
    return Generate(request_id="r", model="m", token_ids=PROMPT, sampling=sampling, stream_to="")


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=40, ignore_eos=True),
        SamplingParams(max_tokens=40, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=150, ignore_eos=True),  # wraps past the corpus end
        SamplingParams(max_tokens=90, min_tokens=70, stop_token_ids=(EOS, 1010)),
    ],
    ids=["prompt-hash", "seeded", "wraps", "min-tokens-skips-stop-ids"],
)
@pytest.mark.parametrize("cut", [1, 17, 39])  # the corpus end (EOS) is tested apart, below
def test_output_across_a_migration_equals_the_output_without_one(
    sampling: SamplingParams, cut: int
) -> None:
    whole = _run(_engine(), _original(sampling))
    assert len(whole) > cut, "the request must still be running at the cut"
    attempt = next_attempt(migratable_open(_original(sampling)), whole[:cut], 0, "fmt.r")
    assert isinstance(attempt, Generate)
    rest = _run(_engine(), attempt)
    assert whole[:cut] + rest == whole


def test_the_corpus_end_still_stops_after_a_migration() -> None:
    sampling = SamplingParams(max_tokens=200)
    whole = _run(_engine(), _original(sampling))
    assert whole[-1] == EOS
    attempt = next_attempt(migratable_open(_original(sampling)), whole[:5], 0, "fmt.r")
    assert isinstance(attempt, Generate)
    assert whole[:5] + _run(_engine(), attempt) == whole


def test_resumed_tokens_must_leave_an_original_prompt() -> None:
    with pytest.raises(EngineError):
        _engine().add("r", PROMPT, SamplingParams(), resumed_tokens=len(PROMPT))
