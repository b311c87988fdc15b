"""Echo worker flags (JETSERVE_ECHO_TENSOR_*) and the tensor-list syntax of --inputs/--outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.spec import flag_spec, output_names, parse_tensors
from shared.messages import TensorSpec


class TestConfig:
    def test_defaults(self) -> None:
        config = EchoTensorConfig.from_cli([], environ={})
        assert (config.model_name, config.triton_model_config, config.worker_ttl_s) == (
            "echo",
            None,
            10.0,
        )

    def test_random_worker_ids_are_distinct_subject_tokens(self) -> None:
        a, b = EchoTensorConfig().worker_id, EchoTensorConfig().worker_id
        assert (a.startswith("echo-tensor-"), a != b) == (True, True)

    def test_env_vars_are_read(self) -> None:
        environ = {
            "JETSERVE_ECHO_TENSOR_MODEL_NAME": "identity",
            "JETSERVE_ECHO_TENSOR_WORKER_ID": "e1",
            "JETSERVE_ECHO_TENSOR_INPUTS": "x:FP32:4",
            "JETSERVE_ECHO_TENSOR_OUTPUTS": "y:FP32:4",
            "JETSERVE_ECHO_TENSOR_TRITON_MODEL_CONFIG": "/models/echo/config.pbtxt",
        }
        config = EchoTensorConfig.from_cli([], environ=environ)
        assert (
            config.model_name,
            config.worker_id,
            config.inputs,
            config.outputs,
            config.triton_model_config,
        ) == ("identity", "e1", "x:FP32:4", "y:FP32:4", Path("/models/echo/config.pbtxt"))

    def test_a_bad_tensor_list_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit):
            EchoTensorConfig.from_cli(["--inputs", "x:FLOAT:4"], environ={})
        assert "unknown datatype 'FLOAT'" in capsys.readouterr().err

    def test_an_invalid_worker_id_is_a_usage_error(self) -> None:
        with pytest.raises(SystemExit):
            EchoTensorConfig.from_cli(["--worker-id", "a.b"], environ={})

    def test_tensor_flags_are_not_checked_with_a_triton_config(self) -> None:
        config = EchoTensorConfig(inputs="nonsense", triton_model_config=Path("config.pbtxt"))
        assert config.inputs == "nonsense"


class TestDefaultSpec:
    def test_three_optional_inputs_int32_fp32_bytes(self) -> None:
        spec = flag_spec(EchoTensorConfig().inputs, EchoTensorConfig().outputs)
        assert spec.inputs == (
            TensorSpec(name="INPUT0", datatype="INT32", shape=(-1,), optional=True),
            TensorSpec(name="INPUT1", datatype="FP32", shape=(-1,), optional=True),
            TensorSpec(name="INPUT2", datatype="BYTES", shape=(-1,), optional=True),
        )

    def test_outputs_mirror_the_inputs(self) -> None:
        spec = flag_spec(EchoTensorConfig().inputs, EchoTensorConfig().outputs)
        assert [(s.name, s.datatype, s.shape, s.optional) for s in spec.outputs] == [
            ("OUTPUT0", "INT32", (-1,), False),
            ("OUTPUT1", "FP32", (-1,), False),
            ("OUTPUT2", "BYTES", (-1,), False),
        ]

    def test_input_n_comes_back_as_output_n(self) -> None:
        spec = flag_spec(EchoTensorConfig().inputs, EchoTensorConfig().outputs)
        assert output_names(spec) == {
            "INPUT0": "OUTPUT0",
            "INPUT1": "OUTPUT1",
            "INPUT2": "OUTPUT2",
        }

    def test_platform_and_backend_are_jetserve_with_no_triton_config(self) -> None:
        spec = flag_spec(EchoTensorConfig().inputs, EchoTensorConfig().outputs)
        assert (spec.platform, spec.backend, spec.triton_model_config) == (
            "jetserve",
            "jetserve",
            b"",
        )


class TestTensorList:
    def test_shapes_dims_joined_by_x_and_scalars(self) -> None:
        assert parse_tensors("a:fp16:2x-1x3, b:BOOL:") == (
            TensorSpec(name="a", datatype="FP16", shape=(2, -1, 3)),
            TensorSpec(name="b", datatype="BOOL", shape=()),
        )

    def test_optional_marker(self) -> None:
        assert parse_tensors("a:INT64:-1:Optional")[0].optional

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("a:INT32", "is not NAME:DATATYPE:SHAPE"),
            (":INT32:1", "is not NAME:DATATYPE:SHAPE"),
            ("a:STRING:1", "unknown datatype"),
            ("a:INT32:1,2", "is not NAME:DATATYPE:SHAPE"),
            ("a:INT32:ax1", "bad shape"),
            ("a:INT32:-2", "a dim is -1"),
            ("a:INT32:1:maybe", "fourth field"),
            ("a:INT32:1,a:FP32:1", "duplicate tensor names a"),
        ],
    )
    def test_bad_lists_are_rejected_with_the_reason(self, text: str, problem: str) -> None:
        with pytest.raises(ValueError, match=problem):
            parse_tensors(text)

    def test_same_outputs_are_the_inputs_under_their_own_names(self) -> None:
        spec = flag_spec("a:INT32:-1:optional,b:BYTES:-1", "same")
        assert (spec.outputs, output_names(spec)) == (
            (
                TensorSpec(name="a", datatype="INT32", shape=(-1,)),
                TensorSpec(name="b", datatype="BYTES", shape=(-1,)),
            ),
            {"a": "a", "b": "b"},
        )

    def test_an_input_past_the_last_output_keeps_its_name(self) -> None:
        spec = flag_spec("a:INT32:-1,b:BYTES:-1", "out:INT32:-1")
        assert output_names(spec) == {"a": "out", "b": "b"}

    def test_paired_tensors_need_the_same_datatype(self) -> None:
        with pytest.raises(ValueError, match="paired tensors need the same datatype"):
            flag_spec("a:INT32:-1", "out:FP32:-1")

    def test_at_least_one_input(self) -> None:
        with pytest.raises(ValueError, match="at least one input"):
            flag_spec(" ", "same")
