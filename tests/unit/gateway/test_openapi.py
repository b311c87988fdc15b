"""``/openapi.json``: every endpoint with its request and response schemas; chat and completion
responses are described by the Structs the formatter encodes (``shared.api_objects``)."""

from __future__ import annotations

from typing import Any

import msgspec

from services.formatter.pieces import ChoiceEnd, ChoiceResult, Collected
from services.formatter.shapers import ChatShaper, openai_chat, openai_completion
from services.gateway.apis.openai_types import ChatCompletionRequest, ErrorResponse
from services.gateway.http.openapi import ENDPOINTS, Endpoint, with_inference
from shared import api_objects
from shared.api_objects import usage
from tests.unit.formatter.test_shapers_openai_chat import chat_open


def _document(endpoints: list[Endpoint | tuple[Any, ...]]) -> dict[str, Any]:
    return with_inference({"openapi": "3.1.0", "info": {}, "paths": {}}, endpoints)


def test_chat_and_completion_schemas_are_the_formatters_structs() -> None:
    # One definition: the formatter encodes shared.api_objects, /openapi.json describes it.
    assert openai_chat.ChatCompletion is api_objects.ChatCompletion
    assert openai_completion.Completion is api_objects.Completion
    document = _document(list(ENDPOINTS))
    schemas = document["components"]["schemas"]
    kinds = [api_objects.ChatCompletion, api_objects.ChatCompletionChunk, api_objects.Completion]
    _, expected = msgspec.json.schema_components(kinds, ref_template="#/components/schemas/{name}")
    for name, schema in expected.items():
        assert schemas[name] == schema, name
    chat = document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert chat["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    message = schemas["AssistantMessage"]["properties"]
    assert set(message) == {"role", "content", "reasoning_content", "tool_calls", "function_call"}
    assert schemas["AssistantMessage"]["required"] == ["content"]  # UNSET fields are optional


def test_a_formatter_body_decodes_as_the_documented_struct() -> None:
    end = ChoiceEnd(finish_reason="stop")
    body = ChatShaper(chat_open()).body(
        [ChoiceResult(index=0, message=Collected(content="hi"), end=end)], usage(3, 1, 0)
    )
    decoded = msgspec.json.decode(body, type=api_objects.ChatCompletion)
    assert decoded.choices[0].message.content == "hi"
    assert decoded.usage.total_tokens == 4


def test_every_endpoint_is_described_with_its_schemas() -> None:
    document = _document(list(ENDPOINTS))
    schemas = document["components"]["schemas"]
    for endpoint in ENDPOINTS:
        method = "post" if endpoint.request else "get"
        operation = document["paths"][endpoint.path][method]
        ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
        if endpoint.response is not None:
            assert ok == {"$ref": f"#/components/schemas/{endpoint.response.__name__}"}
            assert endpoint.response.__name__ in schemas
        if endpoint.request is not None:
            body = operation["requestBody"]["content"]["application/json"]["schema"]
            assert body["$ref"].rpartition("/")[2] in schemas
        assert operation["responses"]["4XX"]["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{endpoint.error.__name__}"
        }


def test_every_api_is_documented() -> None:
    paths = set(_document(list(ENDPOINTS))["paths"])
    assert paths == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/images/generations",
        "/v1/videos/generations",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/health",
        "/live",
    }
    messages = _document(list(ENDPOINTS))["paths"]["/v1/messages"]["post"]["responses"]
    assert messages["4XX"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AnthropicError"
    }


def test_chat_request_schema_carries_the_constraints() -> None:
    schemas = _document(list(ENDPOINTS))["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    n = chat["n"]["anyOf"][0]
    assert (n["minimum"], n["maximum"]) == (1, 128)
    assert "tools" in chat
    assert "nvext" in chat
    name = schemas["FunctionDefinition"]["properties"]["name"]
    assert name["pattern"] == "^[a-zA-Z0-9_-]{1,64}$"
    stream = _document(list(ENDPOINTS))["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]
    assert stream["content"]["text/event-stream"]["x-event-schema"] == {
        "$ref": "#/components/schemas/ChatCompletionChunk"
    }


def test_others_add_endpoints_as_plain_tuples() -> None:
    extra = Endpoint(*("/v1/thing", "Make a thing", ChatCompletionRequest, None))
    document = _document([extra, ("/v1/other", "Other", None, None)])
    assert document["paths"]["/v1/thing"]["post"]["summary"] == "Make a thing"
    response = document["paths"]["/v1/other"]["get"]["responses"]["200"]
    assert response["content"]["application/json"]["schema"] == {"type": "object"}
    assert "ErrorResponse" in document["components"]["schemas"]
    assert ErrorResponse.__name__ == "ErrorResponse"
