"""The echo model's tensors from the command line, and which output each input comes back as.

Pure: strings in, ``TensorModelSpec`` out. A tensor list is ``NAME:DATATYPE:SHAPE[:optional]``
items separated by commas; ``SHAPE`` is the dims joined by ``x`` (``-1`` = variable, ``2x-1``,
empty = a scalar). Inputs and outputs pair by position: the i-th input comes back as the i-th
output; an input past the last output comes back under its own name (``same``: all of them).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.messages import TensorModelSpec, TensorSpec

DATATYPES = frozenset(
    {
        "BOOL",
        "UINT8",
        "UINT16",
        "UINT32",
        "UINT64",
        "INT8",
        "INT16",
        "INT32",
        "INT64",
        "FP16",
        "FP32",
        "FP64",
        "BF16",
        "BYTES",
    }
)
"""KServe v2 tensor datatypes."""
OPTIONAL = "optional"
SAME = "same"
"""``--outputs same``: every input comes back under its own name (as Dynamo's echo worker)."""

DEFAULT_INPUTS = "INPUT0:INT32:-1:optional,INPUT1:FP32:-1:optional,INPUT2:BYTES:-1:optional"
DEFAULT_OUTPUTS = "OUTPUT0:INT32:-1,OUTPUT1:FP32:-1,OUTPUT2:BYTES:-1"


def parse_tensors(text: str, what: str = "tensors") -> tuple[TensorSpec, ...]:
    """``NAME:DATATYPE:SHAPE[:optional],...`` as specs; ``ValueError`` naming ``what``."""
    specs = tuple(_parse_one(item.strip(), what) for item in text.split(",") if item.strip())
    names = [s.name for s in specs]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"{what}: duplicate tensor names {', '.join(duplicates)}")
    return specs


def _parse_one(item: str, what: str) -> TensorSpec:
    parts = item.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"{what}: {item!r} is not NAME:DATATYPE:SHAPE[:optional]")
    name, datatype, shape_text = parts[0], parts[1].upper(), parts[2]
    if datatype not in DATATYPES:
        raise ValueError(f"{what}: {item!r} has unknown datatype {parts[1]!r}")
    try:
        shape = tuple(int(dim) for dim in shape_text.split("x")) if shape_text else ()
    except ValueError:
        raise ValueError(f"{what}: {item!r} has a bad shape {shape_text!r}") from None
    if any(dim < -1 for dim in shape):
        raise ValueError(f"{what}: {item!r}: a dim is -1 (variable) or >= 0")
    optional = len(parts) == 4
    if optional and parts[3].lower() != OPTIONAL:
        raise ValueError(f"{what}: {item!r}: the fourth field can only be {OPTIONAL!r}")
    return TensorSpec(name=name, datatype=datatype, shape=shape, optional=optional)


def flag_spec(inputs: str, outputs: str) -> TensorModelSpec:
    """The model spec of ``--inputs`` / ``--outputs`` (``same`` or empty outputs: the inputs)."""
    ins = parse_tensors(inputs, "--inputs")
    if not ins:
        raise ValueError("--inputs: the model needs at least one input")
    is_same = outputs.strip().lower() in ("", SAME)
    outs = _as_outputs(ins) if is_same else parse_tensors(outputs, "--outputs")
    spec = TensorModelSpec(inputs=ins, outputs=outs)
    check_pairs(spec)
    return spec


def _as_outputs(inputs: Sequence[TensorSpec]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name=s.name, datatype=s.datatype, shape=s.shape) for s in inputs)


def check_pairs(spec: TensorModelSpec) -> None:
    """``ValueError`` when an input and the output it comes back as differ in datatype."""
    for given, back in zip(spec.inputs, spec.outputs, strict=False):
        if given.datatype != back.datatype:
            raise ValueError(
                f"input {given.name} ({given.datatype}) comes back as output {back.name}, "
                f"which is {back.datatype}: paired tensors need the same datatype"
            )


def output_names(spec: TensorModelSpec) -> dict[str, str]:
    """Input name → the output name it comes back as (position pairs; extra inputs keep theirs)."""
    names = {s.name: s.name for s in spec.inputs}
    for given, back in zip(spec.inputs, spec.outputs, strict=False):
        names[given.name] = back.name
    return names
