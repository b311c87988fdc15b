"""Messages round-trip through the codec; tagged unions decode to the right class."""

from pathlib import Path

import msgspec
import pytest

from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    OutputOptions,
    Preprocess,
    RequestFailed,
    ResponseChunk,
    SamplingParams,
    StreamOpen,
    StreamOpened,
    TokenBatch,
    WorkerCard,
)

GOLDEN = Path(__file__).parents[2] / "data" / "golden_messages.msgpack"

SAMPLES: list[msgspec.Struct] = [
    Preprocess(
        request_id="r1",
        api="chat",
        model="m",
        reply_to="ns.v1.gateway.g.r1",
        created=1,
        messages=({"role": "user", "content": "hi"},),
        sampling=SamplingParams(max_tokens=8, temperature=0.0),
        output=OutputOptions(stream=True, include_usage=True, stop=("\n",)),
    ),
    StreamOpen(
        request_id="r1",
        api="completion",
        model="m",
        reply_to="x",
        created=1,
        prompt_tokens=3,
        output=OutputOptions(),
        max_tokens=4,
    ),
    StreamOpened(request_id="r1", stream_to="ns.v1.stream.f.r1"),
    Generate(
        request_id="r1",
        model="m",
        token_ids=(1, 2, 3),
        sampling=SamplingParams(stop_token_ids=(7,)),
        stream_to="s",
    ),
    TokenBatch(request_id="r1", token_ids=(5, 6), index=0, prompt_tokens=3),
    TokenBatch(request_id="r1", token_ids=(7,), index=2, finish_reason="stop", stop_token_id=7),
    RequestFailed(request_id="r1", code="no_worker_available", message="x", status=503),
    ResponseChunk(request_id="r1", data=b"data: [DONE]\n\n", done=True),
    Cancel(request_id="r1"),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: msgspec.Struct) -> None:
    assert codec.decode(codec.encode(message), type(message)) == message


def test_worker_events_decode_by_tag() -> None:
    batch = TokenBatch(request_id="r", token_ids=(1,))
    failed = RequestFailed(request_id="r", code="c", message="m")
    assert codec.WORKER_EVENTS.decode(codec.encode(batch)) == batch
    assert codec.WORKER_EVENTS.decode(codec.encode(failed)) == failed


def test_gateway_events_reject_other_messages() -> None:
    with pytest.raises(msgspec.ValidationError):
        codec.GATEWAY_EVENTS.decode(codec.encode(Cancel(request_id="r")))


def test_records_round_trip_without_tag() -> None:
    card = WorkerCard(worker_id="w1", model="m", kv_blocks=10, heartbeat_at=2.5)
    assert codec.decode(codec.encode(card), WorkerCard) == card


def test_golden_encodings_still_decode() -> None:
    """Old encodings stay readable: only fields with defaults may be added."""
    frames = msgspec.msgpack.decode(GOLDEN.read_bytes(), type=list[bytes])
    decoded = [codec.decode(f, type(s)) for f, s in zip(frames, SAMPLES, strict=True)]
    assert decoded == SAMPLES
