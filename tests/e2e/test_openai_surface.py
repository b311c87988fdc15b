"""The OpenAI request surface as the official ``openai`` SDK sees it, for what the gateway alone
decides: validation errors (tools, tool_choice, response_format, logprobs, best_of, unknown
fields), the accepted-but-ignored fields, ``x-request-id``, the body limit, the documents.

A gateway process on a real nats-server with no model behind it: a request that passes
validation ends as a 404 ``model_not_found``, one that does not as a 400 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.gateway_only import UNKNOWN_MODEL, GatewayProcess, gateway_process

USER: list[Any] = [{"role": "user", "content": "hi"}]
TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path_factory.mktemp("surface")) as process:
        yield process


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=30
    ) as c:
        yield c


def error_of(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert {"message", "type", "code", "param"} <= set(error)
    return error


def refused(client: openai.OpenAI, **fields: Any) -> dict[str, Any]:
    """The 400 error object of a chat request."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**{"model": UNKNOWN_MODEL, "messages": USER, **fields})
    return error_of(caught.value)


def passes_validation(client: openai.OpenAI, **fields: Any) -> None:
    """The chat request is valid: it gets as far as the model lookup (404)."""
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(**{"model": UNKNOWN_MODEL, "messages": USER, **fields})
    assert error_of(caught.value)["code"] == "model_not_found"


class TestTools:
    def test_a_valid_tool_request_passes(self, client: openai.OpenAI) -> None:
        passes_validation(client, tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
        named = {"type": "function", "function": {"name": "get_weather"}}
        passes_validation(client, tools=[TOOL], tool_choice=named)

    def test_bad_function_name(self, client: openai.OpenAI) -> None:
        bad = {"type": "function", "function": {"name": "get weather!"}}
        assert refused(client, tools=[bad])["param"] == "tools[0].function.name"

    def test_required_without_tools(self, client: openai.OpenAI) -> None:
        error = refused(client, tool_choice="required")
        assert (error["param"], error["type"]) == ("tool_choice", "invalid_request_error")

    def test_named_function_not_among_the_tools(self, client: openai.OpenAI) -> None:
        named = {"type": "function", "function": {"name": "launch_rocket"}}
        error = refused(client, tools=[TOOL], tool_choice=named)
        assert error["param"] == "tool_choice"
        assert "launch_rocket" in error["message"]


class TestResponseFormat:
    def test_json_schema_and_json_object_pass(self, client: openai.OpenAI) -> None:
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
        fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        passes_validation(client, response_format=fmt)
        passes_validation(client, response_format={"type": "json_object"})

    def test_json_schema_without_a_name(self, client: openai.OpenAI) -> None:
        fmt = {"type": "json_schema", "json_schema": {"schema": {}}}
        assert refused(client, response_format=fmt)["param"] == "response_format.json_schema.name"

    def test_unknown_format_type(self, client: openai.OpenAI) -> None:
        assert refused(client, response_format={"type": "xml"})["param"] == "response_format.type"


class TestChoicesAndLogprobs:
    def test_n_and_logprobs_pass(self, client: openai.OpenAI) -> None:
        passes_validation(client, n=3, logprobs=True, top_logprobs=5, stream=False)

    def test_top_logprobs_without_logprobs(self, client: openai.OpenAI) -> None:
        assert refused(client, top_logprobs=3)["param"] == "top_logprobs"

    def test_top_logprobs_above_20(self, client: openai.OpenAI) -> None:
        assert refused(client, logprobs=True, top_logprobs=21)["param"] == "top_logprobs"

    def test_n_above_128(self, client: openai.OpenAI) -> None:
        assert refused(client, n=129)["param"] == "n"

    def test_completion_logprobs_above_5(self, client: openai.OpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=UNKNOWN_MODEL, prompt="hi", logprobs=6)
        assert error_of(caught.value)["param"] == "logprobs"

    def test_best_of_is_refused_clearly(self, client: openai.OpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(model=UNKNOWN_MODEL, prompt="hi", best_of=3)
        error = error_of(caught.value)
        assert error["param"] == "best_of"
        assert "not supported" in error["message"]

    def test_best_of_equal_to_n_passes(self, client: openai.OpenAI) -> None:
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model=UNKNOWN_MODEL, prompt="hi", best_of=2, n=2)


class TestFields:
    def test_unknown_field_is_a_400_naming_it(self, client: openai.OpenAI) -> None:
        error = refused(client, extra_body={"frobnicate": True})
        assert (error["param"], error["code"]) == ("frobnicate", "unknown_parameter")
        assert "--allow-unknown-fields" in error["message"]

    def test_documented_fields_are_accepted_and_ignored(self, client: openai.OpenAI) -> None:
        passes_validation(
            client,
            user="u1",
            metadata={"k": "v"},
            store=False,
            service_tier="auto",
            safety_identifier="s",
            prompt_cache_key="k",
            prediction={"type": "content", "content": "x"},
            reasoning_effort="low",
            verbosity="low",
            web_search_options={},
            modalities=["text"],
            frequency_penalty=0.5,
            presence_penalty=-0.5,
            logit_bias={"42": -100},
            seed=3,
            extra_body={"min_p": 0.1, "repetition_penalty": 1.1, "top_k": 20},
        )

    def test_nvext_passes(self, client: openai.OpenAI) -> None:
        nvext = {
            "annotations": ["request_id"],
            "greed_sampling": True,
            "max_thinking_tokens": 64,
            "allowed_worker_ids": ["w1"],
            "cache_salt": "step_1",
            "extra_fields": ["worker_id", "timing"],
            "agent_hints": {"osl": 10},
        }
        passes_validation(client, extra_body={"nvext": nvext})

    def test_out_of_range_penalty(self, client: openai.OpenAI) -> None:
        assert refused(client, presence_penalty=3)["param"] == "presence_penalty"


class TestHttp:
    def test_request_id_is_echoed(self, client: openai.OpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=UNKNOWN_MODEL,
                messages=USER,
                n=0,
                extra_headers={"x-request-id": "surface-req-1"},
            )
        assert caught.value.response.headers["x-request-id"] == "surface-req-1"
        listed = client.models.with_raw_response.list(extra_headers={"x-request-id": "list-1"})
        assert listed.headers["x-request-id"] == "list-1"

    def test_dynamo_pin_header_is_read(self, client: openai.OpenAI) -> None:
        bad = {"x-dynamo-worker-instance-id": "not.a.worker"}
        assert refused(client, extra_headers=bad)["param"] == "x-dynamo-worker-instance-id"
        both = {"x-dynamo-worker-instance-id": "w1", "x-worker-instance-id": "w1"}
        passes_validation(client, extra_headers=both, extra_body={"nvext": {"decode_worker_id": 1}})

    def test_a_huge_body_is_a_413(self, client: openai.OpenAI) -> None:
        huge = [{"role": "user", "content": "x" * 11_000_000}]
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model=UNKNOWN_MODEL, messages=huge)
        assert caught.value.status_code == 413
        assert error_of(caught.value)["type"]

    def test_openapi_and_docs(self, gateway: GatewayProcess) -> None:
        document = httpx.get(f"{gateway.base_url}/openapi.json", timeout=10)
        assert document.status_code == 200
        paths = document.json()["paths"]
        assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health"} <= set(paths)
        docs = httpx.get(f"{gateway.base_url}/docs", timeout=10)
        assert docs.status_code == 200
        assert "SwaggerUIBundle" in docs.text


def test_allow_unknown_fields_relaxes_to_ignore_and_log(tmp_path: Path) -> None:
    with gateway_process(tmp_path, "--allow-unknown-fields") as relaxed:
        body = {"model": UNKNOWN_MODEL, "messages": USER, "frobnicate": 1}
        response = httpx.post(f"{relaxed.base_url}/v1/chat/completions", json=body, timeout=10)
        assert response.status_code == 404
        assert "unknown_fields_ignored" in relaxed.log.read_text()
        assert "frobnicate" in relaxed.log.read_text()
