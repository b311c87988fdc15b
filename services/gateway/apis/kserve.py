"""Pure KServe v2 tensor codec: request tensors → values or raw bytes, and responses back.

Raw contents are row-major little-endian; a ``BYTES`` element is a 4-byte little-endian length,
then the bytes (Triton's ``raw_input_contents`` / ``raw_output_contents``). Typed ``contents``
are accepted too and turned into the same raw form. Every way a tensor can be wrong ends as
``InvalidRequest`` naming the input (``param``); the gRPC error table makes it INVALID_ARGUMENT.
A worker's output tensor is held to the same sizes (``check_output``): one that is wrong is the
worker's fault, ``InternalError`` naming the output (INTERNAL), never a response a client's
decoder then fails on.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import InternalError, InvalidRequest
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import model_config_pb2 as mc
from shared.messages import Tensor


@dataclass(frozen=True, slots=True)
class Datatype:
    """How one KServe datatype is stored: struct code, bytes per element, typed field."""

    fmt: str
    """``struct`` format character; empty for ``BYTES`` and ``BF16`` (no Python type)."""
    size: int
    """Bytes per element; 0 for ``BYTES`` (variable)."""
    field: str
    """The ``InferTensorContents`` field for typed contents; empty when there is none."""
    config_type: int
    """The Triton ``model_config`` ``DataType``."""


DATATYPES: dict[str, Datatype] = {
    "BOOL": Datatype("?", 1, "bool_contents", mc.TYPE_BOOL),
    "UINT8": Datatype("B", 1, "uint_contents", mc.TYPE_UINT8),
    "UINT16": Datatype("H", 2, "uint_contents", mc.TYPE_UINT16),
    "UINT32": Datatype("I", 4, "uint_contents", mc.TYPE_UINT32),
    "UINT64": Datatype("Q", 8, "uint64_contents", mc.TYPE_UINT64),
    "INT8": Datatype("b", 1, "int_contents", mc.TYPE_INT8),
    "INT16": Datatype("h", 2, "int_contents", mc.TYPE_INT16),
    "INT32": Datatype("i", 4, "int_contents", mc.TYPE_INT32),
    "INT64": Datatype("q", 8, "int64_contents", mc.TYPE_INT64),
    "FP16": Datatype("e", 2, "", mc.TYPE_FP16),
    "FP32": Datatype("f", 4, "fp32_contents", mc.TYPE_FP32),
    "FP64": Datatype("d", 8, "fp64_contents", mc.TYPE_FP64),
    "BF16": Datatype("", 2, "", mc.TYPE_BF16),
    "BYTES": Datatype("", 0, "bytes_contents", mc.TYPE_STRING),
}
_BY_CONFIG_TYPE = {d.config_type: name for name, d in DATATYPES.items()}
_LENGTH = struct.Struct("<I")


def datatype_of_config(config_type: int) -> str:
    """The KServe datatype of a Triton ``model_config`` ``DataType`` (``TYPE_STRING`` = BYTES)."""
    name = _BY_CONFIG_TYPE.get(config_type)
    if name is None:
        raise ValueError(f"no KServe datatype for model_config DataType {config_type}")
    return name


# --- request tensors -----------------------------------------------------------------------------


def element_count(shape: Sequence[int], name: str) -> int:
    """How many elements a request tensor of ``shape`` holds (every dimension must be >= 0)."""
    count = 1
    for dim in shape:
        if dim < 0:
            raise InvalidRequest(
                f"Input `{name}` has a negative dimension in shape {list(shape)}.", param=name
            )
        count *= dim
    return count


def split_bytes(raw: bytes, count: int, name: str) -> list[bytes]:
    """The ``count`` elements of a raw ``BYTES`` tensor; the lengths must cover ``raw`` exactly."""
    items: list[bytes] = []
    offset, end = 0, len(raw)
    view = memoryview(raw)
    while offset < end:
        if offset + 4 > end:
            raise InvalidRequest(f"Input `{name}`: truncated BYTES element length.", param=name)
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise InvalidRequest(f"Input `{name}`: BYTES element overruns its data.", param=name)
        items.append(bytes(view[offset : offset + length]))
        offset += length
    if len(items) != count:
        raise InvalidRequest(
            f"Input `{name}` holds {len(items)} BYTES elements; its shape says {count}.",
            param=name,
        )
    return items


def join_bytes(items: Iterable[bytes]) -> bytes:
    """The raw form of ``BYTES`` elements: each one's 4-byte little-endian length, then it."""
    return b"".join(_LENGTH.pack(len(item)) + item for item in items)


def raw_contents(request: pb.ModelInferRequest) -> list[bytes | None]:
    """Per input, its ``raw_input_contents`` entry, or ``None`` when it uses typed contents.

    As Triton: raw contents, when used, come one per input and no input then has typed ones.
    """
    raws = request.raw_input_contents
    inputs = request.inputs
    if not raws:
        return [None] * len(inputs)
    if len(raws) != len(inputs):
        raise InvalidRequest(
            f"`raw_input_contents` has {len(raws)} entries for {len(inputs)} inputs.",
            param="raw_input_contents",
        )
    for tensor in inputs:
        if tensor.HasField("contents"):
            raise InvalidRequest(
                f"Input `{tensor.name}` has typed contents while `raw_input_contents` is used.",
                param=tensor.name,
            )
    return list(raws)


def input_values(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> list[Any]:
    """The elements of one input as Python values (``bytes`` for ``BYTES``), size-checked."""
    name = tensor.name
    kind = _datatype(tensor.datatype, name)
    count = element_count(tensor.shape, name)
    if raw is None:
        values = _typed(tensor, kind, name)
        if len(values) != count:
            raise _count_error(name, len(values), count)
        return values
    if not kind.size:
        return split_bytes(raw, count, name)
    _check_size(raw, kind, count, name)
    if not kind.fmt:
        raise InvalidRequest(f"Input `{name}`: {tensor.datatype} cannot be read here.", param=name)
    return list(struct.unpack(f"<{count}{kind.fmt}", raw))


def input_raw(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> bytes:
    """The raw form of one input (typed contents converted), size-checked against its shape."""
    name = tensor.name
    kind = _datatype(tensor.datatype, name)
    count = element_count(tensor.shape, name)
    if raw is not None:
        if kind.size:
            _check_size(raw, kind, count, name)
        else:
            split_bytes(raw, count, name)
        return raw
    values = _typed(tensor, kind, name)
    if len(values) != count:
        raise _count_error(name, len(values), count)
    if not kind.size:
        return join_bytes(values)
    try:
        return struct.pack(f"<{count}{kind.fmt}", *values)
    except struct.error as exc:
        raise InvalidRequest(f"Input `{name}`: {exc}.", param=name) from None


def request_tensors(request: pb.ModelInferRequest) -> tuple[Tensor, ...]:
    """Every input as a bus ``Tensor`` with raw data (typed contents converted)."""
    raws = raw_contents(request)
    return tuple(
        Tensor(
            name=tensor.name,
            datatype=tensor.datatype,
            shape=tuple(tensor.shape),
            data=input_raw(tensor, raw),
            parameters=parameters_of(tensor.parameters),
        )
        for tensor, raw in zip(request.inputs, raws, strict=True)
    )


def _datatype(datatype: str, name: str) -> Datatype:
    kind = DATATYPES.get(datatype)
    if kind is None:
        raise InvalidRequest(f"Input `{name}` has unknown datatype `{datatype}`.", param=name)
    return kind


def _typed(tensor: pb.ModelInferRequest.InferInputTensor, kind: Datatype, name: str) -> list[Any]:
    if not kind.field:
        raise InvalidRequest(
            f"Input `{name}`: {tensor.datatype} needs `raw_input_contents` (it has no typed "
            "contents field).",
            param=name,
        )
    return list(getattr(tensor.contents, kind.field))


def _check_size(raw: bytes, kind: Datatype, count: int, name: str) -> None:
    if len(raw) != count * kind.size:
        raise InvalidRequest(
            f"Input `{name}` has {len(raw)} bytes of raw contents; its shape and datatype need "
            f"{count * kind.size}.",
            param=name,
        )


def _count_error(name: str, got: int, want: int) -> InvalidRequest:
    return InvalidRequest(
        f"Input `{name}` has {got} elements of contents; its shape says {want}.", param=name
    )


# --- parameters ----------------------------------------------------------------------------------


def parameters_of(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """``InferParameter`` map → plain values (bool, int, str or float)."""
    if not params:
        return {}
    out: dict[str, Any] = {}
    for key, param in params.items():
        fields = param.ListFields()  # the oneof's one set field, if any
        if fields:
            out[key] = fields[0][1]
    return out


def set_parameter(target: pb.InferParameter, value: Any) -> None:
    """Store one plain value in an ``InferParameter`` (other types as their ``str``)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value > 2**63 - 1:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = value if isinstance(value, str) else str(value)


# --- responses -----------------------------------------------------------------------------------


def fill_text(
    response: pb.ModelInferResponse,
    *,
    model: str,
    request_id: str,
    text: bytes | None,
    finish_reason: str | None = None,
    final: bool | None = None,
    wanted: frozenset[str] = frozenset(),
    parameters: Mapping[str, int] | None = None,
) -> None:
    """One text response: ``text_output`` (when given) and ``finish_reason`` (when given), of
    the ``wanted`` outputs (empty = both). On a stream every response carries the parameter
    ``triton_final_response`` (``final``: false, then true on the request's last), as Triton's
    stream handler does; ``None`` (``ModelInfer``) leaves it out. ``parameters``: the token
    counts (``shared.kserve_wire.usage_parameters``), as the formatter's stream responses."""
    response.model_name = model
    response.model_version = "1"
    if request_id:
        response.id = request_id
    if text is not None and (not wanted or "text_output" in wanted):
        response.outputs.add(name="text_output", datatype="BYTES", shape=(1,))
        response.raw_output_contents.append(_LENGTH.pack(len(text)) + text)
    if finish_reason is not None and (not wanted or "finish_reason" in wanted):
        reason = finish_reason.encode()
        response.outputs.add(name="finish_reason", datatype="BYTES", shape=(1,))
        response.raw_output_contents.append(_LENGTH.pack(len(reason)) + reason)
    if final is not None:
        mark_final(response, final)
    for key, value in (parameters or {}).items():
        response.parameters[key].int64_param = value


def mark_final(response: pb.ModelInferResponse, final: bool) -> None:
    """Set the stream parameter ``triton_final_response`` (clients loop until it is true)."""
    response.parameters["triton_final_response"].bool_param = final


def check_output(tensor: Tensor) -> None:
    """A worker's output holds exactly what its datatype and shape say: product(shape) x the
    element size in bytes, or for ``BYTES`` that many length-prefixed elements ending exactly
    at the end of the data. ``InternalError`` naming the output otherwise."""
    name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
    kind = DATATYPES.get(datatype)
    if kind is None:
        raise InternalError(f"The worker's output `{name}` has unknown datatype `{datatype}`.")
    if any(dim < 0 for dim in shape):
        raise InternalError(f"The worker's output `{name}` has a negative dimension: {shape}.")
    count = math.prod(shape)
    size = len(tensor.data)
    if kind.size:
        if size != count * kind.size:
            raise InternalError(
                f"The worker's output `{name}` ({datatype}, shape {shape}) has {size} bytes; "
                f"its shape and datatype need {count * kind.size}."
            )
        return
    found = _bytes_elements(tensor.data)
    if found is None:
        raise InternalError(
            f"The worker's output `{name}` (BYTES, shape {shape}): its element lengths do not "
            f"cover its {size} bytes exactly."
        )
    if found != count:
        raise InternalError(
            f"The worker's output `{name}` holds {found} BYTES elements; its shape {shape} "
            f"says {count}."
        )


def _bytes_elements(raw: bytes) -> int | None:
    """How many length-prefixed elements ``raw`` holds; ``None`` unless they end at its end."""
    offset, end, found = 0, len(raw), 0
    while offset < end:
        if offset + 4 > end:
            return None
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4 + length
        found += 1
    return found if offset == end else None


def fill_tensors(
    response: pb.ModelInferResponse,
    *,
    model: str,
    request_id: str,
    outputs: Sequence[Tensor],
    model_version: str = "",
    parameters: Mapping[str, Any] | None = None,
) -> None:
    """A tensor model's response: every output with its raw contents."""
    response.model_name = model
    response.model_version = model_version or "1"
    if request_id:
        response.id = request_id
    for tensor in outputs:
        out = response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        for key, value in tensor.parameters.items():
            set_parameter(out.parameters[key], value)
    response.raw_output_contents.extend(tensor.data for tensor in outputs)
    for key, value in (parameters or {}).items():
        set_parameter(response.parameters[key], value)


def stream_error(message: str, *, model: str, request_id: str) -> pb.ModelStreamInferResponse:
    """A failed request on a stream: ``error_message``, and the request's model and id."""
    out = pb.ModelStreamInferResponse(error_message=message)
    out.infer_response.model_name = model
    if request_id:
        out.infer_response.id = request_id
    return out
