"""KServe v2 stream responses for LLM text, encoded by hand: gRPC-framed
``ModelStreamInferResponse`` messages, ready for the wire (pure; no protobuf runtime).

The formatter builds them (output format ``kserve``) as it builds SSE frames for HTTP, so the
gateway only writes bytes. Field numbers are those of ``proto/shared/kserve/grpc_service.proto``
(``ModelStreamInferResponse.infer_response`` = 2; ``ModelInferResponse``: model_name 1,
model_version 2, id 3, parameters 4, outputs 5, raw_output_contents 6; ``InferOutputTensor``:
name 1, datatype 2, shape 3; ``InferParameter``: bool_param 1, int64_param 2), in the order
protobuf writes them; ``tests/unit/test_kserve_wire.py`` parses them with the real classes.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping

TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
FINAL_PARAMETER = "triton_final_response"
"""On every stream response: false, then true on a request's last (as Triton's decoupled
models answer; clients loop until it is true)."""
_LENGTH = struct.Struct("<I")
_MESSAGE = struct.Struct(">BI")
"""gRPC's length prefix: compressed flag, length."""
_SHORT_PREFIX = struct.Struct(">BIBB")
"""gRPC's prefix, then field 2's tag and a one-byte length (a message under 128 bytes)."""
_SHORT_ELEMENT = struct.Struct("<BBI")
"""Field 6's tag, a one-byte length, then the BYTES element's 4-byte length."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _parameter(key: str, value: bool | int) -> bytes:
    """One ``parameters`` map entry (field 4): a bool, or a non-negative int64."""
    choice = b"\x08" if isinstance(value, bool) else b"\x10"  # bool_param 1 / int64_param 2
    entry = _field(1, key.encode()) + _field(2, choice + _varint(int(value)))
    return _field(4, entry)


def _output(name: str) -> bytes:
    """One ``outputs`` entry (field 5): ``name``, BYTES, shape [1]."""
    return _field(5, _field(1, name.encode()) + _field(2, b"BYTES") + _field(3, _varint(1)))


_TEXT_TENSOR = _output(TEXT_OUTPUT)
_FINISH_TENSOR = _output(FINISH_REASON)


def _element(data: bytes) -> bytes:
    """One ``raw_output_contents`` entry (field 6): a BYTES element (4-byte LE length, data)."""
    return _field(6, _LENGTH.pack(len(data)) + data)


class TextResponses:
    """The framed stream responses of one LLM request: ``text_output`` deltas, then the last
    one with ``finish_reason``, ``triton_final_response`` and the token counts."""

    __slots__ = ("_delta_head", "_final_head", "_head", "_is_finish_wanted", "_is_text_wanted")
    # ``_delta_head`` holds everything of a delta before its text element (built once).

    def __init__(self, model: str, request_id: str, outputs: Collection[str] = ()) -> None:
        """``outputs``: the outputs the client asked for (empty = all)."""
        self._head = _field(1, model.encode()) + _field(2, b"1")
        if request_id:
            self._head += _field(3, request_id.encode())
        self._is_text_wanted = not outputs or TEXT_OUTPUT in outputs
        self._is_finish_wanted = not outputs or FINISH_REASON in outputs
        self._delta_head = self._head + _parameter(FINAL_PARAMETER, False) + _TEXT_TENSOR
        self._final_head = self._head + _parameter(FINAL_PARAMETER, True)

    def delta(self, text: bytes) -> bytes:
        """A response with ``text`` (nothing when the client did not ask for the text)."""
        if not self._is_text_wanted:
            return b""
        n = len(text)
        inner = len(self._delta_head) + 6 + n
        if inner < 128:  # one-byte lengths: the common delta, in one go
            prefix = _SHORT_PREFIX.pack(0, inner + 2, 0x12, inner)
            return prefix + self._delta_head + _SHORT_ELEMENT.pack(0x32, n + 4, n) + text
        return _frame(self._delta_head + _element(text))

    def last(
        self, finish_reason: str, parameters: Mapping[str, int], text: bytes | None = None
    ) -> bytes:
        """The request's last response: ``text`` when given, ``finish_reason``, and
        ``parameters`` (token counts) besides ``triton_final_response: true``."""
        inner = self._final_head
        inner += b"".join(_parameter(key, value) for key, value in parameters.items())
        elements = b""
        if text is not None and self._is_text_wanted:
            inner += _TEXT_TENSOR
            elements += _element(text)
        if self._is_finish_wanted:
            inner += _FINISH_TENSOR
            elements += _element(finish_reason.encode())
        return _frame(inner + elements)


def _frame(infer_response: bytes) -> bytes:
    """``ModelStreamInferResponse{infer_response}`` with gRPC's 5-byte message prefix."""
    message = _field(2, infer_response)
    return _MESSAGE.pack(0, len(message)) + message


def usage_parameters(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, int]:
    """The token counts a last response carries as ``parameters``."""
    counts = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if cached_tokens:
        counts["cached_tokens"] = cached_tokens
    return counts
