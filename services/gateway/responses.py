"""How a failure before the response starts looks on the wire: status, OpenAI body, headers.

Shared by Litestar's exception handlers (``app.py``) and ``Relay`` (``relay.py``), so every
route answers in the same shape and logs the same lines.
"""

from __future__ import annotations

import structlog

from services.gateway.context import note_error
from services.gateway.errors import MethodNotAllowed
from shared.errors import InternalError, InvalidRequest, NotFound, ServiceError

log = structlog.get_logger(__name__)

ErrorParts = tuple[int, bytes, dict[str, str]]


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
