"""The KServe v2 tensor codec: raw and typed contents, sizes, parameters, response encoding,
and the size check of a worker's outputs."""

from __future__ import annotations

import struct

import pytest

from services.gateway.apis.kserve import (
    check_output,
    datatype_of_config,
    fill_tensors,
    fill_text,
    input_raw,
    input_values,
    join_bytes,
    parameters_of,
    raw_contents,
    request_tensors,
    set_parameter,
    split_bytes,
    stream_error,
)
from shared.errors import InternalError, InvalidRequest
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import model_config_pb2 as mc
from shared.messages import Tensor

Input = pb.ModelInferRequest.InferInputTensor


def tensor(name: str, datatype: str, shape: list[int], **typed: list[object]) -> Input:
    found = Input(name=name, datatype=datatype, shape=shape)
    for field, values in typed.items():
        getattr(found.contents, field).extend(values)
    return found


class TestRawContents:
    """Row-major little-endian raw contents, read per datatype and checked against the shape."""

    def test_int32_values(self) -> None:
        raw = struct.pack("<3i", 1, -2, 3)
        assert input_values(tensor("x", "INT32", [3]), raw) == [1, -2, 3]

    def test_fp32_values(self) -> None:
        raw = struct.pack("<2f", 0.5, -1.25)
        assert input_values(tensor("x", "FP32", [1, 2]), raw) == [0.5, -1.25]

    def test_bool_values(self) -> None:
        assert input_values(tensor("x", "BOOL", [2]), b"\x01\x00") == [True, False]

    def test_bytes_values_are_length_prefixed(self) -> None:
        raw = join_bytes([b"ab", b"", b"xyz"])
        assert raw == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00xyz"
        assert input_values(tensor("x", "BYTES", [3]), raw) == [b"ab", b"", b"xyz"]

    def test_wrong_byte_size_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match=r"4 bytes of raw contents; .* need 8") as caught:
            input_values(tensor("x", "INT32", [2]), struct.pack("<i", 1))
        assert caught.value.param == "x"

    def test_bytes_count_must_match_the_shape(self) -> None:
        with pytest.raises(InvalidRequest, match="holds 1 BYTES elements; its shape says 2"):
            input_raw(tensor("x", "BYTES", [2]), join_bytes([b"a"]))

    def test_truncated_bytes_element_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="overruns"):
            split_bytes(b"\x05\x00\x00\x00ab", 1, "x")
        with pytest.raises(InvalidRequest, match="truncated"):
            split_bytes(b"\x05\x00", 1, "x")

    def test_negative_dimension_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="negative dimension"):
            input_raw(tensor("x", "INT32", [-1]), b"")

    def test_unknown_datatype_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="unknown datatype `INT128`"):
            input_raw(tensor("x", "INT128", [1]), b"\x00")

    def test_fp16_raw_is_passed_through(self) -> None:
        raw = struct.pack("<2e", 1.0, 2.0)
        assert input_raw(tensor("x", "FP16", [2]), raw) == raw


class TestTypedContents:
    """Typed ``contents`` are read as values, and turned into the same raw bytes."""

    def test_int32_typed_to_raw(self) -> None:
        typed = tensor("x", "INT32", [3], int_contents=[1, -2, 3])
        assert input_raw(typed, None) == struct.pack("<3i", 1, -2, 3)

    def test_fp32_typed_to_raw(self) -> None:
        typed = tensor("x", "FP32", [2], fp32_contents=[0.5, 2.0])
        assert input_raw(typed, None) == struct.pack("<2f", 0.5, 2.0)

    def test_bool_typed_to_raw(self) -> None:
        assert input_raw(tensor("x", "BOOL", [2], bool_contents=[True, False]), None) == b"\1\0"

    def test_bytes_typed_to_raw(self) -> None:
        typed = tensor("x", "BYTES", [2], bytes_contents=[b"hi", b"there"])
        assert input_raw(typed, None) == join_bytes([b"hi", b"there"])
        assert input_values(typed, None) == [b"hi", b"there"]

    def test_element_count_must_match_the_shape(self) -> None:
        with pytest.raises(InvalidRequest, match="2 elements of contents; its shape says 3"):
            input_values(tensor("x", "INT64", [3], int64_contents=[1, 2]), None)

    def test_out_of_range_value_is_invalid(self) -> None:
        with pytest.raises(InvalidRequest, match="Input `x`"):
            input_raw(tensor("x", "INT8", [1], int_contents=[300]), None)

    def test_fp16_has_no_typed_field(self) -> None:
        with pytest.raises(InvalidRequest, match="needs `raw_input_contents`"):
            input_raw(tensor("x", "FP16", [1]), None)


class TestRequests:
    def test_raw_contents_come_one_per_input(self) -> None:
        request = pb.ModelInferRequest(inputs=[tensor("a", "INT32", [1])])
        request.raw_input_contents.extend([b"1234", b"5678"])
        with pytest.raises(InvalidRequest, match="2 entries for 1 inputs"):
            raw_contents(request)

    def test_raw_and_typed_contents_do_not_mix(self) -> None:
        request = pb.ModelInferRequest(inputs=[tensor("a", "INT32", [1], int_contents=[1])])
        request.raw_input_contents.append(struct.pack("<i", 1))
        with pytest.raises(InvalidRequest, match="typed contents while") as caught:
            raw_contents(request)
        assert caught.value.param == "a"

    def test_request_tensors_are_raw_with_their_parameters(self) -> None:
        request = pb.ModelInferRequest(inputs=[tensor("a", "INT32", [2], int_contents=[7, 8])])
        request.inputs[0].parameters["note"].string_param = "n"
        assert request_tensors(request) == (
            Tensor(
                name="a",
                datatype="INT32",
                shape=(2,),
                data=struct.pack("<2i", 7, 8),
                parameters={"note": "n"},
            ),
        )


class TestParameters:
    def test_every_kind_round_trips(self) -> None:
        request = pb.ModelInferRequest()
        values = {"b": True, "i": -3, "u": 2**63, "f": 0.25, "s": "x"}
        for key, value in values.items():
            set_parameter(request.parameters[key], value)
        assert request.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
        assert parameters_of(request.parameters) == values


class TestResponses:
    def test_text_response_uses_raw_bytes_outputs(self) -> None:
        response = pb.ModelInferResponse()
        fill_text(
            response,
            model="m",
            request_id="r1",
            text=b"Hello",
            finish_reason="stop",
            final=True,
        )
        assert (response.model_name, response.model_version, response.id) == ("m", "1", "r1")
        assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
            ("text_output", "BYTES", [1]),
            ("finish_reason", "BYTES", [1]),
        ]
        assert list(response.raw_output_contents) == [join_bytes([b"Hello"]), join_bytes([b"stop"])]
        assert response.parameters["triton_final_response"].bool_param

    def test_partial_stream_response_has_no_finish_and_says_it_is_not_final(self) -> None:
        response = pb.ModelInferResponse()
        fill_text(response, model="m", request_id="", text=b"He", final=False)
        assert [o.name for o in response.outputs] == ["text_output"]
        assert "triton_final_response" in response.parameters
        assert not response.parameters["triton_final_response"].bool_param

    def test_unary_response_has_no_stream_parameter(self) -> None:
        response = pb.ModelInferResponse()
        fill_text(response, model="m", request_id="", text=b"Hi", finish_reason="stop")
        assert "triton_final_response" not in response.parameters

    def test_text_response_keeps_only_the_wanted_outputs(self) -> None:
        response = pb.ModelInferResponse()
        fill_text(
            response,
            model="m",
            request_id="",
            text=b"x",
            finish_reason="length",
            wanted=frozenset({"finish_reason"}),
        )
        assert [o.name for o in response.outputs] == ["finish_reason"]

    def test_tensor_response_carries_raw_outputs(self) -> None:
        response = pb.ModelInferResponse()
        out = Tensor(name="o", datatype="FP32", shape=(1,), data=struct.pack("<f", 1.5))
        fill_tensors(response, model="m", request_id="r", outputs=[out], parameters={"k": 1})
        assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [
            ("o", "FP32", [1])
        ]
        assert list(response.raw_output_contents) == [struct.pack("<f", 1.5)]
        assert response.parameters["k"].int64_param == 1

    def test_stream_error_names_the_request(self) -> None:
        error = stream_error("boom", model="m", request_id="r9")
        assert (error.error_message, error.infer_response.id) == ("boom", "r9")


class TestWorkerOutputs:
    """A worker's output must hold what its shape and datatype say, or the call is INTERNAL."""

    @pytest.mark.parametrize(
        "output",
        [
            Tensor(name="o", datatype="FP32", shape=(4,), data=struct.pack("<4f", 1, 2, 3, 4)),
            Tensor(name="o", datatype="INT64", shape=(2, 3), data=bytes(48)),
            Tensor(name="o", datatype="BF16", shape=(3,), data=bytes(6)),
            Tensor(name="o", datatype="BOOL", shape=(0,), data=b""),
            Tensor(name="o", datatype="BYTES", shape=(3,), data=join_bytes([b"ab", b"", b"c"])),
            Tensor(name="o", datatype="BYTES", shape=(2, 0), data=b""),
        ],
        ids=["fp32", "int64-2d", "bf16", "empty", "bytes", "bytes-empty"],
    )
    def test_a_well_sized_output_passes(self, output: Tensor) -> None:
        check_output(output)

    def test_fp32_with_no_bytes_for_its_shape_names_the_output(self) -> None:
        output = Tensor(name="OUTPUT0", datatype="FP32", shape=(4,), data=b"")
        with pytest.raises(
            InternalError, match=r"`OUTPUT0` \(FP32, shape \[4\]\) has 0 bytes; .* 16"
        ):
            check_output(output)

    @pytest.mark.parametrize(
        ("output", "problem"),
        [
            (Tensor(name="x", datatype="INT32", shape=(2,), data=bytes(12)), "has 12 bytes"),
            (Tensor(name="x", datatype="FP9", shape=(1,), data=bytes(1)), "unknown datatype"),
            (Tensor(name="x", datatype="INT8", shape=(-1,), data=b""), "negative dimension"),
            (Tensor(name="x", datatype="BYTES", shape=(1,), data=b"\x05\x00\x00\x00ab"), "cover"),
            (Tensor(name="x", datatype="BYTES", shape=(1,), data=b"\x01\x00"), "cover"),
            (
                Tensor(name="x", datatype="BYTES", shape=(1,), data=join_bytes([b"a"]) + b"\x00"),
                "cover",
            ),
            (
                Tensor(name="x", datatype="BYTES", shape=(3,), data=join_bytes([b"a", b"b"])),
                "holds 2 BYTES elements",
            ),
        ],
        ids=["short-int32", "datatype", "negative", "overrun", "cut-prefix", "trailing", "count"],
    )
    def test_a_badly_sized_output_is_internal_naming_it(self, output: Tensor, problem: str) -> None:
        with pytest.raises(InternalError, match=problem) as caught:
            check_output(output)
        assert "`x`" in caught.value.message


def test_config_datatypes_map_to_kserve_names() -> None:
    assert datatype_of_config(mc.TYPE_STRING) == "BYTES"
    assert datatype_of_config(mc.TYPE_FP16) == "FP16"
    with pytest.raises(ValueError, match="no KServe datatype"):
        datatype_of_config(mc.TYPE_INVALID)
