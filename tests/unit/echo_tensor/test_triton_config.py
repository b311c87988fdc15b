"""A Triton ModelConfig file (JSON, text, binary) as the echo model's spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.echo_tensor.triton_config import model_spec, read_model_config
from shared.kserve import model_config_pb2 as mc
from shared.messages import TensorSpec

CONFIG_JSON = {
    "name": "echo",
    "platform": "custom",
    "input": [
        {"name": "input", "data_type": "TYPE_STRING", "dims": [-1]},
        {"name": "optional_input", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
    ],
    "output": [{"name": "dummy_output", "data_type": "TYPE_STRING", "dims": [-1]}],
    "model_transaction_policy": {"decoupled": True},
}


def expected_config() -> mc.ModelConfig:
    config = mc.ModelConfig(name="echo", platform="custom")
    config.input.add(name="input", data_type=mc.TYPE_STRING, dims=[-1])
    config.input.add(name="optional_input", data_type=mc.TYPE_INT32, dims=[-1], optional=True)
    config.output.add(name="dummy_output", data_type=mc.TYPE_STRING, dims=[-1])
    config.model_transaction_policy.decoupled = True
    return config


@pytest.fixture
def json_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG_JSON))
    return path


def test_json_form_is_parsed_and_serialized_for_the_card(json_file: Path) -> None:
    config, serialized = read_model_config(json_file)
    assert (config, mc.ModelConfig.FromString(serialized)) == (
        expected_config(),
        expected_config(),
    )


def test_text_form_as_in_config_pbtxt(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "echo"\nplatform: "custom"\n' + _text_tensors())
    config, _ = read_model_config(path)
    assert (config.name, [t.name for t in config.input]) == ("echo", ["input", "optional_input"])


def test_binary_form_is_kept_byte_for_byte(tmp_path: Path) -> None:
    raw = expected_config().SerializeToString()
    path = tmp_path / "config.pb"
    path.write_bytes(raw)
    assert read_model_config(path)[1] == raw


def test_spec_comes_from_the_config(json_file: Path) -> None:
    spec = model_spec(json_file, "echo")
    assert (spec.inputs, spec.outputs, spec.platform, spec.backend) == (
        (
            TensorSpec(name="input", datatype="BYTES", shape=(-1,)),
            TensorSpec(name="optional_input", datatype="INT32", shape=(-1,), optional=True),
        ),
        (TensorSpec(name="dummy_output", datatype="BYTES", shape=(-1,)),),
        "custom",
        "jetserve",
    )


def test_the_card_carries_the_serialized_config(json_file: Path) -> None:
    spec = model_spec(json_file, "echo")
    assert mc.ModelConfig.FromString(spec.triton_model_config) == expected_config()


def test_a_batching_model_gets_a_leading_variable_dim(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**CONFIG_JSON, "max_batch_size": 8}))
    assert model_spec(path, "echo").inputs[0].shape == (-1, -1)


def test_a_config_for_another_model_name_is_refused(json_file: Path) -> None:
    with pytest.raises(ValueError, match="names model 'echo', served as 'identity'"):
        model_spec(json_file, "identity")


def test_a_file_that_is_no_model_config_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"name": "echo", "no_such_field": 1}')
    with pytest.raises(ValueError, match="not a Triton ModelConfig"):
        read_model_config(path)


def test_a_tensor_without_a_datatype_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"name": "echo", "input": [{"name": "x", "dims": [1]}]}))
    with pytest.raises(ValueError, match="tensor x has no usable data_type"):
        model_spec(path, "echo")


def _text_tensors() -> str:
    return (
        'input [ { name: "input" data_type: TYPE_STRING dims: [ -1 ] },\n'
        '        { name: "optional_input" data_type: TYPE_INT32 dims: [ -1 ] optional: true } ]\n'
        'output [ { name: "dummy_output" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
    )
