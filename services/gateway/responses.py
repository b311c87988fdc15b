"""How a failure before the response starts looks on the wire: status, OpenAI body, headers.

Shared by Litestar's exception handlers (``app.py``) and ``Relay`` (``relay.py``), so every
route answers in the same shape and logs the same lines; ``send_refusal`` answers a request
refused before it reached either (admission, ``--max-concurrent-requests``).
"""

from __future__ import annotations

import structlog
from litestar.types import Send

from services.gateway.context import RequestContext, id_header, note_error
from services.gateway.errors import MethodNotAllowed
from shared.errors import InternalError, InvalidRequest, NotFound, ServiceError

log = structlog.get_logger(__name__)

ErrorParts = tuple[int, bytes, dict[str, str]]
_JSON = (b"content-type", b"application/json")


def service_error(exc: ServiceError) -> ErrorParts:
    """Any expected failure as its OpenAI error body, status and ``Retry-After``."""
    status = exc.status
    code = exc.code
    note_error(code)
    if status >= 500:
        log.warning("request_failed", code=code, status=status, message=exc.message)
    return status, exc.body(), exc.headers()


def http_error(
    status: int, detail: str, method: str, path: str, headers: dict[str, str] | None = None
) -> ErrorParts:
    """Litestar's own errors (unknown route, wrong method, bad input) in the OpenAI shape."""
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
    return status, error.body(), headers or {}


def unexpected_error(exc: Exception) -> ErrorParts:
    """A bug: one log line with the traceback, and a 500 that says nothing internal."""
    log.exception("request_crashed", error_type=type(exc).__name__)
    note_error("internal_error")
    return 500, InternalError("Internal server error.").body(), {}


async def send_refusal(ctx: RequestContext, send: Send, error: ServiceError) -> None:
    """Answer a request refused before any work (its body unread) with ``error``'s status, OpenAI
    body and headers, on raw ASGI. No warning line: a refusal under overload is expected, and
    the access line and ``jetserve_gateway_rejected_total`` count it."""
    note_error(error.code)
    body = error.body()
    headers = [
        (name.lower().encode("latin-1"), value.encode()) for name, value in error.headers().items()
    ]
    headers += [_JSON, (b"content-length", b"%d" % len(body)), id_header(ctx)]
    ctx.status = error.status
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
