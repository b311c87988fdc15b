"""``nvext.extra_fields: ["worker_id"]``: the worker echoed in the response's ``nvext``."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from services.formatter.request import RequestFormatter
from shared.messages import TokenBatch
from tests.unit.formatter.test_chunks import batches, frames, run, stream_open


def _with_worker(items: list[TokenBatch], worker_id: str = "mocker-7") -> list[TokenBatch]:
    return [msgspec.structs.replace(b, worker_id=worker_id) for b in items]


def test_non_streaming_body_carries_the_worker(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open(extra_fields=("worker_id",)), tokenizer, now=0)
    body = run(fmt, _with_worker(batches(tokenizer, ["Hello", " world"])))[-1]
    assert json.loads(body)["nvext"] == {"worker_id": "mocker-7"}


def test_streaming_finish_chunk_carries_the_worker_and_no_other_does(tokenizer: Any) -> None:
    open_ = stream_open(stream=True, include_usage=True, extra_fields=("worker_id",))
    fmt = RequestFormatter(open_, tokenizer, now=0)
    out = b"".join(run(fmt, _with_worker(batches(tokenizer, ["Hello", " world"]))))
    chunks = [json.loads(f) for f in frames(out)[:-1]]
    with_nvext = [c for c in chunks if "nvext" in c]
    assert len(with_nvext) == 1
    assert with_nvext[0]["choices"][0]["finish_reason"] == "length"
    assert with_nvext[0]["nvext"] == {"worker_id": "mocker-7"}


def test_completions_carry_the_worker_too(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open("completion", extra_fields=("worker_id",)), tokenizer, now=0)
    body = run(fmt, _with_worker(batches(tokenizer, ["Hello"])))[-1]
    assert json.loads(body)["nvext"] == {"worker_id": "mocker-7"}


def test_without_extra_fields_there_is_no_nvext(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open(), tokenizer, now=0)
    body = run(fmt, _with_worker(batches(tokenizer, ["Hello"])))[-1]
    assert "nvext" not in json.loads(body)


def _placed(items: list[TokenBatch], **placement: Any) -> list[TokenBatch]:
    return [msgspec.structs.replace(b, worker_id="d1", **placement) for b in items]


def test_a_disaggregated_request_names_both_workers_as_dynamo_does(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open(extra_fields=("worker_id",)), tokenizer, now=0)
    placed = _placed(
        batches(tokenizer, ["Hello", " world"]),
        dp_rank=1,
        prefill_worker_id="p1",
        prefill_dp_rank=2,
    )
    body = run(fmt, placed)[-1]
    assert json.loads(body)["nvext"] == {
        "worker_id": {
            "prefill_worker_id": "p1",
            "prefill_dp_rank": 2,
            "decode_worker_id": "d1",
            "decode_dp_rank": 1,
        }
    }


def test_the_pair_rides_on_the_streamed_finish_chunk_with_rank_0_shown(tokenizer: Any) -> None:
    open_ = stream_open("completion", stream=True, extra_fields=("worker_id",))
    fmt = RequestFormatter(open_, tokenizer, now=0)
    out = b"".join(run(fmt, _placed(batches(tokenizer, ["Hi"]), prefill_worker_id="p1")))
    [with_nvext] = [c for c in map(json.loads, frames(out)[:-1]) if "nvext" in c]
    assert with_nvext["choices"][0]["finish_reason"] == "length"
    assert with_nvext["nvext"]["worker_id"] == {
        "prefill_worker_id": "p1",
        "prefill_dp_rank": 0,
        "decode_worker_id": "d1",
        "decode_dp_rank": 0,
    }


def test_an_aggregated_request_keeps_the_string_and_adds_a_rank_above_0(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open(extra_fields=("worker_id",)), tokenizer, now=0)
    body = run(fmt, _placed(batches(tokenizer, ["Hello"]), dp_rank=3))[-1]
    assert json.loads(body)["nvext"] == {"worker_id": "d1", "dp_rank": 3}
    fmt = RequestFormatter(stream_open(extra_fields=("worker_id",)), tokenizer, now=0)
    body = run(fmt, _placed(batches(tokenizer, ["Hello"]), dp_rank=0))[-1]
    assert json.loads(body)["nvext"] == {"worker_id": "d1"}


def test_timing_beside_the_pair(tokenizer: Any) -> None:
    open_ = stream_open(extra_fields=("timing", "worker_id"))
    fmt = RequestFormatter(open_, tokenizer, now=0)
    body = run(fmt, _placed(batches(tokenizer, ["Hello"]), prefill_worker_id="p1"))[-1]
    nvext = json.loads(body)["nvext"]
    assert set(nvext) == {"worker_id", "timing"}
    assert nvext["worker_id"]["prefill_worker_id"] == "p1"


def test_the_pair_is_not_shown_unless_asked(tokenizer: Any) -> None:
    fmt = RequestFormatter(stream_open(), tokenizer, now=0)
    body = run(fmt, _placed(batches(tokenizer, ["Hello"]), prefill_worker_id="p1", dp_rank=1))[-1]
    assert "nvext" not in json.loads(body)
