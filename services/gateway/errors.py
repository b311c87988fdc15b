"""Gateway-only errors, and the stable code of any ServiceError (remote ones included)."""

from __future__ import annotations

from shared.errors import InvalidRequest, RemoteError, ServiceError


class ClientDisconnected(ServiceError):
    """The client went away before the response started (nginx's 499; nobody receives it)."""

    code = "client_disconnected"
    http_status = 499
    error_type = "client_disconnected"


class MethodNotAllowed(InvalidRequest):
    code = "method_not_allowed"
    http_status = 405


class DuplicateRequestId(ServiceError):
    """A client reused the ``X-Request-Id`` of a request that is still in flight here."""

    code = "duplicate_request_id"
    http_status = 409
    error_type = "invalid_request_error"


def error_code(exc: ServiceError) -> str:
    """The code the client sees: the remote service's code for errors that came over the bus."""
    return exc.remote_code if isinstance(exc, RemoteError) else exc.code
