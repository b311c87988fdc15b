"""How a failure looks on the wire, per API dialect: status, body, headers, in-stream tail.

Shared by Litestar's exception handlers (``app.py``) and ``Relay`` (``relay.py``), so every
route answers in the same shape and logs the same lines; ``send_refusal`` answers a request
refused before it reached either (admission, ``--max-concurrent-requests``).

Two dialects (``ErrorDialect``): OpenAI's ``{"error": {"message", "type", "code", "param"}}``
(chat, completions, Responses, everything Litestar serves) and Anthropic's ``{"type": "error",
"error": {"type", "message"}, "request_id"}`` (``/v1/messages``). Anthropic's statuses are its
own: a full server or busy workers are ``529 overloaded_error`` (what Anthropic answers when it
is overloaded, and what its SDKs turn into ``OverloadedError`` and retry), a body over the limit
``413 request_too_large``, a timeout ``504 timeout_error``, other server failures ``api_error``
with their status kept (a 503 while shutting down stays a 503 for load balancers). Anthropic
responses also carry ``request-id`` (read by its SDKs) besides ``x-request-id``.
"""

from __future__ import annotations

import msgspec
import structlog
from litestar.types import Send

from services.gateway.core.context import RequestContext, id_header, note_error
from services.gateway.core.errors import MethodNotAllowed
from services.gateway.http import sse
from shared.errors import InternalError, InvalidRequest, NotFound, ServiceError

log = structlog.get_logger(__name__)

ErrorParts = tuple[int, bytes, dict[str, str]]
Header = tuple[bytes, bytes]
_JSON = (b"content-type", b"application/json")


class ErrorDialect:
    """OpenAI's error shape (the default)."""

    name = "openai"

    def render(self, status: int, exc: ServiceError, request_id: str) -> tuple[int, bytes]:
        """The status and body of ``exc`` answered with ``status``."""
        return status, exc.body()

    def stream_tail(self, exc: ServiceError, sent: bytes) -> bytes:
        """What ends a stream that failed after ``sent`` (the last bytes relayed)."""
        return sse.error_tail(exc)

    def headers(self, ctx: RequestContext) -> list[Header]:
        """Headers every response of this API carries (``x-request-id``)."""
        return [id_header(ctx)]


class ResponsesDialect(ErrorDialect):
    """The Responses API: OpenAI's bodies; in-stream, a numbered ``error`` event."""

    name = "responses"

    def stream_tail(self, exc: ServiceError, sent: bytes) -> bytes:
        return sse.responses_error_tail(exc, sent)


_OVERLOADED = frozenset({"overloaded", "all_workers_busy", "worker_busy", "no_worker_available"})
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_status(status: int, code: str) -> tuple[int, str]:
    """Anthropic's status and error ``type`` for a failure with ``status`` and ``code``."""
    if code in _OVERLOADED:
        return 529, "overloaded_error"
    error_type = _ANTHROPIC_TYPES.get(status)
    if error_type is None:
        error_type = "api_error" if status >= 500 else "invalid_request_error"
    return status, error_type


class AnthropicDialect(ErrorDialect):
    """Anthropic's error shape and statuses, and its ``request-id`` header."""

    name = "anthropic"

    def render(self, status: int, exc: ServiceError, request_id: str) -> tuple[int, bytes]:
        status, error_type = anthropic_status(status, exc.code)
        error = {"type": error_type, "message": exc.message}
        body = {"type": "error", "error": error, "request_id": request_id}
        return status, msgspec.json.encode(body)

    def stream_tail(self, exc: ServiceError, sent: bytes) -> bytes:
        _, error_type = anthropic_status(exc.status, exc.code)
        return sse.anthropic_error_tail(error_type, exc.message)

    def headers(self, ctx: RequestContext) -> list[Header]:
        return [(b"request-id", ctx.request_id.encode()), id_header(ctx)]


OPENAI = ErrorDialect()
RESPONSES = ResponsesDialect()
ANTHROPIC = AnthropicDialect()


def service_error(
    exc: ServiceError, dialect: ErrorDialect = OPENAI, request_id: str = ""
) -> ErrorParts:
    """Any expected failure as its error body, status and ``Retry-After``."""
    code = exc.code
    note_error(code)
    if exc.status >= 500:
        log.warning("request_failed", code=code, status=exc.status, message=exc.message)
    status, body = dialect.render(exc.status, exc, request_id)
    return status, body, exc.headers()


def http_error(
    status: int,
    detail: str,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    dialect: ErrorDialect = OPENAI,
    request_id: str = "",
) -> ErrorParts:
    """Litestar's own errors (unknown route, wrong method, bad input) in the API's shape."""
    error: ServiceError
    if status == 404:
        error = NotFound(f"No route for {method} {path}.")
    elif status == 405:
        error = MethodNotAllowed(f"Method {method} is not allowed on {path}.")
    elif status < 500:
        error = InvalidRequest(detail)
    else:
        error = InternalError(detail)
    note_error(error.code)
    status, body = dialect.render(status, error, request_id)
    return status, body, headers or {}


def unexpected_error(
    exc: Exception, dialect: ErrorDialect = OPENAI, request_id: str = ""
) -> ErrorParts:
    """A bug: one log line with the traceback, and a 500 that says nothing internal."""
    log.exception("request_crashed", error_type=type(exc).__name__)
    note_error("internal_error")
    status, body = dialect.render(500, InternalError("Internal server error."), request_id)
    return status, body, {}


async def send_refusal(
    ctx: RequestContext, send: Send, error: ServiceError, dialect: ErrorDialect = OPENAI
) -> None:
    """Answer a request refused before any work (its body unread) with ``error``'s status, body
    and headers, on raw ASGI. No warning line: a refusal under overload is expected, and
    the access line and ``jetserve_gateway_rejected_total`` count it."""
    note_error(error.code)
    status, body = dialect.render(error.status, error, ctx.request_id)
    headers = [
        (name.lower().encode("latin-1"), value.encode()) for name, value in error.headers().items()
    ]
    headers += [_JSON, (b"content-length", b"%d" % len(body)), *dialect.headers(ctx)]
    ctx.status = status
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
