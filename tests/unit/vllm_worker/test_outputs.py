"""vLLM output deltas → emissions (``vllm/outputs.py`` ``CompletionOutput`` at commit
003d3ee22261b7937258b7531aee00e10393f1d6; the completions chunk's ``logprobs`` as
``serving_completion.py`` writes them with ``return_tokens_as_token_ids``)."""

from __future__ import annotations

import math

from services.vllm_worker.outputs import (
    ChoiceDelta,
    DeltaTracker,
    finish_reason,
    logprobs_from_engine,
    logprobs_from_http,
)
from services.vllm_worker.stats import SchedulerSnapshot, parse_cache_config, parse_prometheus
from shared.messages import TokenLogprob
from tests.fakes.vllm_fakes import FakeLogprob


def test_indexes_count_per_choice_and_the_first_carries_the_prompt() -> None:
    tracker = DeltaTracker("r", prompt_tokens=10)
    first = tracker.emissions([ChoiceDelta(choice=0, token_ids=(5, 6))], cached_tokens=4)
    second = tracker.emissions([ChoiceDelta(choice=0, token_ids=(7,))], cached_tokens=4)
    assert [(e.index, e.prompt_tokens, e.cached_tokens) for e in first + second] == [
        (0, 10, 4),
        (2, 0, 0),
    ]
    assert not tracker.done


def test_stop_token_from_stop_reason_or_the_last_id() -> None:
    tracker = DeltaTracker("r")
    (by_id,) = tracker.emissions(
        [ChoiceDelta(choice=0, token_ids=(5, 9), finish_reason="stop", stop_reason=9)]
    )
    assert (by_id.finish_reason, by_id.stop_token_id, by_id.done) == ("stop", 9, True)
    eos = DeltaTracker("r").emissions([ChoiceDelta(choice=0, token_ids=(2,), finish_reason="stop")])
    assert eos[0].stop_token_id == 2
    text = DeltaTracker("r").emissions(
        [ChoiceDelta(choice=0, token_ids=(4,), finish_reason="stop", stop_reason="END")]
    )
    assert text[0].stop_token_id is None


def test_finish_reasons_map_to_jetserve() -> None:
    assert [finish_reason(r) for r in ("stop", "length", "abort", "error", None, "new")] == [
        "stop",
        "length",
        "cancelled",
        "error",
        None,
        "error",
    ]


def test_n_choices_end_once_all_have_finished() -> None:
    tracker = DeltaTracker("r", n=2)
    out = tracker.emissions(
        [
            ChoiceDelta(choice=0, token_ids=(1,), finish_reason="length"),
            ChoiceDelta(choice=1, token_ids=(2,)),
        ]
    )
    assert [(e.choice, e.finish_reason, e.done) for e in out] == [
        (0, "length", False),
        (1, None, False),
    ]
    (last,) = tracker.emissions([ChoiceDelta(choice=1, token_ids=(3,), finish_reason="length")])
    assert (last.choice, last.index, last.done) == (1, 1, True)
    assert tracker.emissions([ChoiceDelta(choice=1, token_ids=(4,))]) == []  # after done


def test_an_engine_finish_without_new_tokens_ends_the_request() -> None:
    tracker = DeltaTracker("r", prompt_tokens=3)
    tracker.emissions([ChoiceDelta(choice=0, token_ids=(1,))])
    (end,) = tracker.emissions([ChoiceDelta(choice=0, token_ids=(), finish_reason="abort")])
    assert (end.finish_reason, end.done, end.index) == ("cancelled", True, 1)
    empty = DeltaTracker("q", prompt_tokens=3).emissions([], finished=True)
    assert (empty[0].finish_reason, empty[0].done, empty[0].prompt_tokens) == ("error", True, 3)


def test_empty_deltas_are_skipped_and_resumed_requests_go_on_counting() -> None:
    tracker = DeltaTracker("r", resumed_tokens=5)
    assert tracker.emissions([ChoiceDelta(choice=0, token_ids=())]) == []
    (e,) = tracker.emissions([ChoiceDelta(choice=0, token_ids=(8,))])
    assert e.index == 5


def test_engine_logprobs_keep_the_top_alternatives_by_rank() -> None:
    steps = [
        {
            7: FakeLogprob(-2.0, rank=3),
            1: FakeLogprob(-0.5, rank=1),
            2: FakeLogprob(-1.0, rank=2),
        }
    ]
    (lp,) = logprobs_from_engine([7], steps, 2)
    assert lp == TokenLogprob(logprob=-2.0, top=((1, -0.5), (2, -1.0)))
    assert logprobs_from_engine([7], None, 2) == ()
    (missing,) = logprobs_from_engine([7], [None], 2)
    assert math.isnan(missing.logprob)


def test_http_logprobs_read_token_id_names() -> None:
    body = {
        "tokens": ["token_id:7"],
        "token_logprobs": [-2.0],
        "top_logprobs": [{"token_id:7": -2.0, "token_id:1": -0.5, "weird": -0.1}],
    }
    (lp,) = logprobs_from_http(body, 1)
    assert lp == TokenLogprob(logprob=-2.0, top=((1, -0.5),))
    assert logprobs_from_http(None, 1) == ()


def test_prometheus_gauges_are_summed() -> None:
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="a b"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="a b"} 1.0\n'
        'vllm:num_requests_waiting{engine="0"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\n'
        "garbage line\n"
    )
    assert parse_prometheus(text) == (4, 2, 0.5)
    assert parse_prometheus("vllm:gpu_cache_usage_perc 0.1\n") is None
    snapshot = SchedulerSnapshot()
    snapshot.update(running=1, waiting=-1, kv_usage=1.5)
    assert (snapshot.waiting, snapshot.kv_usage, snapshot.used_blocks(10)) == (0, 1.0, 10)


def test_cache_geometry_from_the_info_gauge() -> None:
    text = (
        'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",'
        'num_cpu_blocks="None",num_gpu_blocks="1234"} 1.0\n'
    )
    assert parse_cache_config(text) == (32, 1234)
    assert parse_cache_config('vllm:cache_config_info{block_size="x"} 1.0\n') is None
    assert parse_cache_config("vllm:num_requests_running 1\n") is None
