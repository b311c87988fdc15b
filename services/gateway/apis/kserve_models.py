"""Pure: what a model takes and gives over KServe v2, from its ``ModelCard``.

An LLM (``kind="llm"``) takes ``text_input`` (BYTES, one element) and optional ``streaming``
(BOOL) plus sampling knobs, and gives ``text_output`` and ``finish_reason`` (as Dynamo's KServe
front end). A tensor model (``kind="tensor"``) takes and gives what its worker registered:
``tensor_spec``, or the Triton ``ModelConfig`` it sent verbatim. Metadata and config responses
are built once per card; request inputs are checked against the same tensor specs.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from services.gateway.apis.kserve import (
    DATATYPES,
    datatype_of_config,
    input_values,
    parameters_of,
    raw_contents,
)
from shared.errors import InternalError, InvalidRequest, NotFound
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import model_config_pb2 as mc
from shared.messages import ModelCard, Tensor, TensorModelSpec, TensorSpec

VERSION = "1"
"""The one version every model is served as."""
PLATFORM = "jetserve"

TEXT_INPUT = "text_input"
STREAMING = "streaming"
LLM_SPEC = TensorModelSpec(
    inputs=(
        TensorSpec(name=TEXT_INPUT, datatype="BYTES", shape=(1,)),
        TensorSpec(name=STREAMING, datatype="BOOL", shape=(1,), optional=True),
    ),
    outputs=(
        TensorSpec(name="text_output", datatype="BYTES", shape=(-1,)),
        TensorSpec(name="finish_reason", datatype="BYTES", shape=(-1,), optional=True),
    ),
    platform=PLATFORM,
    backend=PLATFORM,
)
_LENGTH = struct.Struct("<I")
ROUTING_PARAMETERS = frozenset(
    {"backend_instance_id", "decode_worker_id", "prefill_worker_id", "dp_rank", "prefill_dp_rank"}
)
"""Request ``parameters`` that pin workers and ranks, as ``nvext`` does over HTTP (issue 24)."""
AGENT_HINT_PARAMETERS = frozenset({"priority", "strict_priority", "osl", "speculative_prefill"})
"""Request ``parameters`` read as ``nvext.agent_hints`` (issue 26); ``session_id`` is
``nvext.agent_context.session_id``. The header forms come as call metadata."""
SESSION_PARAMETER = "session_id"
SAMPLING_INPUTS = frozenset(
    {
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "ignore_eos",
        "presence_penalty",
        "frequency_penalty",
    }
)
"""Sampling knobs an LLM takes as optional inputs or request ``parameters`` (OpenAI names and
ranges, validated as ``/v1/completions`` does)."""


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model as KServe sees it: its kind, tensors, and the metadata and config answers."""

    name: str
    kind: str
    spec: TensorModelSpec
    metadata: pb.ModelMetadataResponse
    config: pb.ModelConfigResponse


def check_version(name: str, version: str) -> None:
    """Every model is served as version 1; an empty version means that one."""
    if version and version != VERSION:
        raise NotFound(f"The model `{name}` has no version `{version}` (only `{VERSION}`).")


def view_of(name: str, card: ModelCard | None) -> ModelView:
    """The KServe view of a model (no card = an LLM whose worker published none)."""
    if card is None or card.kind != "tensor":
        return _view(name, "llm", LLM_SPEC, _config_from_spec(name, LLM_SPEC))
    if card.tensor_spec is None:
        raise InternalError(f"The tensor model `{name}` was registered without a tensor spec.")
    spec = card.tensor_spec
    if not spec.triton_model_config:
        return _view(name, "tensor", spec, _config_from_spec(name, spec))
    try:
        config = mc.ModelConfig.FromString(spec.triton_model_config)
        from_config = spec_from_config(config)
    except (DecodeError, ValueError) as exc:
        raise InternalError(f"The Triton model config of `{name}` is not usable: {exc}") from exc
    return _view(name, "tensor", from_config, config)


def spec_from_config(config: mc.ModelConfig) -> TensorModelSpec:
    """Tensor specs from a Triton ``ModelConfig``: with ``max_batch_size`` > 0 every shape
    starts with the batch dimension (-1), as Triton's metadata shows it."""
    batch = (-1,) if config.max_batch_size > 0 else ()
    return TensorModelSpec(
        inputs=tuple(
            TensorSpec(
                name=i.name,
                datatype=datatype_of_config(i.data_type),
                shape=(*batch, *i.dims),
                optional=i.optional,
            )
            for i in config.input
        ),
        outputs=tuple(
            TensorSpec(
                name=o.name, datatype=datatype_of_config(o.data_type), shape=(*batch, *o.dims)
            )
            for o in config.output
        ),
        platform=config.platform or config.backend or PLATFORM,
        backend=config.backend or PLATFORM,
    )


def _view(name: str, kind: str, spec: TensorModelSpec, config: mc.ModelConfig) -> ModelView:
    metadata = pb.ModelMetadataResponse(name=name, versions=[VERSION], platform=spec.platform)
    for source, target in ((spec.inputs, metadata.inputs), (spec.outputs, metadata.outputs)):
        for tensor in source:
            target.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
    answer = pb.ModelConfigResponse()
    answer.config.CopyFrom(config)
    if not answer.config.name:
        answer.config.name = name
    return ModelView(name=name, kind=kind, spec=spec, metadata=metadata, config=answer)


def _config_from_spec(name: str, spec: TensorModelSpec) -> mc.ModelConfig:
    config = mc.ModelConfig(
        name=name, platform=spec.platform, backend=spec.backend, max_batch_size=0
    )
    for tensor in spec.inputs:
        config.input.add(
            name=tensor.name,
            data_type=DATATYPES[tensor.datatype].config_type,
            dims=tensor.shape,
            optional=tensor.optional,
        )
    for tensor in spec.outputs:
        config.output.add(
            name=tensor.name, data_type=DATATYPES[tensor.datatype].config_type, dims=tensor.shape
        )
    return config


# --- LLM requests --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextRequest:
    """An LLM request read from KServe tensors: the prompt, ``streaming``, sampling values."""

    prompt: str
    streaming: bool | None
    fields: dict[str, Any]
    """Sampling knobs by their OpenAI names (validated later, as a completion body is)."""
    outputs: frozenset[str]
    """The requested outputs (empty = all)."""


def text_request(request: pb.ModelInferRequest) -> TextRequest:
    """Read an LLM request: ``text_input`` (one BYTES element, UTF-8), ``streaming`` (one
    BOOL), sampling knobs from inputs or ``parameters`` (an input wins)."""
    params = parameters_of(request.parameters)
    fields = {k: v for k, v in params.items() if k in SAMPLING_INPUTS} if params else {}
    nvext: dict[str, Any] = (
        {k: v for k, v in params.items() if k in ROUTING_PARAMETERS} if params else {}
    )
    if params:
        if hints := {k: v for k, v in params.items() if k in AGENT_HINT_PARAMETERS}:
            nvext["agent_hints"] = hints
        if SESSION_PARAMETER in params:
            nvext["agent_context"] = {"session_id": params[SESSION_PARAMETER]}
    if nvext:
        fields["nvext"] = nvext
    prompt: str | None = None
    streaming: bool | None = None
    for tensor, raw in zip(request.inputs, raw_contents(request), strict=True):
        name = tensor.name
        if name == TEXT_INPUT:
            prompt = _prompt(tensor, raw)
        elif name == STREAMING:
            if raw is not None and len(raw) == 1 and _is_one(tensor, "BOOL"):
                streaming = raw != b"\x00"  # the common case, without the general reader
                continue
            _expect(tensor, "BOOL")
            streaming = bool(_one(tensor, input_values(tensor, raw)))
        elif name in SAMPLING_INPUTS:
            values = input_values(tensor, raw)
            if name == "stop":
                fields[name] = [_text(tensor, v) if isinstance(v, bytes) else v for v in values]
            else:
                fields[name] = _one(tensor, values)
        else:
            known = ", ".join(sorted({TEXT_INPUT, STREAMING, *SAMPLING_INPUTS}))
            raise InvalidRequest(
                f"Unknown input `{name}`; an LLM takes: {known}.", param=name or "inputs"
            )
    if prompt is None:
        raise InvalidRequest(f"The input `{TEXT_INPUT}` is required.", param=TEXT_INPUT)
    return TextRequest(prompt, streaming, fields, requested_outputs(request, LLM_SPEC))


def _is_one(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str) -> bool:
    """``tensor`` is one element of ``datatype`` (shape [1] or [1, 1])."""
    return tensor.datatype == datatype and list(tensor.shape) in ([1], [1, 1])


def _prompt(tensor: pb.ModelInferRequest.InferInputTensor, raw: bytes | None) -> str:
    if raw is not None and len(raw) >= 4 and _is_one(tensor, "BYTES"):
        (length,) = _LENGTH.unpack_from(raw)
        if length == len(raw) - 4:  # one whole element: the common case, read directly
            return _text(tensor, raw[4:])
    _expect(tensor, "BYTES")
    values = input_values(tensor, raw)
    if len(values) != 1:
        raise InvalidRequest(
            f"`{TEXT_INPUT}` must hold one prompt (shape [1] or [1, 1]); it holds {len(values)}.",
            param=TEXT_INPUT,
        )
    return _text(tensor, values[0])


def _expect(tensor: pb.ModelInferRequest.InferInputTensor, datatype: str) -> None:
    if tensor.datatype != datatype:
        raise InvalidRequest(
            f"Input `{tensor.name}` must be {datatype}, not {tensor.datatype or 'empty'}.",
            param=tensor.name,
        )


def _one(tensor: pb.ModelInferRequest.InferInputTensor, values: list[Any]) -> Any:
    if len(values) != 1:
        raise InvalidRequest(
            f"Input `{tensor.name}` must hold one element; it holds {len(values)}.",
            param=tensor.name,
        )
    return values[0]


def _text(tensor: pb.ModelInferRequest.InferInputTensor, value: bytes) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise InvalidRequest(f"Input `{tensor.name}` is not UTF-8.", param=tensor.name) from None


# --- tensor requests -----------------------------------------------------------------------------


def requested_outputs(request: pb.ModelInferRequest, spec: TensorModelSpec) -> frozenset[str]:
    """The output names the client asked for (empty = all); each must be one of the model's."""
    if not request.outputs:
        return frozenset()
    names = frozenset(o.name for o in request.outputs)
    known = {o.name for o in spec.outputs}
    for name in names:
        if name not in known:
            raise InvalidRequest(
                f"Unknown output `{name}`; the model gives: {', '.join(sorted(known))}.",
                param=name or "outputs",
            )
    return names


def check_inputs(inputs: Sequence[Tensor], spec: TensorModelSpec) -> None:
    """Every input known to the model, once, with its datatype and a shape its spec allows
    (-1 = any size); every required input present."""
    by_name = {s.name: s for s in spec.inputs}
    seen: set[str] = set()
    for tensor in inputs:
        name = tensor.name
        expected = by_name.get(name)
        if expected is None:
            known = ", ".join(sorted(by_name))
            raise InvalidRequest(
                f"Unknown input `{name}`; the model takes: {known}.", param=name or "inputs"
            )
        if name in seen:
            raise InvalidRequest(f"Input `{name}` is given twice.", param=name)
        seen.add(name)
        if tensor.datatype != expected.datatype:
            raise InvalidRequest(
                f"Input `{name}` must be {expected.datatype}, not {tensor.datatype}.", param=name
            )
        if not shape_fits(tensor.shape, expected.shape):
            raise InvalidRequest(
                f"Input `{name}` has shape {list(tensor.shape)}; the model takes "
                f"{list(expected.shape)} (-1 = any size).",
                param=name,
            )
    for expected in spec.inputs:
        if not expected.optional and expected.name not in seen:
            raise InvalidRequest(f"The input `{expected.name}` is required.", param=expected.name)


def shape_fits(shape: Sequence[int], spec: Sequence[int]) -> bool:
    """Same rank, and every dimension equal to the spec's or the spec's is -1."""
    return len(shape) == len(spec) and all(s in (-1, d) for d, s in zip(shape, spec, strict=True))
