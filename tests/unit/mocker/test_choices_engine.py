"""The engine with ``n`` > 1 (one sequence per choice, each finishing on its own, the prompt's
blocks shared), structured scripts (emitted, then EOS, cut by max_tokens) and logprobs."""

from __future__ import annotations

from collections.abc import Sequence

from services.mocker.engine import Emission, Engine, EngineConfig
from shared.messages import Guided, SamplingParams
from shared.worker.outbox import Outbox

CORPUS = tuple(range(1000, 1200))
EOS = 7
TOOL = {"name": "f", "parameters": {"type": "object", "properties": {}}}


def _encode(text: str) -> Sequence[int]:
    """A fake tokenizer: one id per character (ids 2000+), enough to follow the script."""
    return [2000 + ord(c) for c in text]


def _decode(ids: Sequence[int]) -> str:
    return "".join(chr(i - 2000) for i in ids if i >= 2000)


def _engine(**overrides: object) -> Engine:
    kwargs: dict[str, object] = {"speedup_ratio": 0.0, "eos_token_ids": (EOS,), "block_size": 4}
    kwargs.update(overrides)
    return Engine(EngineConfig(**kwargs), CORPUS, encode=_encode)  # type: ignore[arg-type]


def _run(engine: Engine) -> list[Emission]:
    out: list[Emission] = []
    for _ in range(10_000):
        if not engine.has_work:
            return out
        out.extend(engine.step().emissions)
    raise AssertionError("the engine never went idle")


def _by_choice(emissions: list[Emission]) -> dict[int, list[Emission]]:
    out: dict[int, list[Emission]] = {}
    for e in emissions:
        out.setdefault(e.choice, []).append(e)
    return out


PROMPT = tuple(range(1, 18))  # 17 tokens: 4 full blocks of 4


class TestChoices:
    def test_each_choice_runs_and_finishes_on_its_own(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(n=3, max_tokens=6, seed=1))
        choices = _by_choice(_run(engine))
        assert sorted(choices) == [0, 1, 2]
        for emissions in choices.values():
            assert [e.index for e in emissions] == list(range(6))
            assert [e.finish_reason for e in emissions][-1] == "length"
            assert all(e.finish_reason is None for e in emissions[:-1])
        tokens = {c: tuple(t for e in es for t in e.token_ids) for c, es in choices.items()}
        assert len(set(tokens.values())) == 3  # each choice at its own offset

    def test_greedy_choices_are_one_sequence(self) -> None:
        for greedy in (SamplingParams(temperature=0.0), SamplingParams(greedy=True)):
            engine = _engine()
            engine.add(
                "r",
                PROMPT,
                SamplingParams(
                    n=3, max_tokens=6, seed=1, greedy=greedy.greedy, temperature=greedy.temperature
                ),
            )
            choices = _by_choice(_run(engine))
            tokens = {c: tuple(t for e in es for t in e.token_ids) for c, es in choices.items()}
            assert sorted(tokens) == [0, 1, 2]
            assert len(set(tokens.values())) == 1  # greedy decoding has one answer

    def test_only_the_last_finishing_emission_is_done(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(n=2, max_tokens=3))
        emissions = _run(engine)
        assert [e.done for e in emissions].count(True) == 1
        assert emissions[-1].done
        assert "r" not in engine

    def test_choice_zero_is_the_n1_output(self) -> None:
        one, three = _engine(), _engine()
        one.add("r", PROMPT, SamplingParams(max_tokens=5))
        three.add("r", PROMPT, SamplingParams(n=3, max_tokens=5))
        first = [t for e in _run(one) for t in e.token_ids]
        zero = [t for e in _by_choice(_run(three))[0] for t in e.token_ids]
        assert first == zero

    def test_prompt_blocks_are_shared_between_choices(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(n=3, max_tokens=50))
        engine.step()
        # 4 shared prompt blocks + a block each for the partial last prompt token and output.
        assert engine.cache.used_blocks == 4 + 3
        first = _by_choice(engine.step().emissions)
        assert sorted(first) == [0, 1, 2]
        assert engine.load().active == 3

    def test_cancel_ends_every_choice(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(n=3, max_tokens=50))
        engine.step()
        emission = engine.cancel("r")
        assert emission is not None
        assert (emission.finish_reason, emission.done) == ("cancelled", True)
        assert not engine.has_work
        assert engine.cache.used_blocks <= 4  # only cached (free) prompt blocks may stay
        box = Outbox("w")
        box.open("r", "s", prompt_tokens=len(PROMPT), n=3)
        box.add(emission)
        batches = []
        while (taken := box.take("r")) is not None:
            batches.append(taken[1])
        assert sorted((b.choice, b.finish_reason) for b in batches) == [
            (0, "cancelled"),
            (1, "cancelled"),
            (2, "cancelled"),
        ]
        assert "r" not in box


class TestScripts:
    def test_tool_call_script_then_eos(self) -> None:
        engine = _engine()
        guided = Guided(tools=(TOOL,), tool_choice="required")
        engine.add("r", PROMPT, SamplingParams(max_tokens=500, guided=guided))
        emissions = _run(engine)
        ids = [t for e in emissions for t in e.token_ids]
        assert ids[-1] == EOS
        assert (emissions[-1].finish_reason, emissions[-1].stop_token_id) == ("stop", EOS)
        assert _decode(ids) == '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'

    def test_max_tokens_cuts_the_script(self) -> None:
        engine = _engine()
        guided = Guided(tools=(TOOL,), tool_choice="required")
        engine.add("r", PROMPT, SamplingParams(max_tokens=5, guided=guided))
        emissions = _run(engine)
        assert _decode([t for e in emissions for t in e.token_ids]) == "<tool"
        assert emissions[-1].finish_reason == "length"

    def test_reasoning_then_corpus_prose(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(max_tokens=400, guided=Guided(thinking=True)))
        ids = [t for e in _run(engine) for t in e.token_ids]
        text = _decode(ids)
        assert text.startswith("<think>\n")
        assert text.endswith("\n</think>\n\n")
        prose = [t for t in ids if t < 2000]
        assert prose
        assert all(t in CORPUS or t == EOS for t in prose)

    def test_each_choice_writes_its_own_arguments(self) -> None:
        tool = {
            "name": "g",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "integer"}},
                "required": ["x"],
            },
        }
        engine = _engine()
        guided = Guided(tools=(tool,), tool_choice="g")
        engine.add("r", PROMPT, SamplingParams(n=3, max_tokens=500, guided=guided))
        choices = _by_choice(_run(engine))
        texts = {_decode([t for e in es for t in e.token_ids]) for es in choices.values()}
        assert len(texts) == 3
        assert all(e[-1].finish_reason == "stop" for e in choices.values())

    def test_resumed_request_goes_on_in_the_script(self) -> None:
        guided = Guided(tools=(TOOL,), tool_choice="required")
        sampling = SamplingParams(max_tokens=500, guided=guided, seed=3)
        whole = _engine()
        whole.add("r", PROMPT, sampling)
        ids = [t for e in _run(whole) for t in e.token_ids]
        resumed = _engine()
        resumed.add("r", PROMPT + tuple(ids[:10]), sampling, resumed_tokens=10)
        assert [t for e in _run(resumed) for t in e.token_ids] == ids[10:]


class TestLogprobs:
    def test_one_logprob_per_token_with_k_alternatives(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(max_tokens=8, logprobs=3, temperature=0.0))
        emissions = _run(engine)
        for e in emissions:
            assert len(e.logprobs) == len(e.token_ids) == 1
            logprob = e.logprobs[0]
            assert logprob.logprob <= 0
            assert len(logprob.top) == 3
            assert logprob.top[0] == (e.token_ids[0], logprob.logprob)  # greedy: sampled first

    def test_no_logprobs_unless_asked(self) -> None:
        engine = _engine()
        engine.add("r", PROMPT, SamplingParams(max_tokens=3))
        assert all(e.logprobs == () for e in _run(engine))

    def test_logprobs_are_deterministic(self) -> None:
        runs = []
        for _ in range(2):
            engine = _engine()
            engine.add("r", PROMPT, SamplingParams(max_tokens=8, logprobs=2, seed=9))
            runs.append([e.logprobs for e in _run(engine)])
        assert runs[0] == runs[1]
