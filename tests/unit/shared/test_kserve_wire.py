"""The hand-encoded KServe stream responses parse, with the real protobuf classes, to what the
gateway would build with them (``kserve.fill_text``)."""

from __future__ import annotations

import struct

import pytest

from services.gateway.apis.kserve import fill_text
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve_wire import TextResponses, usage_parameters


def parsed(framed: bytes) -> list[pb.ModelStreamInferResponse]:
    """The messages of a gRPC-framed byte string (prefix: flag 0, big-endian length)."""
    out, pos = [], 0
    while pos < len(framed):
        flag, length = struct.unpack_from(">BI", framed, pos)
        assert flag == 0
        out.append(pb.ModelStreamInferResponse.FromString(framed[pos + 5 : pos + 5 + length]))
        pos += 5 + length
    assert pos == len(framed)
    return out


def expected(**fields: object) -> pb.ModelStreamInferResponse:
    out = pb.ModelStreamInferResponse()
    fill_text(out.infer_response, **fields)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("text", [b"", b"Hello", "héllo ✓".encode(), b"x" * 300])
def test_a_delta_is_the_text_output_of_a_non_final_response(text: bytes) -> None:
    responses = TextResponses("Qwen/Qwen3-0.6B", "17")
    [message] = parsed(responses.delta(text))
    assert message == expected(model="Qwen/Qwen3-0.6B", request_id="17", text=text, final=False)


def test_the_last_response_has_finish_reason_final_and_the_token_counts() -> None:
    responses = TextResponses("m", "r-1")
    [message] = parsed(responses.last("length", usage_parameters(12, 64, cached_tokens=8)))
    want = expected(model="m", request_id="r-1", text=None, finish_reason="length", final=True)
    for key, value in {"prompt_tokens": 12, "completion_tokens": 64, "cached_tokens": 8}.items():
        want.infer_response.parameters[key].int64_param = value
    assert message == want


def test_the_last_response_may_carry_text_too() -> None:
    [message] = parsed(TextResponses("m", "").last("stop", {}, text=b"end"))
    assert message == expected(
        model="m", request_id="", text=b"end", finish_reason="stop", final=True
    )
    assert not message.infer_response.id


def test_only_the_requested_outputs_are_sent() -> None:
    only_finish = TextResponses("m", "1", outputs={"finish_reason"})
    assert only_finish.delta(b"text") == b""
    [message] = parsed(only_finish.last("stop", {}, text=b"text"))
    assert [o.name for o in message.infer_response.outputs] == ["finish_reason"]
    only_text = TextResponses("m", "1", outputs={"text_output"})
    [message] = parsed(only_text.last("stop", {}, text=b"t"))
    assert [o.name for o in message.infer_response.outputs] == ["text_output"]


def test_messages_concatenate_into_one_write() -> None:
    responses = TextResponses("m", "9")
    framed = responses.delta(b"a") + responses.delta(b"b") + responses.last("length", {})
    assert [
        m.infer_response.parameters["triton_final_response"].bool_param for m in parsed(framed)
    ] == [
        False,
        False,
        True,
    ]


def test_usage_parameters_leave_out_zero_cached_tokens() -> None:
    assert usage_parameters(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4}


@pytest.mark.parametrize("size", [*range(0, 140), 200, 20_000])
def test_deltas_of_every_size_around_the_one_byte_varint_limits(size: int) -> None:
    """Short deltas take a fast path (one-byte lengths); both paths encode the same message."""
    model = "m" * 20
    [message] = parsed(TextResponses(model, "17").delta(b"x" * size))
    assert message == expected(model=model, request_id="17", text=b"x" * size, final=False)
