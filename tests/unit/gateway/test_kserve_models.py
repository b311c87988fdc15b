"""What a model takes and gives over KServe: LLM and tensor views, request reading and checks."""

from __future__ import annotations

import struct

import pytest

from services.gateway.apis.kserve import join_bytes
from services.gateway.apis.kserve_models import (
    LLM_SPEC,
    check_inputs,
    check_version,
    requested_outputs,
    shape_fits,
    spec_from_config,
    text_request,
    view_of,
)
from services.gateway.apis.openai import completion_from, completion_to_preprocess
from shared.errors import InternalError, InvalidRequest, NotFound
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import model_config_pb2 as mc
from shared.messages import ModelCard, Tensor, TensorModelSpec, TensorSpec

SPEC = TensorModelSpec(
    inputs=(
        TensorSpec(name="IN", datatype="FP32", shape=(-1, 4)),
        TensorSpec(name="MASK", datatype="BOOL", shape=(4,), optional=True),
    ),
    outputs=(TensorSpec(name="OUT", datatype="FP32", shape=(-1, 4)),),
    platform="onnxruntime_onnx",
    backend="onnxruntime",
)


def llm_request(
    *inputs: tuple[str, str, list[int], bytes], **params: object
) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for key, value in params.items():
        if isinstance(value, bool):
            request.parameters[key].bool_param = value
        elif isinstance(value, int):
            request.parameters[key].int64_param = value
        elif isinstance(value, float):
            request.parameters[key].double_param = value
        else:
            request.parameters[key].string_param = str(value)
    return request


PROMPT = ("text_input", "BYTES", [1], join_bytes([b"Hello"]))


class TestViews:
    def test_llm_metadata_and_config(self) -> None:
        view = view_of("m", ModelCard(model="m", context_length=8))
        metadata, config = view.metadata, view.config.config
        assert (view.kind, metadata.name, list(metadata.versions)) == ("llm", "m", ["1"])
        assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
            ("text_output", "BYTES", [-1]),
            ("finish_reason", "BYTES", [-1]),
        ]
        assert (config.platform, config.backend, config.max_batch_size) == (
            "jetserve",
            "jetserve",
            0,
        )
        assert [(o.name, o.data_type) for o in config.output] == [
            ("text_output", mc.TYPE_STRING),
            ("finish_reason", mc.TYPE_STRING),
        ]

    def test_a_model_without_card_is_an_llm(self) -> None:
        assert view_of("m", None).spec == LLM_SPEC

    def test_tensor_view_from_its_spec(self) -> None:
        card = ModelCard(model="t", context_length=0, kind="tensor", tensor_spec=SPEC)
        view = view_of("t", card)
        config = view.config.config
        assert (view.kind, view.metadata.platform) == ("tensor", "onnxruntime_onnx")
        assert [(i.name, i.data_type, list(i.dims), i.optional) for i in config.input] == [
            ("IN", mc.TYPE_FP32, [-1, 4], False),
            ("MASK", mc.TYPE_BOOL, [4], True),
        ]
        assert (config.name, config.backend) == ("t", "onnxruntime")

    def test_tensor_view_returns_the_triton_config_verbatim(self) -> None:
        triton = mc.ModelConfig(name="t", platform="tensorrt_plan", max_batch_size=4)
        triton.input.add(name="IN", data_type=mc.TYPE_INT64, dims=[3])
        triton.output.add(name="OUT", data_type=mc.TYPE_STRING, dims=[1])
        triton.instance_group.add(count=2)
        spec = TensorModelSpec(
            inputs=(), outputs=(), triton_model_config=triton.SerializeToString()
        )
        view = view_of("t", ModelCard(model="t", context_length=0, kind="tensor", tensor_spec=spec))
        assert view.config.config == triton
        assert [(t.name, t.datatype, list(t.shape)) for t in view.metadata.inputs] == [
            ("IN", "INT64", [-1, 3])
        ]
        assert [t.datatype for t in view.metadata.outputs] == ["BYTES"]
        assert view.metadata.platform == "tensorrt_plan"

    def test_unbatched_triton_config_keeps_its_dims(self) -> None:
        triton = mc.ModelConfig(name="t")
        triton.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[2, 2], optional=True)
        assert spec_from_config(triton).inputs == (
            TensorSpec(name="IN", datatype="FP32", shape=(2, 2), optional=True),
        )

    def test_unparsable_triton_config_is_an_internal_error(self) -> None:
        spec = TensorModelSpec(inputs=(), outputs=(), triton_model_config=b"\xff\xff")
        card = ModelCard(model="t", context_length=0, kind="tensor", tensor_spec=spec)
        with pytest.raises(InternalError, match="not usable"):
            view_of("t", card)

    def test_tensor_card_without_spec_is_an_internal_error(self) -> None:
        with pytest.raises(InternalError, match="without a tensor spec"):
            view_of("t", ModelCard(model="t", context_length=0, kind="tensor"))

    def test_only_version_one_is_served(self) -> None:
        check_version("m", "")
        check_version("m", "1")
        with pytest.raises(NotFound, match="no version `2`"):
            check_version("m", "2")


class TestTextRequests:
    """``text_input``, ``streaming`` and the sampling knobs of an LLM request."""

    def test_prompt_and_parameters(self) -> None:
        parsed = text_request(llm_request(PROMPT, max_tokens=5, temperature=0.5, other=1))
        assert (parsed.prompt, parsed.streaming) == ("Hello", None)
        assert parsed.fields == {"max_tokens": 5, "temperature": 0.5}

    def test_routing_parameters_pin_workers_as_nvext_does(self) -> None:
        parsed = text_request(
            llm_request(
                PROMPT, max_tokens=5, prefill_worker_id="p1", decode_worker_id="d1", dp_rank=1
            )
        )
        assert parsed.fields == {
            "max_tokens": 5,
            "nvext": {"prefill_worker_id": "p1", "decode_worker_id": "d1", "dp_rank": 1},
        }
        request = completion_from({**parsed.fields, "model": "m", "prompt": parsed.prompt})
        preprocess = completion_to_preprocess(request, request_id="r", reply_to="g", created=0)
        assert preprocess.worker_id == "d1"
        assert preprocess.routing is not None
        assert (preprocess.routing.prefill_worker_id, preprocess.routing.dp_rank) == ("p1", 1)

    def test_a_one_by_one_prompt_is_one_prompt(self) -> None:
        parsed = text_request(llm_request(("text_input", "BYTES", [1, 1], join_bytes([b"Hi"]))))
        assert parsed.prompt == "Hi"

    def test_streaming_flag(self) -> None:
        flag = ("streaming", "BOOL", [1], b"\x01")
        assert text_request(llm_request(PROMPT, flag)).streaming is True

    def test_an_input_wins_over_a_parameter(self) -> None:
        tokens = ("max_tokens", "INT32", [1], struct.pack("<i", 9))
        stop = ("stop", "BYTES", [2], join_bytes([b"a", b"b"]))
        parsed = text_request(llm_request(PROMPT, tokens, stop, max_tokens=5))
        assert parsed.fields == {"max_tokens": 9, "stop": ["a", "b"]}

    def test_missing_text_input_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="`text_input` is required") as caught:
            text_request(llm_request())
        assert caught.value.param == "text_input"

    def test_text_input_must_be_bytes(self) -> None:
        with pytest.raises(InvalidRequest, match="must be BYTES, not INT32"):
            text_request(llm_request(("text_input", "INT32", [1], struct.pack("<i", 1))))

    def test_several_prompts_are_refused(self) -> None:
        two = ("text_input", "BYTES", [2], join_bytes([b"a", b"b"]))
        with pytest.raises(InvalidRequest, match="one prompt"):
            text_request(llm_request(two))

    def test_unknown_input_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="Unknown input `extra`"):
            text_request(llm_request(PROMPT, ("extra", "BOOL", [1], b"\x00")))

    def test_prompt_must_be_utf8(self) -> None:
        with pytest.raises(InvalidRequest, match="not UTF-8"):
            text_request(llm_request(("text_input", "BYTES", [1], join_bytes([b"\xff"]))))

    def test_unknown_requested_output_is_invalid(self) -> None:
        request = llm_request(PROMPT)
        request.outputs.add(name="logits")
        with pytest.raises(InvalidRequest, match="Unknown output `logits`"):
            text_request(request)

    def test_requested_outputs_are_kept(self) -> None:
        request = llm_request(PROMPT)
        request.outputs.add(name="text_output")
        assert requested_outputs(request, LLM_SPEC) == {"text_output"}


class TestTensorChecks:
    """Inputs against a tensor model's spec: names, datatypes, shapes (-1 = any)."""

    def test_matching_inputs_pass(self) -> None:
        check_inputs([Tensor(name="IN", datatype="FP32", shape=(3, 4))], SPEC)

    def test_unknown_input(self) -> None:
        with pytest.raises(InvalidRequest, match="Unknown input `X`"):
            check_inputs([Tensor(name="X", datatype="FP32", shape=(1, 4))], SPEC)

    def test_wrong_datatype(self) -> None:
        with pytest.raises(InvalidRequest, match="must be FP32, not FP64"):
            check_inputs([Tensor(name="IN", datatype="FP64", shape=(1, 4))], SPEC)

    def test_wrong_shape(self) -> None:
        with pytest.raises(InvalidRequest, match=r"shape \[1, 5\]"):
            check_inputs([Tensor(name="IN", datatype="FP32", shape=(1, 5))], SPEC)

    def test_input_given_twice(self) -> None:
        same = Tensor(name="IN", datatype="FP32", shape=(1, 4))
        with pytest.raises(InvalidRequest, match="given twice"):
            check_inputs([same, same], SPEC)

    def test_required_input_missing(self) -> None:
        with pytest.raises(InvalidRequest, match="`IN` is required"):
            check_inputs([Tensor(name="MASK", datatype="BOOL", shape=(4,))], SPEC)

    def test_shape_rules(self) -> None:
        assert shape_fits((2, 4), (-1, 4))
        assert not shape_fits((4,), (-1, 4))
        assert not shape_fits((2, 3), (-1, 4))
