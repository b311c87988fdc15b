"""The one table from a typed error to a gRPC status."""

from __future__ import annotations

import grpc
import pytest

from services.gateway.core.errors import ClientDisconnected, DuplicateRequestId, NoResponders
from services.gateway.grpc.status import status_code
from shared.errors import (
    AllWorkersBusy,
    AllWorkersOverloaded,
    ContextLengthExceeded,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    NotFound,
    NoWorkerAvailable,
    ServiceError,
    ServiceUnavailable,
    ShuttingDown,
    UpstreamTimeout,
    from_message,
)
from shared.messages import RequestFailed

Code = grpc.StatusCode


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ModelNotFound("m"), Code.NOT_FOUND),
        (NotFound("no version"), Code.NOT_FOUND),
        (InvalidRequest("bad tensor"), Code.INVALID_ARGUMENT),
        (ContextLengthExceeded(limit=8, requested=9, prompt_tokens=9), Code.INVALID_ARGUMENT),
        (NoWorkerAvailable("none"), Code.UNAVAILABLE),
        (ServiceUnavailable("bus"), Code.UNAVAILABLE),
        (NoResponders("nobody"), Code.UNAVAILABLE),
        (ShuttingDown("bye"), Code.UNAVAILABLE),
        (UpstreamTimeout("slow"), Code.DEADLINE_EXCEEDED),
        (AllWorkersBusy("busy"), Code.RESOURCE_EXHAUSTED),
        (AllWorkersOverloaded("busy"), Code.RESOURCE_EXHAUSTED),
        (DuplicateRequestId("again"), Code.ALREADY_EXISTS),
        (ClientDisconnected("gone"), Code.CANCELLED),
        (InternalError("bug"), Code.INTERNAL),
    ],
)
def test_known_errors_map_by_code(error: ServiceError, expected: grpc.StatusCode) -> None:
    assert status_code(error) == expected


def test_errors_rebuilt_from_the_bus_keep_their_status() -> None:
    failed = RequestFailed(request_id="r", code="context_length_exceeded", message="x", status=400)
    assert status_code(from_message(failed)) == Code.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (400, Code.INVALID_ARGUMENT),
        (404, Code.NOT_FOUND),
        (422, Code.INVALID_ARGUMENT),
        (503, Code.UNAVAILABLE),
        (504, Code.DEADLINE_EXCEEDED),
        (529, Code.RESOURCE_EXHAUSTED),
        (500, Code.INTERNAL),
        (502, Code.INTERNAL),
    ],
)
def test_unknown_codes_fall_back_to_their_http_status(
    status: int, expected: grpc.StatusCode
) -> None:
    failed = RequestFailed(request_id="r", code="brand_new_code", message="x", status=status)
    assert status_code(from_message(failed)) == expected
