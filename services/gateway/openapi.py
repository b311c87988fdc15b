"""``GET /openapi.json``: Litestar's document plus the two endpoints ``Relay`` serves beside it.

The request bodies are described from the msgspec types that parse them (``openai_types.py``),
so the document and the decoder cannot drift apart.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin

from services.gateway.openai_types import ChatCompletionRequest, CompletionRequest, ErrorResponse
from services.gateway.relay import CHAT_PATH, COMPLETIONS_PATH

_REF = "#/components/schemas/{name}"


def openapi_config() -> OpenAPIConfig:
    """Serve the document at ``/openapi.json`` only (no documentation UI)."""
    # The render plugin is the router's default, so it answers at the router's own path.
    return OpenAPIConfig(
        title="JetServe gateway",
        version="1",
        path="/openapi.json",
        render_plugins=[_WithInference()],
    )


def with_inference(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` plus the path items and schemas of the two inference endpoints."""
    (chat, completion, error), schemas = msgspec.json.schema_components(
        (ChatCompletionRequest, CompletionRequest, ErrorResponse), ref_template=_REF
    )
    paths = {
        CHAT_PATH: _post("Create a chat completion", chat, error),
        COMPLETIONS_PATH: _post("Create a completion", completion, error),
    }
    components = document.get("components", {})
    return {
        **document,
        "paths": {**document.get("paths", {}), **paths},
        "components": {**components, "schemas": {**components.get("schemas", {}), **schemas}},
    }


def _post(summary: str, body: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    errors = {
        "description": "OpenAI error body",
        "content": {"application/json": {"schema": error}},
    }
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {
                    "description": "The completion; SSE `data:` events ending in `[DONE]` when "
                    "`stream` is true (a failure after the first event is an error event).",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "4XX": errors,
                "5XX": {
                    **errors,
                    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                },
            },
        }
    }


class _WithInference(JsonRenderPlugin):
    """Litestar's JSON document with ``with_inference`` applied (once, on first request)."""

    def __init__(self) -> None:
        super().__init__()
        self._document: dict[str, Any] | None = None

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        if self._document is None:
            self._document = with_inference(openapi_schema)
        return self.render_json(request, self._document)
