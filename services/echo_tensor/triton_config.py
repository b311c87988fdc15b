"""A Triton ``ModelConfig`` file as the model's spec: the one module that imports protobuf.

The file is Triton's JSON form (``*.json``), its binary serialization (``*.pb``, ``*.bin``:
kept byte for byte) or, for anything else, the protobuf text form Triton's own ``config.pbtxt``
uses. The card carries the binary serialization (``TensorModelSpec.triton_model_config``), which
the gateway returns verbatim from ``ModelConfig``; inputs and outputs are derived from it too.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError

from services.echo_tensor.spec import DATATYPES, check_pairs
from shared.kserve import model_config_pb2 as mc
from shared.messages import TensorModelSpec, TensorSpec

BINARY_SUFFIXES = frozenset({".pb", ".bin"})
_DEFAULTS = TensorModelSpec(inputs=(), outputs=())


def read_model_config(path: Path) -> tuple[mc.ModelConfig, bytes]:
    """The parsed config and its binary serialization (``ValueError`` naming the file)."""
    raw = path.read_bytes()
    config = mc.ModelConfig()
    try:
        if path.suffix == ".json":
            json_format.Parse(raw.decode(), config)
        elif path.suffix in BINARY_SUFFIXES:
            config.ParseFromString(raw)
            return config, raw
        else:
            text_format.Parse(raw.decode(), config)
    except (json_format.ParseError, text_format.ParseError, DecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a Triton ModelConfig: {exc}") from None
    # Deterministic, so every worker of the model publishes the same card bytes.
    return config, config.SerializeToString(deterministic=True)


def model_spec(path: Path, model: str) -> TensorModelSpec:
    """The spec of the Triton config at ``path``, served as ``model``.

    Shapes are the config's dims, with a leading ``-1`` when ``max_batch_size > 0`` (as Triton
    reports them in model metadata); ``TYPE_STRING`` is ``BYTES``.

    Raises:
        ValueError: unreadable config, a name other than ``model``, a tensor without a
            datatype, or an input and its paired output of different datatypes.
    """
    config, serialized = read_model_config(path)
    if config.name and config.name != model:
        raise ValueError(f"{path}: the config names model {config.name!r}, served as {model!r}")
    batch = (-1,) if config.max_batch_size > 0 else ()
    inputs = tuple(
        TensorSpec(
            name=t.name,
            datatype=_datatype(t.data_type, t.name),
            shape=(*batch, *t.dims),
            optional=t.optional,
        )
        for t in config.input
    )
    outputs = tuple(
        TensorSpec(name=t.name, datatype=_datatype(t.data_type, t.name), shape=(*batch, *t.dims))
        for t in config.output
    )
    spec = TensorModelSpec(
        inputs=inputs,
        outputs=outputs,
        platform=config.platform or _DEFAULTS.platform,
        backend=config.backend or _DEFAULTS.backend,
        triton_model_config=serialized,
    )
    check_pairs(spec)
    return spec


def _datatype(data_type: mc.DataType, tensor: str) -> str:
    """Triton ``TYPE_INT32`` → KServe ``INT32``; ``TYPE_STRING`` → ``BYTES``."""
    name = mc.DataType.Name(data_type).removeprefix("TYPE_")
    name = "BYTES" if name == "STRING" else name
    if name not in DATATYPES:
        raise ValueError(f"tensor {tensor} has no usable data_type ({name})")
    return name
