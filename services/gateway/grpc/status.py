"""Pure: the one table from a ``ServiceError`` (its ``code``, else its HTTP ``status``) to a
``grpc.StatusCode``, so HTTP and gRPC answer the same failure under the same name."""

from __future__ import annotations

import grpc

from shared.errors import ServiceError

BY_CODE: dict[str, grpc.StatusCode] = {
    "model_not_found": grpc.StatusCode.NOT_FOUND,
    "not_found": grpc.StatusCode.NOT_FOUND,
    "invalid_request": grpc.StatusCode.INVALID_ARGUMENT,
    "context_length_exceeded": grpc.StatusCode.INVALID_ARGUMENT,
    "no_worker_available": grpc.StatusCode.UNAVAILABLE,
    "service_unavailable": grpc.StatusCode.UNAVAILABLE,
    "shutting_down": grpc.StatusCode.UNAVAILABLE,
    "overloaded": grpc.StatusCode.UNAVAILABLE,
    "worker_lost": grpc.StatusCode.UNAVAILABLE,
    "formatter_lost": grpc.StatusCode.UNAVAILABLE,
    "worker_busy": grpc.StatusCode.UNAVAILABLE,
    "timeout": grpc.StatusCode.DEADLINE_EXCEEDED,
    "all_workers_busy": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "duplicate_request_id": grpc.StatusCode.ALREADY_EXISTS,
    "client_disconnected": grpc.StatusCode.CANCELLED,
    "internal_error": grpc.StatusCode.INTERNAL,
    "invalid_api_key": grpc.StatusCode.UNAUTHENTICATED,
}
"""Known error codes (``shared.errors``, ``services.gateway.core.errors``)."""
BY_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    529: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""Codes this table does not know (a newer service's) fall back to their HTTP status."""


def status_code(error: ServiceError) -> grpc.StatusCode:
    """The gRPC status of an expected failure: by code, else by status; other 4xx are the
    client's (INVALID_ARGUMENT), anything else INTERNAL."""
    found = BY_CODE.get(error.code) or BY_STATUS.get(error.status)
    if found is not None:
        return found
    if 400 <= error.status < 500:
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.INTERNAL
