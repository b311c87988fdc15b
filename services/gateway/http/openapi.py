"""``GET /openapi.json`` and the Swagger UI at ``GET /docs``.

The document is Litestar's (empty: its handlers are excluded from the schema) plus one path
item per ``Endpoint``: the request body is described from the msgspec Struct that decodes it
and the response from the Struct that documents it, so the document and the decoder cannot drift
apart; every endpoint has the OpenAI error envelope for 4XX / 5XX. Front ends add their endpoints
to ``ENDPOINTS`` (an ``Endpoint`` is a plain tuple:
``(path, summary, request Struct | None, response Struct | None)``; no request Struct means
``GET``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from litestar import Request
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin, SwaggerRenderPlugin

from services.gateway.apis import openapi_shapes as api
from services.gateway.apis import openapi_shapes as out
from services.gateway.apis.anthropic import CountTokensRequest, MessagesRequest
from services.gateway.apis.embeddings import EmbeddingRequest, EmbeddingResponse
from services.gateway.apis.media import ImageRequest, ImagesResponse, VideoRequest, VideoResponse
from services.gateway.apis.openai_responses_api import ResponsesRequest
from services.gateway.apis.openai_types import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
)
from services.gateway.core.paths import Paths
from shared.api_objects import ChatCompletion, ChatCompletionChunk, Completion

_REF = "#/components/schemas/{name}"
DOCS_PATH = "/docs"
OPENAPI_PATH = "/openapi.json"
_STATE_KEY = "jetserve_openapi_document"


class Endpoint(NamedTuple):
    """One documented endpoint."""

    path: str
    summary: str
    request: type[msgspec.Struct] | None
    """The JSON body (``POST``); ``None``: ``GET`` without a body."""
    response: type[msgspec.Struct] | None
    """The 200 JSON body; ``None``: described as any object."""
    stream: type[msgspec.Struct] | None = None
    """With ``stream: true``: the event of the SSE stream."""
    description: str = ""
    error: type[msgspec.Struct] = ErrorResponse
    """The 4XX / 5XX body (OpenAI's envelope unless the API has its own)."""


ENDPOINTS: list[Endpoint] = [
    Endpoint(
        "/v1/chat/completions",
        "Create a chat completion",
        ChatCompletionRequest,
        ChatCompletion,
        ChatCompletionChunk,
        "OpenAI chat completions with tools, structured outputs, `n`, log-probabilities and "
        "NVIDIA's `nvext`. Unknown top-level fields are refused (400) unless the gateway runs "
        "with --allow-unknown-fields.",
    ),
    Endpoint(
        "/v1/completions",
        "Create a completion",
        CompletionRequest,
        Completion,
        Completion,
        "OpenAI (legacy) completions: one prompt (text or token ids) per request.",
    ),
    Endpoint(
        "/v1/embeddings",
        "Create embeddings",
        EmbeddingRequest,
        EmbeddingResponse,
        None,
        "Strings, lists of strings or token ids; `encoding_format` float or base64.",
    ),
    Endpoint(
        "/v1/images/generations",
        "Generate images",
        ImageRequest,
        ImagesResponse,
        None,
        "Routed to a worker that registers a media model; `response_format` `url` (a data URL) "
        "or `b64_json`.",
    ),
    Endpoint(
        "/v1/videos/generations",
        "Generate a video",
        VideoRequest,
        VideoResponse,
        None,
        "Dynamo's video generation: one completed job, its videos (animated PNG) inline.",
    ),
    Endpoint(
        "/v1/responses",
        "Create a response (OpenAI Responses API)",
        ResponsesRequest,
        api.ResponseObject,
        None,
        "`input` as a string or items, `instructions`, function tools; streamed as the "
        "documented event sequence with `stream: true`; kept for `previous_response_id` and "
        "`GET /v1/responses/{id}` unless `store: false`.",
    ),
    Endpoint(
        "/v1/messages",
        "Create a message (Anthropic Messages API)",
        MessagesRequest,
        api.AnthropicMessage,
        None,
        "System prompts, content blocks, tools and thinking; streamed as Anthropic's event "
        "sequence with `stream: true`.",
        api.AnthropicError,
    ),
    Endpoint(
        "/v1/messages/count_tokens",
        "Count a message's input tokens (Anthropic Messages API)",
        CountTokensRequest,
        api.CountTokensResponse,
        error=api.AnthropicError,
    ),
    Endpoint("/v1/models", "List the models with a live worker", None, out.ModelList),
    Endpoint(
        "/health",
        "Readiness: 200 when a model has a live worker and NATS is connected, else 503",
        None,
        out.Health,
    ),
    Endpoint("/live", "Liveness: the process answers", None, out.Live),
]
"""Every endpoint ``/openapi.json`` describes."""


def openapi_config() -> OpenAPIConfig:
    """Serve the document at ``/openapi.json`` (the Swagger UI is a route: ``swagger_page``)."""
    # The render plugin is the router's default, so it answers at the router's own path.
    return OpenAPIConfig(
        title="JetServe gateway",
        version="1",
        path=OPENAPI_PATH,
        render_plugins=[_WithEndpoints()],
    )


def with_inference(
    document: dict[str, Any], entries: Sequence[Endpoint | tuple[Any, ...]]
) -> dict[str, Any]:
    """``document`` plus the path items and schemas of ``entries`` (``Endpoint`` or the same
    fields as a plain tuple)."""
    endpoints = [e if isinstance(e, Endpoint) else Endpoint(*e) for e in entries]
    types: list[type[msgspec.Struct]] = [ErrorResponse]
    for e in endpoints:
        types.extend(t for t in (e.request, e.response, e.stream, e.error) if t)
    unique = list(dict.fromkeys(types))
    refs, schemas = msgspec.json.schema_components(unique, ref_template=_REF)
    ref_of = dict(zip(unique, refs, strict=True))
    paths: dict[str, Any] = {}
    for endpoint in endpoints:
        method = "post" if endpoint.request is not None else "get"
        paths.setdefault(endpoint.path, {})[method] = _operation(endpoint, ref_of)
    components = document.get("components", {})
    return {
        **document,
        "paths": {**document.get("paths", {}), **paths},
        "components": {**components, "schemas": {**components.get("schemas", {}), **schemas}},
    }


PATHS_KEY = "jetserve_paths"
"""Where the app's state holds its ``Paths`` (the documented paths are the served ones)."""


def served(paths: Paths) -> list[Endpoint]:
    """``ENDPOINTS`` at the paths the gateway serves them on."""
    moved = {getattr(Paths(), name): getattr(paths, name) for name in Paths.__slots__}
    return [e._replace(path=moved.get(e.path, e.path)) for e in ENDPOINTS]


def document_of(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The gateway's whole document: Litestar's plus ``ENDPOINTS`` (cached on the app)."""
    state = request.app.state
    cached: dict[str, Any] | None = state.get(_STATE_KEY)
    if cached is None:
        paths = state.get(PATHS_KEY) or Paths()
        cached = with_inference(request.app.openapi_schema.to_schema(), served(paths))
        state[_STATE_KEY] = cached
    return cached


def swagger_page(request: Request[Any, Any, Any]) -> bytes:
    """The Swagger UI page with the document inlined (its scripts come from a CDN)."""
    return _SWAGGER.render(request, document_of(request))


def _operation(endpoint: Endpoint, ref_of: dict[type[msgspec.Struct], Any]) -> dict[str, Any]:
    errors = {
        "description": "OpenAI error body",
        "content": {"application/json": {"schema": ref_of[endpoint.error]}},
    }
    body = ref_of[endpoint.response] if endpoint.response else {"type": "object"}
    content: dict[str, Any] = {"application/json": {"schema": body}}
    description = "The response."
    if endpoint.stream is not None:
        content["text/event-stream"] = {
            "schema": {"type": "string"},
            "x-event-schema": ref_of[endpoint.stream],
        }
        description = (
            "The response; with `stream: true`, SSE `data:` events (each one "
            f"`{endpoint.stream.__name__}`) ending in `data: [DONE]` (a failure after the first "
            "event is an `error` event)."
        )
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "operationId": endpoint.path.strip("/").replace("/", "_") or "root",
        "responses": {
            "200": {"description": description, "content": content},
            "4XX": errors,
            "5XX": {**errors, "headers": {"Retry-After": {"schema": {"type": "integer"}}}},
        },
    }
    if endpoint.description:
        operation["description"] = endpoint.description
    if endpoint.request is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref_of[endpoint.request]}},
        }
    return operation


class _WithEndpoints(JsonRenderPlugin):
    """Litestar's JSON document with ``ENDPOINTS`` added."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return self.render_json(request, document_of(request))


_SWAGGER = SwaggerRenderPlugin(path=DOCS_PATH)
