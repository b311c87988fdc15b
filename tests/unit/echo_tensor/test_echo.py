"""The echo core: inputs back as outputs, byte for byte, under their paired names."""

from __future__ import annotations

import struct

import pytest

from services.echo_tensor.echo import echo
from shared.errors import ModelNotFound
from shared.messages import Tensor, TensorInfer, TensorResult

NAMES = {"INPUT0": "OUTPUT0", "INPUT1": "OUTPUT1", "INPUT2": "OUTPUT2"}
INT32 = Tensor(name="INPUT0", datatype="INT32", shape=(3,), data=struct.pack("<3i", 1, -2, 3))
FP32 = Tensor(
    name="INPUT1",
    datatype="FP32",
    shape=(1, 2),
    data=struct.pack("<2f", 0.5, -1.25),
    parameters={"unit": "m"},
)
BYTES = Tensor(
    name="INPUT2", datatype="BYTES", shape=(2,), data=b"\x02\x00\x00\x00hi\x00\x00\x00\x00"
)


def infer(*inputs: Tensor, model: str = "echo", outputs: tuple[str, ...] = ()) -> TensorInfer:
    return TensorInfer(
        request_id="r1",
        model=model,
        reply_to="gw.r1",
        inputs=inputs,
        outputs=outputs,
        model_version="1",
        id="client-7",
        parameters={"trace": True},
    )


def test_every_input_comes_back_renamed_and_otherwise_identical() -> None:
    result = echo(infer(INT32, FP32, BYTES), model="echo", names=NAMES)
    assert [(t.name, t.datatype, t.shape, t.data, t.parameters) for t in result.outputs] == [
        ("OUTPUT0", "INT32", (3,), INT32.data, {}),
        ("OUTPUT1", "FP32", (1, 2), FP32.data, {"unit": "m"}),
        ("OUTPUT2", "BYTES", (2,), BYTES.data, {}),
    ]


def test_the_result_echoes_ids_version_and_parameters() -> None:
    result = echo(infer(INT32), model="echo", names=NAMES)
    assert result == TensorResult(
        request_id="r1",
        model="echo",
        outputs=(Tensor(name="OUTPUT0", datatype="INT32", shape=(3,), data=INT32.data),),
        model_version="1",
        id="client-7",
        parameters={"trace": True},
    )


def test_only_the_given_optional_inputs_come_back() -> None:
    result = echo(infer(BYTES), model="echo", names=NAMES)
    assert [t.name for t in result.outputs] == ["OUTPUT2"]


def test_requested_outputs_filter_the_result() -> None:
    result = echo(infer(INT32, FP32, BYTES, outputs=("OUTPUT1",)), model="echo", names=NAMES)
    assert [t.name for t in result.outputs] == ["OUTPUT1"]


def test_an_input_without_a_pair_keeps_its_name() -> None:
    extra = Tensor(name="other", datatype="UINT8", shape=(1,), data=b"\x07")
    assert echo(infer(extra), model="echo", names=NAMES).outputs == (extra,)


def test_another_model_is_model_not_found() -> None:
    with pytest.raises(ModelNotFound, match="`other`"):
        echo(infer(INT32, model="other"), model="echo", names=NAMES)
