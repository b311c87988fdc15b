"""The transformers worker's pure parts (no torch needed): sampling → continuous-batching
arguments, cumulative outputs → emissions, sizes and devices, and a clean import without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from services.hf_worker.core_wire import CoreOutput
from services.hf_worker.model import cb_sizes, resolve_device, resolve_dtype
from services.hf_worker.outputs import RequestCursor, blocks_in_use, merged
from services.hf_worker.sampling import cb_request
from shared.messages import Guided, SamplingParams
from shared.worker.records import EngineError

VOCAB = 1000


def test_greedy_is_top_k_one() -> None:
    for sampling in (
        SamplingParams(greedy=True, temperature=0.7),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=1, temperature=0.9),
    ):
        args = cb_request(sampling, VOCAB)
        assert (args.temperature, args.top_k, args.top_p) == (1.0, 1, 1.0)


def test_sampling_maps_per_request_values() -> None:
    args = cb_request(
        SamplingParams(max_tokens=7, temperature=0.6, top_p=0.9, top_k=-1, stop_token_ids=(5, 6)),
        VOCAB,
    )
    assert args.max_new_tokens == 7
    assert args.eos_token_ids == (5, 6)
    assert args.processor_kwargs() == {"temperature": 0.6, "top_k": VOCAB, "top_p": 0.9}
    assert cb_request(SamplingParams(top_k=5000), VOCAB).top_k == VOCAB


@pytest.mark.parametrize(
    ("sampling", "what"),
    [
        (SamplingParams(n=3), "n > 1"),
        (SamplingParams(logprobs=0), "logprobs"),
        (SamplingParams(presence_penalty=0.5), "penalties"),
        (SamplingParams(repetition_penalty=1.1), "repetition_penalty"),
        (SamplingParams(min_p=0.1), "min_p"),
        (SamplingParams(logit_bias={1: 2.0}), "logit_bias"),
        (SamplingParams(min_tokens=3), "min_tokens"),
        (
            SamplingParams(
                guided=Guided(tools=({"name": "f"},), tool_choice="f", tool_syntax="mistral")
            ),
            "mistral",
        ),
    ],
)
def test_unsupported_sampling_is_refused(sampling: SamplingParams, what: str) -> None:
    with pytest.raises(EngineError, match=what):
        cb_request(sampling, VOCAB)


def test_auto_tool_choice_and_seed_are_accepted() -> None:
    sampling = SamplingParams(seed=4, guided=Guided(tools=({"name": "f"},), tool_choice="auto"))
    assert cb_request(sampling, VOCAB).top_k == VOCAB


def cursor(max_tokens: int = 4) -> RequestCursor:
    return RequestCursor(
        request_id="r", prompt_tokens=9, max_tokens=max_tokens, stop_ids=frozenset({2})
    )


def out(new: tuple[int, ...], total: int, status: int, error: str | None = None) -> CoreOutput:
    return CoreOutput(request_id="r", new_tokens=new, total=total, status=status, error=error)


def test_outputs_become_emissions() -> None:
    c = cursor()
    first = c.advance(out((7,), 1, 2))
    assert first is not None
    assert (first.token_ids, first.index, first.prompt_tokens, first.done) == ((7,), 0, 9, False)
    assert c.advance(out((), 1, 2)) is None
    second = c.advance(merged(out((8,), 2, 2), out((9,), 3, 2)))
    assert second is not None
    assert (second.token_ids, second.index, second.prompt_tokens) == ((8, 9), 1, 0)
    last = c.advance(out((4,), 4, 3))
    assert last is not None
    assert (last.token_ids, last.index, last.finish_reason, last.done) == ((4,), 3, "length", True)
    assert last.stop_token_id is None
    assert c.advance(out((), 4, 3)) is None


def test_a_stop_id_ends_with_stop_even_in_an_earlier_output() -> None:
    c = cursor()
    last = c.advance(out((7, 2), 2, 3))
    assert last is not None
    assert (last.finish_reason, last.stop_token_id, last.token_ids) == ("stop", 2, (7, 2))
    c = cursor()
    assert c.advance(out((7, 2), 2, 2)) is not None
    last = c.advance(out((), 2, 3))  # the final status came alone, after the stop token
    assert last is not None
    assert (last.finish_reason, last.stop_token_id, last.token_ids, last.index) == (
        "stop",
        2,
        (),
        2,
    )


def test_a_failed_output_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        cursor().advance(out((1,), 1, 4, "boom"))


def test_sizes_and_devices() -> None:
    assert blocks_in_use([1, 16, 17, 0], 16) == 1 + 1 + 2
    assert cb_sizes("cpu", 0, 0) == (256, 512)
    assert cb_sizes("cuda", 0, 0) == (None, None)
    assert cb_sizes("cuda", 100, 64) == (100, 64)
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("auto", cuda_available=True) == "cuda"
    with pytest.raises(RuntimeError):
        resolve_device("cuda", cuda_available=False)
    assert resolve_dtype("auto", "cpu", "bfloat16") == "float32"
    assert resolve_dtype("auto", "cuda", "bfloat16") == "bfloat16"
    assert resolve_dtype("float16", "cpu", None) == "float16"


def test_the_package_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "import services.hf_worker.__main__, services.hf_worker.service\n"
        "from services.hf_worker.config import HfWorkerConfig\n"
        "HfWorkerConfig.from_cli(['--device', 'cpu', '--random-weights'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
