"""Gateway-only errors: a client that went away, a wrong method, a reused request id, a hop
nobody listens on, a stream that cannot be replayed."""

from __future__ import annotations

from shared.errors import (
    FormatterLost,
    InvalidRequest,
    NoWorkerAvailable,
    ServiceError,
    ServiceUnavailable,
)

NO_WORKER_RETRY_AFTER_S = 1.0


class ClientDisconnected(ServiceError):
    """The client went away before the response started (nginx's 499; nobody receives it)."""

    code = "client_disconnected"
    status = 499
    type = "client_disconnected"


class ClientTooSlow(ServiceError):
    """A streaming client read so slowly that its backlog passed the gateway's bound."""

    code = "client_too_slow"
    status = 503
    type = "service_unavailable"


class MethodNotAllowed(InvalidRequest):
    code = "method_not_allowed"
    status = 405


class DuplicateRequestId(ServiceError):
    """A client reused the ``X-Request-Id`` of a request that is still in flight here."""

    code = "duplicate_request_id"
    status = 409
    type = "invalid_request_error"


class NoResponders(ServiceUnavailable):
    """NATS answered "no responders": nobody listens where the request was sent (yet or still).

    Same ``code`` as ``ServiceUnavailable``; its own class so a tensor request can go on to the
    next live worker when the one it picked has just gone.
    """


class StreamGap(FormatterLost):
    """Chunks lost in transit can no longer be replayed: the formatter holding the request
    keeps its chunks from ``first_seq`` only, past the ``from_seq`` the gateway is missing.

    Same ``code`` as ``FormatterLost`` (503, resubmitted while nothing reached the client).
    """

    def __init__(self, *, from_seq: int, first_seq: int) -> None:
        super().__init__(
            f"Response chunks {from_seq} to {first_seq - 1} were lost in transit and the "
            "formatter no longer holds them."
        )
        self.from_seq = from_seq
        self.first_seq = first_seq


def no_live_worker(model: str) -> NoWorkerAvailable:
    """The 503 (retryable, ``Retry-After``) for a known model with no live worker right now."""
    return NoWorkerAvailable(
        f"The model `{model}` has no live worker right now.",
        retry_after_s=NO_WORKER_RETRY_AFTER_S,
    )
