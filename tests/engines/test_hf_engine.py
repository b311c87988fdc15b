"""``HfEngine`` alone, on the tiny random Qwen3 (CPU): real forward passes through transformers'
continuous batching, driven the way the worker runtime drives it (``add`` then ``run`` with a
sink). Each test runs twice: with the engine in a process of its own (the default) and in threads
of this one (``own_process=False``). Then what happens when the engine process dies, or its
worker does."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

pytest.importorskip("torch")
pytest.importorskip("transformers")

from services.hf_worker.engine import HfEngine, HfEngineOptions, ProcessCore
from shared.errors import ServiceError
from shared.messages import SamplingParams
from shared.worker.records import Emission, EngineError, EngineInput
from tests.support import eventually_async

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPT = (9707, 11, 1879, 0, 358, 1079, 264, 1273, 9934, 13)
GREEDY = SamplingParams(max_tokens=12, greedy=True)


@dataclass
class Sink:
    """An ``EmissionSink`` that records what it gets (with when)."""

    emissions: list[tuple[float, Emission]] = field(default_factory=list)
    failures: dict[str, ServiceError] = field(default_factory=dict)
    on_add: list[object] = field(default_factory=list)

    def add(self, emission: Emission) -> bool:
        self.emissions.append((time.monotonic(), emission))
        return True

    async def flush(self, request_ids: object = None) -> None:
        return None

    async def phases(self, emissions: object) -> None:
        return None

    async def fail(self, request_id: str, error: ServiceError) -> None:
        self.failures[request_id] = error

    def collect(self) -> None:
        return None

    async def progress(self) -> None:
        return None

    async def kv_pulled(self, request_id: str, pulled_blocks: int) -> None:
        return None

    def of(self, request_id: str) -> list[Emission]:
        return [e for _, e in self.emissions if e.request_id == request_id]

    def tokens(self, request_id: str) -> list[int]:
        return [t for e in self.of(request_id) for t in e.token_ids]


def request(
    rid: str, sampling: SamplingParams = GREEDY, prompt: tuple[int, ...] = PROMPT
) -> EngineInput:
    return EngineInput(request_id=rid, token_ids=prompt, sampling=sampling, hash_seed=0)


def options(model_dir: Path, *, own_process: bool = True) -> HfEngineOptions:
    return HfEngineOptions(
        model_dir=model_dir,
        random_weights=True,
        device="cpu",
        block_size=16,
        num_blocks=128,
        max_batch_tokens=256,
        max_num_seqs=8,
        seed=3,
        own_process=own_process,
    )


@pytest_asyncio.fixture(
    loop_scope="module", scope="module", params=[True, False], ids=["own-process", "threads"]
)
async def engine(tiny_model_dir: Path, request: pytest.FixtureRequest) -> AsyncIterator[HfEngine]:
    eng = HfEngine(options(tiny_model_dir, own_process=request.param))
    facts = await eng.start()
    assert facts.kind == "hf"
    assert facts.kv_events is False
    try:
        yield eng
    finally:
        await eng.stop()


async def run(engine: HfEngine, *requests: EngineInput) -> Sink:
    sink = Sink()
    for r in requests:
        engine.add(r)
    await asyncio.wait_for(engine.run(sink), timeout=60)
    return sink


def check_stream(emissions: list[Emission], prompt_tokens: int) -> list[int]:
    """Indices contiguous from 0, the first carries the prompt size, only the last is done."""
    assert emissions, "nothing was emitted"
    expected = 0
    for e in emissions:
        assert e.index == expected
        expected += len(e.token_ids)
    assert emissions[0].prompt_tokens == prompt_tokens
    assert [e.done for e in emissions] == [False] * (len(emissions) - 1) + [True]
    return [t for e in emissions for t in e.token_ids]


async def test_streams_tokens_and_ends_with_length(engine: HfEngine) -> None:
    sampling = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95)
    sink = await run(engine, request("s1", sampling))
    emissions = sink.of("s1")
    tokens = check_stream(emissions, len(PROMPT))
    assert len(tokens) == 16
    assert len(emissions) >= 2, "the tokens came in one emission: not streamed"
    assert emissions[-1].finish_reason == "length"
    assert emissions[-1].stop_token_id is None
    assert all(0 <= t < 151936 for t in tokens)
    assert not sink.failures
    assert engine.load().active == 0


async def test_greedy_is_deterministic_and_matches_plain_generate(
    engine: HfEngine, tiny_model_dir: Path
) -> None:
    first = (await run(engine, request("g1"))).tokens("g1")
    second = (await run(engine, request("g2"))).tokens("g2")
    assert len(first) == GREEDY.max_tokens
    assert first == second
    # The same seeded weights through transformers' plain generate() (no paged cache).
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(3)
    config = AutoConfig.from_pretrained(str(tiny_model_dir))
    model_class: Any = AutoModelForCausalLM  # untyped boundary
    reference = model_class.from_config(config, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = reference.generate(
            torch.tensor([PROMPT]),
            max_new_tokens=GREEDY.max_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    assert first == out[0, len(PROMPT) :].tolist()


async def test_a_stop_token_ends_with_stop(engine: HfEngine) -> None:
    plain = (await run(engine, request("p1"))).tokens("p1")
    stop_at = plain[2]
    cut = plain.index(stop_at) + 1
    sampling = SamplingParams(max_tokens=12, greedy=True, stop_token_ids=(stop_at,))
    sink = await run(engine, request("p2", sampling))
    emissions = sink.of("p2")
    tokens = check_stream(emissions, len(PROMPT))
    assert tokens == plain[:cut]
    assert emissions[-1].finish_reason == "stop"
    assert emissions[-1].stop_token_id == stop_at == tokens[-1]


async def test_cancel_mid_stream(engine: HfEngine) -> None:
    sampling = SamplingParams(max_tokens=1500, temperature=1.0)
    sink = Sink()
    engine.add(request("c1", sampling))
    runner = asyncio.create_task(engine.run(sink))
    await eventually_async(
        lambda: len(sink.tokens("c1")) >= 3,
        timeout_s=30,
        interval_s=0.005,
        message="fewer than three tokens came",
    )
    last = engine.cancel("c1")
    assert last is not None
    assert last.finish_reason == "cancelled"
    assert last.done
    await asyncio.wait_for(runner, timeout=10)
    count = len(sink.tokens("c1"))
    assert 3 <= count < 1500
    assert last.index == count
    await asyncio.sleep(0.3)
    assert len(sink.tokens("c1")) == count, "tokens came after the cancel"
    assert "c1" not in engine
    # The manager stopped generating it (a step or two in flight may still have come).
    dropped = engine.dropped_outputs
    await asyncio.sleep(0.5)
    assert engine.dropped_outputs == dropped, "the manager still runs the cancelled request"
    # The manager dropped it: a new request runs at once and alone.
    after = await run(engine, request("c2"))
    assert len(after.tokens("c2")) == GREEDY.max_tokens
    assert engine.kv_usage()[0] == 0


async def test_two_requests_are_batched(engine: HfEngine) -> None:
    solo_a = (await run(engine, request("b0", prompt=PROMPT))).tokens("b0")
    other = (PROMPT[0], 42, 77, 3000, 12)
    solo_b = (await run(engine, request("b00", prompt=other))).tokens("b00")
    sampling = SamplingParams(max_tokens=40, greedy=True)
    sink = await run(engine, request("ba", sampling), request("bb", sampling, prompt=other))
    a, b = sink.of("ba"), sink.of("bb")
    check_stream(a, len(PROMPT))
    check_stream(b, len(other))
    assert len(sink.tokens("ba")) == len(sink.tokens("bb")) == 40
    # Greedy output does not depend on the batch it ran in.
    assert sink.tokens("ba")[:12] == solo_a
    assert sink.tokens("bb")[:12] == solo_b
    # Interleaved: each one's first token came before the other's last one.
    times = {rid: [t for t, e in sink.emissions if e.request_id == rid] for rid in ("ba", "bb")}
    assert times["ba"][0] < times["bb"][-1]
    assert times["bb"][0] < times["ba"][-1]


async def test_refuses_what_it_cannot_run(engine: HfEngine) -> None:
    with pytest.raises(EngineError, match="context length"):
        engine.add(request("r1", SamplingParams(max_tokens=5000)))
    with pytest.raises(EngineError, match="unsupported"):
        engine.add(request("r2", SamplingParams(n=2)))
    with pytest.raises(EngineError, match="unsupported"):
        engine.add(request("r3", SamplingParams(logprobs=1)))
    with pytest.raises(EngineError, match="at least one token"):
        engine.add(request("r4", prompt=()))
    assert not engine.has_work


async def test_the_engine_runs_in_a_process_of_its_own(tiny_model_dir: Path) -> None:
    eng = HfEngine(options(tiny_model_dir))
    await eng.start()
    try:
        assert isinstance(eng.core, ProcessCore)
        process = eng.core.process
        assert process is not None
        assert process.pid != os.getpid()
        assert process.poll() is None
        assert len((await run(eng, request("own1"))).tokens("own1")) == GREEDY.max_tokens
    finally:
        await eng.stop()
    assert process.poll() == 0, "a stopped engine process exits cleanly"


async def test_an_engine_process_that_dies_fails_its_requests_and_says_so(
    tiny_model_dir: Path,
) -> None:
    gone: list[str] = []
    eng = HfEngine(options(tiny_model_dir), on_core_exit=gone.append)
    await eng.start()
    try:
        assert isinstance(eng.core, ProcessCore)
        process = eng.core.process
        assert process is not None
        sink = Sink()
        eng.add(request("d1", SamplingParams(max_tokens=1500, temperature=1.0)))
        runner = asyncio.create_task(eng.run(sink))
        await eventually_async(
            lambda: len(sink.tokens("d1")) >= 2,
            timeout_s=30,
            interval_s=0.005,
            message="no tokens came before the kill",
        )
        process.kill()
        await asyncio.wait_for(runner, timeout=30)
        assert "d1" in sink.failures, "the request of a dead engine was not failed"
        assert len(gone) == 1
        assert "exited" in gone[0], gone
        assert eng.core_exited == gone[0]
        failed = Sink()
        eng.add(request("d2"))
        await asyncio.wait_for(eng.run(failed), timeout=30)
        assert "d2" in failed.failures, "a dead engine took a new request"
    finally:
        await eng.stop()


async def test_the_engine_process_ends_with_its_worker(tiny_model_dir: Path) -> None:
    """A worker killed outright (SIGKILL: no stop message) leaves no engine process behind."""
    code = (
        "import asyncio\n"
        "from pathlib import Path\n"
        "from tests.engines.test_hf_engine import options\n"
        "from services.hf_worker.engine import HfEngine\n"
        "async def main():\n"
        f"    eng = HfEngine(options(Path({str(tiny_model_dir)!r})))\n"
        "    await eng.start()\n"
        "    print('ENGINE_PID', eng.core.process.pid, flush=True)\n"
        "    await asyncio.sleep(600)\n"
        "asyncio.run(main())\n"
    )
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, cwd=Path.cwd()
    )
    try:
        assert worker.stdout is not None
        engine_pid = 0
        async with asyncio.timeout(120):
            while not engine_pid:
                line = (await worker.stdout.readline()).decode()
                assert line, "the worker exited before its engine started"
                if line.startswith("ENGINE_PID "):
                    engine_pid = int(line.split()[1])
        assert _alive(engine_pid)
        worker.kill()
        await asyncio.wait_for(worker.wait(), timeout=30)
        await eventually_async(
            lambda: not _alive(engine_pid),
            timeout_s=30,
            message=f"engine process {engine_pid} outlived its killed worker",
        )
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has exited, its parent has not reaped it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
