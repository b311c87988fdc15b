"""Issue 26's admission inputs at the gateway: headers, ``nvext.agent_hints`` /
``agent_context`` and gRPC parameters and metadata -> ``RoutingHints``; every bad value a 400
(INVALID_ARGUMENT over gRPC) naming the header or field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from services.gateway.apis.admission_hints import AdmissionReader
from services.gateway.apis.kserve import join_bytes
from services.gateway.apis.openai import (
    NO_HEADERS,
    RoutingHeaders,
    chat_to_preprocess,
    parse_chat,
    routing_headers,
)
from services.gateway.config import GatewayConfig
from services.gateway.core.context import RequestContext
from services.gateway.core.exchange import Exchanges
from services.gateway.core.readiness import Readiness
from services.gateway.grpc.http2.connection import StreamReset
from services.gateway.grpc.infer import Inference
from services.gateway.http.app import create_app
from shared.admission import AdmissionPolicy
from shared.errors import InvalidRequest
from shared.kserve import grpc_service_pb2 as pb
from shared.messages import Preprocess, ResponseChunk, RoutingHints
from tests.unit.gateway.fakes import CHAT, FakeBus

USER = {"role": "user", "content": "hi"}


def policy() -> AdmissionPolicy:
    return msgspec.convert(
        {
            "classes": {"premium": {"weight": 4}, "regular": {}},
            "default_class": "regular",
            "tenants": {"acme": {"class": "premium", "classes": ["regular"]}},
            "api_keys": {"sk-acme": "acme"},
        },
        AdmissionPolicy,
    )


def headers(reader: AdmissionReader | None = None, **named: str) -> RoutingHeaders:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in named.items()]
    return routing_headers(raw, reader or AdmissionReader())


def chat(routing: RoutingHeaders = NO_HEADERS, **fields: Any) -> Preprocess:
    body = msgspec.json.encode({"model": "m", "messages": [USER], **fields})
    return chat_to_preprocess(
        parse_chat(body), request_id="r1", reply_to="gw.r1", created=7, headers=routing
    )


def hints_of(routing: RoutingHeaders = NO_HEADERS, **fields: Any) -> RoutingHints | None:
    return chat(routing, **fields).routing


def error(routing: RoutingHeaders | None = None, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        chat(routing or NO_HEADERS, **fields)
    return caught.value


class TestHeaders:
    def test_no_admission_input_builds_no_hints(self) -> None:
        assert headers() is NO_HEADERS
        assert hints_of() is None

    def test_priority_header_sets_seconds_ahead(self) -> None:
        routing = headers(x_dynamo_request_priority="2.5")
        assert hints_of(routing) == RoutingHints(priority=2.5)

    def test_negative_priority_waits_longer(self) -> None:
        assert hints_of(headers(x_dynamo_request_priority="-30")) == RoutingHints(priority=-30.0)

    def test_strict_priority_header_sets_the_tier(self) -> None:
        routing = headers(x_dynamo_request_strict_priority="7")
        assert hints_of(routing) == RoutingHints(strict_priority=7)

    def test_dynamo_session_header_sets_the_session(self) -> None:
        routing = headers(x_dynamo_session_id="run-42:researcher")
        assert hints_of(routing) == RoutingHints(session_id="run-42:researcher")

    @pytest.mark.parametrize(
        "header", ["x-claude-code-session-id", "x-session-id", "x-agent-session-id"]
    )
    def test_agent_session_headers_set_the_session(self, header: str) -> None:
        routing = routing_headers([(header.encode(), b"s1")])
        assert hints_of(routing) == RoutingHints(session_id="s1")

    def test_dynamo_session_header_wins_over_an_agent_one(self) -> None:
        routing = routing_headers([(b"x-session-id", b"agent"), (b"x-dynamo-session-id", b"dyn")])
        assert hints_of(routing) == RoutingHints(session_id="dyn")

    @pytest.mark.parametrize(
        ("header", "value"),
        [
            ("x-dynamo-request-priority", "soon"),
            ("x-dynamo-request-priority", "nan"),
            ("x-dynamo-request-priority", "inf"),
            ("x-dynamo-request-priority", "3600.5"),
            ("x-dynamo-request-priority", "-1e9"),
            ("x-dynamo-request-priority", "1" * 100),
            ("x-dynamo-request-priority", ""),
            ("x-dynamo-request-strict-priority", "-1"),
            ("x-dynamo-request-strict-priority", "101"),
            ("x-dynamo-request-strict-priority", "1.5"),
            ("x-dynamo-request-strict-priority", "high"),
            ("x-dynamo-request-strict-priority", "0" * 20),
            ("x-dynamo-session-id", "has space"),
            ("x-dynamo-session-id", "x" * 257),
            ("x-session-id", "caf\xe9"),
            ("x-dynamo-meta-policy-class", "gold"),
        ],
    )
    def test_a_bad_header_is_invalid_naming_it(self, header: str, value: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            routing_headers([(header.encode(), value.encode("latin-1"))])
        assert caught.value.param == header

    def test_without_a_policy_file_the_default_class_header_changes_nothing(self) -> None:
        routing = headers(x_dynamo_meta_policy_class="default")
        assert hints_of(routing) is None


class TestBody:
    def test_agent_hints_become_routing_hints(self) -> None:
        nvext = {
            "agent_hints": {
                "priority": 3,
                "strict_priority": 2,
                "osl": 128,
                "speculative_prefill": True,
            },
            "agent_context": {"session_id": "s-1"},
        }
        assert hints_of(nvext=nvext) == RoutingHints(
            priority=3.0, strict_priority=2, osl=128, speculative_prefill=True, session_id="s-1"
        )

    def test_latency_sensitivity_stands_in_for_priority(self) -> None:
        assert hints_of(nvext={"agent_hints": {"latency_sensitivity": 1.5}}) == RoutingHints(
            priority=1.5
        )

    def test_unknown_agent_keys_are_ignored(self) -> None:
        assert hints_of(nvext={"agent_hints": {"iat": 3}, "agent_context": {"x": 1}}) is None

    @pytest.mark.parametrize(
        ("nvext", "param"),
        [
            ({"agent_hints": {"priority": 3601}}, "nvext.agent_hints.priority"),
            ({"agent_hints": {"priority": "1"}}, "nvext.agent_hints.priority"),
            ({"agent_hints": {"strict_priority": -1}}, "nvext.agent_hints.strict_priority"),
            ({"agent_hints": {"strict_priority": 101}}, "nvext.agent_hints.strict_priority"),
            ({"agent_hints": {"strict_priority": 1.5}}, "nvext.agent_hints.strict_priority"),
            ({"agent_hints": {"osl": 0}}, "nvext.agent_hints.osl"),
            ({"agent_hints": {"osl": 10_000_001}}, "nvext.agent_hints.osl"),
            (
                {"agent_hints": {"speculative_prefill": "yes"}},
                "nvext.agent_hints.speculative_prefill",
            ),
            ({"agent_context": {"session_id": ""}}, "nvext.agent_context.session_id"),
            ({"agent_context": {"session_id": "a b"}}, "nvext.agent_context.session_id"),
            ({"agent_context": {"session_id": "ab\n"}}, "nvext.agent_context.session_id"),
            ({"agent_context": {"session_id": "x" * 257}}, "nvext.agent_context.session_id"),
        ],
    )
    def test_a_bad_field_is_invalid_naming_it(self, nvext: dict[str, Any], param: str) -> None:
        assert error(nvext=nvext).param == param

    def test_an_infinite_priority_is_invalid(self) -> None:
        body = b'{"model": "m", "messages": [], "nvext": {"agent_hints": {"priority": 1e999}}}'
        with pytest.raises(InvalidRequest) as caught:
            parse_chat(body)
        assert caught.value.param == "nvext.agent_hints.priority"


class TestHeaderAndBody:
    def test_agreeing_header_and_body_are_fine(self) -> None:
        routing = headers(x_dynamo_request_priority="2", x_dynamo_session_id="s")
        nvext = {"agent_hints": {"priority": 2}, "agent_context": {"session_id": "s"}}
        assert hints_of(routing, nvext=nvext) == RoutingHints(priority=2.0, session_id="s")

    @pytest.mark.parametrize(
        ("named", "nvext", "param"),
        [
            (
                {"x_dynamo_request_priority": "1"},
                {"agent_hints": {"priority": 2}},
                "nvext.agent_hints.priority",
            ),
            (
                {"x_dynamo_request_strict_priority": "1"},
                {"agent_hints": {"strict_priority": 2}},
                "nvext.agent_hints.strict_priority",
            ),
            (
                {"x_session_id": "a"},
                {"agent_context": {"session_id": "b"}},
                "nvext.agent_context.session_id",
            ),
        ],
    )
    def test_disagreeing_header_and_body_are_invalid(
        self, named: dict[str, str], nvext: dict[str, Any], param: str
    ) -> None:
        failure = error(headers(**named), nvext=nvext)
        assert failure.param == param
        assert "disagree" in failure.message


class TestPolicy:
    def test_with_a_policy_every_request_gets_its_default_class(self) -> None:
        reader = AdmissionReader(policy())
        assert hints_of(headers(reader)) == RoutingHints(policy_class="regular")

    def test_the_api_keys_tenant_and_its_class(self) -> None:
        reader = AdmissionReader(policy())
        routing = headers(reader, authorization="Bearer sk-acme")
        assert hints_of(routing) == RoutingHints(policy_class="premium", tenant="acme")

    def test_x_api_key_counts_as_the_key(self) -> None:
        reader = AdmissionReader(policy())
        routing = headers(reader, x_api_key="sk-acme")
        assert hints_of(routing) == RoutingHints(policy_class="premium", tenant="acme")

    def test_the_api_keys_tenant_wins_over_the_tenant_header(self) -> None:
        reader = AdmissionReader(policy())
        routing = headers(reader, authorization="Bearer sk-acme", x_tenant_id="other")
        hints = hints_of(routing)
        assert hints is not None
        assert (hints.tenant, hints.policy_class) == ("acme", "premium")

    def test_an_unknown_key_falls_back_to_the_tenant_header(self) -> None:
        reader = AdmissionReader(policy())
        routing = headers(reader, authorization="Bearer sk-other", x_tenant_id="t9")
        hints = hints_of(routing)
        assert hints is not None
        assert (hints.tenant, hints.policy_class) == ("t9", "regular")

    def test_a_tenant_may_pick_an_allowed_class(self) -> None:
        reader = AdmissionReader(policy())
        routing = headers(
            reader, authorization="Bearer sk-acme", x_dynamo_meta_policy_class="regular"
        )
        hints = hints_of(routing)
        assert hints is not None
        assert hints.policy_class == "regular"

    def test_a_class_the_client_may_not_pick_is_invalid_naming_the_header(self) -> None:
        reader = AdmissionReader(policy())
        with pytest.raises(InvalidRequest) as caught:
            headers(reader, x_dynamo_meta_policy_class="premium")
        assert caught.value.param == "x-dynamo-meta-policy-class"


# --- the HTTP edge --------------------------------------------------------------------------------


@pytest.fixture
def bus() -> FakeBus:
    return FakeBus()


@pytest.fixture
async def http(bus: FakeBus) -> AsyncIterator[AsyncTestClient[Any]]:
    config = GatewayConfig(
        request_timeout_s=0.2, stream_idle_timeout_s=0.2, gateway_id="gw", retry_budget_s=0
    )
    async with AsyncTestClient(create_app(config, bus=bus)) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": "m", "prompt": "hi"}),
        ("/v1/responses", {"model": "m", "input": "hi"}),
    ],
)
async def test_a_bad_priority_header_is_a_400_naming_it(
    http: AsyncTestClient[Any], bus: FakeBus, path: str, body: dict[str, Any]
) -> None:
    response = await http.post(path, json=body, headers={"x-dynamo-request-priority": "x"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "x-dynamo-request-priority")
    assert bus.submitted == []


async def test_anthropic_messages_answer_a_bad_header_in_their_shape(
    http: AsyncTestClient[Any], bus: FakeBus
) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [USER]}
    response = await http.post(
        "/v1/messages", json=body, headers={"x-dynamo-request-strict-priority": "1000"}
    )
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["error"]["type"] == "invalid_request_error"
    assert "x-dynamo-request-strict-priority" in payload["error"]["message"]
    assert bus.submitted == []


async def test_a_good_header_reaches_the_bus(http: AsyncTestClient[Any], bus: FakeBus) -> None:
    bus.script = [_done()]
    await http.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"x-dynamo-request-priority": "5", "x-dynamo-session-id": "s1"},
    )
    assert bus.submitted[0].routing == RoutingHints(priority=5.0, session_id="s1")


async def test_a_policy_file_resolves_class_and_tenant_at_the_edge(
    bus: FakeBus, tmp_path: Path
) -> None:
    path = tmp_path / "admission.yaml"
    path.write_text(
        "default_class: regular\nclasses: {premium: {weight: 4}, regular: {}}\n"
        "tenants: {acme: {class: premium}}\napi_keys: {sk-acme: acme}\n"
    )
    config = GatewayConfig(
        request_timeout_s=0.2,
        stream_idle_timeout_s=0.2,
        gateway_id="gw",
        retry_budget_s=0,
        admission_config=path,
    )
    bus.script = [_done()]
    async with AsyncTestClient(create_app(config, bus=bus)) as client:
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-api-key": "sk-acme"})
    assert bus.submitted[0].routing == RoutingHints(policy_class="premium", tenant="acme")


def _done() -> ResponseChunk:
    return ResponseChunk(request_id="", data=b'{"id":"x"}', done=True, finish_reason="stop")


# --- gRPC -----------------------------------------------------------------------------------------


def _inference(bus: FakeBus, reader: AdmissionReader | None = None) -> Inference:
    exchanges = Exchanges(bus, first_timeout_s=0.5, idle_timeout_s=0.5, client_gone=(StreamReset,))
    return Inference(exchanges, Readiness(), reader or AdmissionReader())


def _llm(**parameters: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="c1")
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(join_bytes([b"Hi"]))
    for key, value in parameters.items():
        param = request.parameters[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = value
    return request


def _ctx() -> RequestContext:
    return RequestContext("r1", "grpc", "ModelInfer")


async def test_grpc_parameters_become_routing_hints() -> None:
    bus = FakeBus()
    bus.script = [_done()]
    request = _llm(
        priority=1.5, strict_priority=3, osl=64, speculative_prefill=True, session_id="s"
    )
    await _inference(bus).run(request, _ctx())
    assert bus.submitted[0].routing == RoutingHints(
        priority=1.5, strict_priority=3, osl=64, speculative_prefill=True, session_id="s"
    )


@pytest.mark.parametrize(
    ("parameters", "param"),
    [
        ({"priority": 1e9}, "nvext.agent_hints.priority"),
        ({"strict_priority": 500}, "nvext.agent_hints.strict_priority"),
        ({"strict_priority": 1.5}, "nvext.agent_hints.strict_priority"),
        ({"osl": 0}, "nvext.agent_hints.osl"),
        ({"speculative_prefill": "yes"}, "nvext.agent_hints.speculative_prefill"),
        ({"session_id": "a b"}, "nvext.agent_context.session_id"),
    ],
)
async def test_a_bad_grpc_parameter_is_invalid_naming_it(
    parameters: dict[str, Any], param: str
) -> None:
    bus = FakeBus()
    with pytest.raises(InvalidRequest) as caught:
        await _inference(bus).run(_llm(**parameters), _ctx())
    assert caught.value.param == param
    assert bus.submitted == []


async def test_grpc_metadata_is_read_as_headers() -> None:
    bus = FakeBus()
    bus.script = [_done()]
    metadata = (("x-dynamo-request-priority", "4"), ("authorization", "Bearer sk-acme"))
    await _inference(bus, AdmissionReader(policy())).run(_llm(), _ctx(), metadata=metadata)
    assert bus.submitted[0].routing == RoutingHints(
        priority=4.0, policy_class="premium", tenant="acme"
    )


async def test_a_bad_metadata_header_is_invalid_naming_it() -> None:
    with pytest.raises(InvalidRequest) as caught:
        await _inference(FakeBus()).run(
            _llm(), _ctx(), metadata=(("x-dynamo-request-strict-priority", "x"),)
        )
    assert caught.value.param == "x-dynamo-request-strict-priority"


async def test_grpc_parameter_and_metadata_must_agree() -> None:
    with pytest.raises(InvalidRequest, match="disagree"):
        await _inference(FakeBus()).run(
            _llm(priority=1.0), _ctx(), metadata=(("x-dynamo-request-priority", "2"),)
        )
