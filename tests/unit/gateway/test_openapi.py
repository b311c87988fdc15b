"""``/openapi.json``: every endpoint with its request and response schemas, and the response
Structs restated for the document agree with the formatter's shapers field for field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.formatter.shapers import openai_chat, openai_completion
from services.formatter.shaping import Nvext as FormatterNvext
from services.formatter.shaping import Usage as FormatterUsage
from services.gateway import openai_responses as out
from services.gateway.openai_types import ChatCompletionRequest, ErrorResponse
from services.gateway.openapi import ENDPOINTS, Endpoint, with_inference


def _names(kind: type[msgspec.Struct]) -> list[str]:
    return [f.encode_name for f in msgspec.structs.fields(kind)]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (out.ChatCompletion, openai_chat.ChatCompletion),
        (out.ChatChoice, openai_chat.ChatChoice),
        (out.AssistantMessage, openai_chat.ChatMessage),
        (out.ToolCall, openai_chat.ToolCall),
        (out.Function, openai_chat.Function),
        (out.ChatCompletionChunk, openai_chat.ChatCompletionChunk),
        (out.ChunkChoice, openai_chat.ChunkChoice),
        (out.Delta, openai_chat.Delta),
        (out.ToolCallDelta, openai_chat.ToolCallDelta),
        (out.FunctionDelta, openai_chat.FunctionDelta),
        (out.ChoiceLogprobs, openai_chat.ChoiceLogprobs),
        (out.ContentLogprob, openai_chat.ContentLogprob),
        (out.TopLogprob, openai_chat.TopLogprob),
        (out.Completion, openai_completion.Completion),
        (out.CompletionChoice, openai_completion.CompletionChoice),
        (out.CompletionLogprobs, openai_completion.CompletionLogprobs),
        (out.Usage, FormatterUsage),
        (out.ResponseNvext, FormatterNvext),
    ],
)
def test_documented_responses_match_the_shapers(
    ours: type[msgspec.Struct], theirs: type[msgspec.Struct]
) -> None:
    assert _names(ours) == _names(theirs)


def _document(endpoints: list[Endpoint | tuple[Any, ...]]) -> dict[str, Any]:
    return with_inference({"openapi": "3.1.0", "info": {}, "paths": {}}, endpoints)


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
