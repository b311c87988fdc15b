"""Our KServe v2 / Triton protocol matches the copy tritonclient ships: stock clients interoperate.

tritonclient.grpc registers the same ``inference.*`` names in protobuf's default descriptor pool
as shared.kserve does, so one process cannot import both: its side runs in a subprocess.
"""

import base64
import json
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format
from google.protobuf.message import Message

from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import model_config_pb2 as mc

SERVICE = ".inference.GRPCInferenceService"
SERVED = {
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelConfig",
}
# Fields of tritonclient's messages we do not declare (see the comments in proto/).
LEFT_OUT = {
    ".inference.ModelConfig": {"sequence_batching", "model_repository_agents", "model_metrics"},
    ".inference.ModelInstanceGroup": {"rate_limiter", "secondary_devices"},
    ".inference.ModelOptimizationPolicy": {"cuda", "execution_accelerators"},
}
FIELD_ATTRS = ("number", "label", "type", "type_name", "proto3_optional")


def _tritonclient(script: str, data: bytes = b"") -> bytes:
    """Run ``script`` in a fresh interpreter, free to import tritonclient; stdin → stdout."""
    run = [sys.executable, "-c", textwrap.dedent(script)]
    result = subprocess.run(run, input=data, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


@dataclass
class ProtoFiles:
    """Every message, enum and service of a set of .proto files, by full name (".inference.X")."""

    packages: set[tuple[str, str]] = field(default_factory=set)
    messages: dict[str, descriptor_pb2.DescriptorProto] = field(default_factory=dict)
    enums: dict[str, descriptor_pb2.EnumDescriptorProto] = field(default_factory=dict)
    services: dict[str, descriptor_pb2.ServiceDescriptorProto] = field(default_factory=dict)

    @classmethod
    def of(cls, serialized_files: list[bytes]) -> "ProtoFiles":
        protocol = cls()
        for data in serialized_files:
            file = descriptor_pb2.FileDescriptorProto.FromString(data)
            protocol.packages.add((file.package, file.syntax))
            scope = f".{file.package}"
            for message in file.message_type:
                protocol._add_message(scope, message)
            for enum in file.enum_type:
                protocol.enums[f"{scope}.{enum.name}"] = enum
            for service in file.service:
                protocol.services[f"{scope}.{service.name}"] = service
        return protocol

    def _add_message(self, scope: str, message: descriptor_pb2.DescriptorProto) -> None:
        name = f"{scope}.{message.name}"
        self.messages[name] = message
        for nested in message.nested_type:
            self._add_message(name, nested)
        for enum in message.enum_type:
            self.enums[f"{name}.{enum.name}"] = enum


@pytest.fixture(scope="module")
def ours() -> ProtoFiles:
    return ProtoFiles.of([mc.DESCRIPTOR.serialized_pb, pb.DESCRIPTOR.serialized_pb])


@pytest.fixture(scope="module")
def theirs() -> ProtoFiles:
    files = descriptor_pb2.FileDescriptorSet.FromString(
        _tritonclient("""
            import sys
            from google.protobuf import descriptor_pb2
            from tritonclient.grpc import model_config_pb2, service_pb2
            files = descriptor_pb2.FileDescriptorSet()
            for module in (model_config_pb2, service_pb2):
                files.file.add().MergeFromString(module.DESCRIPTOR.serialized_pb)
            sys.stdout.buffer.write(files.SerializeToString())
        """)
    )
    return ProtoFiles.of([file.SerializeToString() for file in files.file])


def _oneof(message: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto) -> str:
    return message.oneof_decl[f.oneof_index].name if f.HasField("oneof_index") else ""


def _show(f: descriptor_pb2.FieldDescriptorProto, attr: str) -> str:
    value = getattr(f, attr)
    if attr == "type":
        return descriptor_pb2.FieldDescriptorProto.Type.Name(value)
    if attr == "label":
        return descriptor_pb2.FieldDescriptorProto.Label.Name(value)
    return repr(value)


def _field_mismatches(
    name: str, ours: descriptor_pb2.DescriptorProto, theirs: descriptor_pb2.DescriptorProto
) -> list[str]:
    found = []
    their_fields = {f.name: f for f in theirs.field}
    for f in ours.field:
        their = their_fields.get(f.name)
        if their is None:
            found.append(f"{name}.{f.name}: tritonclient has no such field")
            continue
        found += [
            f"{name}.{f.name}.{attr}: ours {_show(f, attr)}, tritonclient's {_show(their, attr)}"
            for attr in FIELD_ATTRS
            if getattr(f, attr) != getattr(their, attr)
        ]
        if _oneof(ours, f) != _oneof(theirs, their):
            found.append(f"{name}.{f.name}: oneof {_oneof(ours, f)!r} != {_oneof(theirs, their)!r}")
    if ours.options.map_entry != theirs.options.map_entry:
        found.append(f"{name}: map_entry differs")
    return found


def test_both_are_proto3_package_inference(ours: ProtoFiles, theirs: ProtoFiles) -> None:
    assert ours.packages == theirs.packages == {("inference", "proto3")}


def test_every_field_we_define_has_their_number_type_and_label(
    ours: ProtoFiles, theirs: ProtoFiles
) -> None:
    mismatches = []
    for name, message in sorted(ours.messages.items()):
        if name in theirs.messages:
            mismatches += _field_mismatches(name, message, theirs.messages[name])
        else:
            mismatches.append(f"{name}: tritonclient has no such message")
    assert not mismatches, "\n".join(mismatches)


def test_every_enum_value_we_define_has_their_number(ours: ProtoFiles, theirs: ProtoFiles) -> None:
    mismatches = []
    for name, enum in sorted(ours.enums.items()):
        if name not in theirs.enums:
            mismatches.append(f"{name}: tritonclient has no such enum")
            continue
        their_values = {v.name: v.number for v in theirs.enums[name].value}
        mismatches += [
            f"{name}.{v.name} = {v.number}: tritonclient has {their_values.get(v.name)}"
            for v in enum.value
            if their_values.get(v.name) != v.number
        ]
    assert not mismatches, "\n".join(mismatches)


def test_we_leave_out_only_the_fields_we_mean_to(ours: ProtoFiles, theirs: ProtoFiles) -> None:
    """A field tritonclient gained, or one we dropped by mistake, shows up here."""
    left_out = {
        name: omitted
        for name, message in ours.messages.items()
        if name in theirs.messages  # a message they lack fails the test above
        and (
            omitted := {f.name for f in theirs.messages[name].field}
            - {f.name for f in message.field}
        )
    }
    assert left_out == LEFT_OUT
    values_left_out = {
        name: omitted
        for name, enum in ours.enums.items()
        if name in theirs.enums
        and (omitted := {v.name for v in theirs.enums[name].value} - {v.name for v in enum.value})
    }
    assert values_left_out == {}


def test_the_service_has_their_name_and_our_rpcs_their_signatures(
    ours: ProtoFiles, theirs: ProtoFiles
) -> None:
    assert set(ours.services) == {SERVICE}
    assert {m.name for m in ours.services[SERVICE].method} == SERVED
    their_methods = {m.name: m for m in theirs.services[SERVICE].method}
    for method in ours.services[SERVICE].method:
        their = their_methods[method.name]
        for attr in ("input_type", "output_type", "client_streaming", "server_streaming"):
            assert getattr(method, attr) == getattr(their, attr), f"{method.name}.{attr}"


def _bytes_element(text: str) -> bytes:
    """One BYTES tensor element in raw form: 4-byte little-endian length, then the bytes."""
    data = text.encode()
    return struct.pack("<I", len(data)) + data


def test_a_request_tritonclient_builds_parses_with_ours() -> None:
    data = _tritonclient("""
        import sys
        import numpy as np
        from tritonclient.grpc import InferInput, InferRequestedOutput
        from tritonclient.grpc._utils import _get_inference_request

        text = InferInput("text_input", [2], "BYTES")
        text.set_data_from_numpy(np.array(["hello", "wörld"], dtype=np.object_))
        ids = InferInput("token_ids", [1, 3], "INT32")
        ids.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.int32))
        request = _get_inference_request(  # what InferenceServerClient.infer() sends
            model_name="qwen", inputs=[text, ids], model_version="", request_id="req-1",
            outputs=[InferRequestedOutput("text_output")], sequence_id=0, sequence_start=False,
            sequence_end=False, priority=0, timeout=None,
            parameters={"max_tokens": 16, "stream": True},
        )
        sys.stdout.buffer.write(request.SerializeToString())
    """)
    request = pb.ModelInferRequest.FromString(data)
    assert (request.model_name, request.id) == ("qwen", "req-1")
    assert [(i.name, i.datatype, list(i.shape)) for i in request.inputs] == [
        ("text_input", "BYTES", [2]),
        ("token_ids", "INT32", [1, 3]),
    ]
    assert list(request.raw_input_contents) == [
        _bytes_element("hello") + _bytes_element("wörld"),
        struct.pack("<3i", 1, 2, 3),
    ]
    assert request.parameters["max_tokens"].int64_param == 16
    assert request.parameters["stream"].WhichOneof("parameter_choice") == "bool_param"
    assert [o.name for o in request.outputs] == ["text_output"]


def _parsed_by_tritonclient(message: Message) -> tuple[dict[str, Any], bytes]:
    """``message`` parsed by tritonclient's class of the same name: as a dict and re-serialized."""
    name = message.DESCRIPTOR.name
    out = _tritonclient(
        f"""
        import base64, json, sys
        from google.protobuf import json_format
        from tritonclient.grpc.service_pb2 import {name}
        message = {name}.FromString(sys.stdin.buffer.read())
        as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
        again = base64.b64encode(message.SerializeToString(deterministic=True)).decode()
        print(json.dumps({{"dict": as_dict, "bytes": again}}))
        """,
        message.SerializeToString(),
    )
    parsed = json.loads(out)
    return parsed["dict"], base64.b64decode(parsed["bytes"])


def test_a_request_built_with_ours_parses_with_tritonclient() -> None:
    request = pb.ModelInferRequest(model_name="qwen", model_version="1", id="req-2")
    request.parameters["max_tokens"].int64_param = 8
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.inputs.add(name="temperature", datatype="FP32", shape=[1])
    request.outputs.add(name="text_output")
    request.raw_input_contents.extend([_bytes_element("hi"), struct.pack("<f", 0.5)])

    as_dict, again = _parsed_by_tritonclient(request)

    assert as_dict == json_format.MessageToDict(request, preserving_proto_field_name=True)
    assert again == request.SerializeToString(deterministic=True)


def test_a_stream_response_built_with_ours_decodes_with_tritonclient() -> None:
    response = pb.ModelInferResponse(model_name="qwen", id="req-3")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[2])
    response.outputs.add(name="logprobs", datatype="FP32", shape=[1, 2])
    response.raw_output_contents.extend(
        [_bytes_element("Hel") + _bytes_element("lo"), struct.pack("<2f", -0.25, -1.5)]
    )
    stream = [
        pb.ModelStreamInferResponse(infer_response=response),
        pb.ModelStreamInferResponse(error_message="model 'nope' is not served"),
    ]
    out = _tritonclient(
        """
        import json, sys
        from tritonclient.grpc import InferResult
        from tritonclient.grpc.service_pb2 import ModelStreamInferResponse

        seen = []
        for line in sys.stdin.buffer.read().split():
            message = ModelStreamInferResponse.FromString(bytes.fromhex(line.decode()))
            if message.error_message:  # as tritonclient's stream reader does
                seen.append({"error": message.error_message})
                continue
            result = InferResult(message.infer_response)
            text = [t.decode() for t in result.as_numpy("text_output").tolist()]
            logprobs = result.as_numpy("logprobs").tolist()
            seen.append({"id": result.get_response().id, "text": text, "logprobs": logprobs})
        print(json.dumps(seen))
        """,
        b"\n".join(m.SerializeToString().hex().encode() for m in stream),
    )
    assert json.loads(out) == [
        {"id": "req-3", "text": ["Hel", "lo"], "logprobs": [[-0.25, -1.5]]},
        {"error": "model 'nope' is not served"},
    ]


def _typical_config() -> mc.ModelConfig:
    """A config as JetServe would report an LLM (the shape Dynamo's KServe front end reports)."""
    config = mc.ModelConfig(name="qwen", platform="dynamo", backend="dynamo", max_batch_size=0)
    config.version_policy.latest.num_versions = 1
    config.input.add(name="text_input", data_type=mc.TYPE_STRING, dims=[1])
    config.input.add(name="streaming", data_type=mc.TYPE_BOOL, dims=[1], optional=True)
    config.output.add(name="text_output", data_type=mc.TYPE_STRING, dims=[-1])
    config.instance_group.add(name="qwen_0", kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    config.dynamic_batching.max_queue_delay_microseconds = 100
    config.optimization.input_pinned_memory.enable = True
    config.model_transaction_policy.decoupled = True
    config.parameters["tokenizer"].string_value = "Qwen/Qwen3-0.6B"
    return config


def test_a_model_config_reads_the_same_in_tritonclient() -> None:
    """get_model_config(as_json=True) shows what we meant to send."""
    response = pb.ModelConfigResponse(config=_typical_config())

    as_dict, _ = _parsed_by_tritonclient(response)

    assert as_dict == json_format.MessageToDict(response, preserving_proto_field_name=True)
    assert as_dict["config"]["input"][0]["data_type"] == "TYPE_STRING"
    assert as_dict["config"]["model_transaction_policy"] == {"decoupled": True}


def test_a_full_triton_config_passes_through_ours_intact() -> None:
    """Fields we leave out survive a parse and re-serialize (a backend's own Triton config)."""
    full = _tritonclient("""
        import sys
        from tritonclient.grpc.model_config_pb2 import ModelConfig
        config = ModelConfig(name="seq", backend="python", max_batch_size=4)
        config.sequence_batching.max_sequence_idle_microseconds = 5000000
        config.model_metrics.metric_control.add().metric_identifier.family = "latency"
        config.instance_group.add(count=2).rate_limiter.priority = 3
        sys.stdout.buffer.write(config.SerializeToString())
    """)
    response = pb.ModelConfigResponse(config=mc.ModelConfig.FromString(full))

    as_dict, _ = _parsed_by_tritonclient(response)

    config = as_dict["config"]
    assert config["sequence_batching"] == {"max_sequence_idle_microseconds": "5000000"}
    assert config["model_metrics"]["metric_control"][0]["metric_identifier"]["family"] == "latency"
    assert config["instance_group"][0] == {"count": 2, "rate_limiter": {"priority": 3}}
