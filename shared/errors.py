"""Typed expected failures: one stable ``code``, HTTP ``status`` and OpenAI ``type`` each.

A service raises a ``ServiceError`` subclass; the handler boundary sends it on as
``RequestFailed`` (``to_message``); the gateway rebuilds it with ``from_message``, keeping the
remote ``code``, ``status`` and ``type``, so an error is logged, counted and answered under the
same name at every hop.
"""

from __future__ import annotations

import msgspec

from shared.messages import RequestFailed


class ServiceError(Exception):
    """Base for expected failures. ``code`` is stable; the message is for humans.

    Subclasses set ``code``, ``status`` and ``type`` as class attributes; an error rebuilt from
    the bus (``from_message``) carries the remote values on the instance.
    """

    code: str = "internal_error"
    status: int = 500
    """The HTTP status (gRPC maps the same codes to its own status in one table)."""
    type: str = "internal_server_error"
    """The OpenAI error ``type``."""
    retryable: bool = False

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def to_message(self, request_id: str) -> RequestFailed:
        """The bus form of this error, for the request's reply subject."""
        return RequestFailed(
            request_id=request_id,
            code=self.code,
            message=self.message,
            status=self.status,
            retry_after_s=self.retry_after_s,
            param=self.param,
        )

    def body(self) -> bytes:
        """The OpenAI error envelope ``{"error": {"message", "type", "code", "param"}}``."""
        error = {"message": self.message, "type": self.type, "code": self.code, "param": self.param}
        return msgspec.json.encode({"error": error})

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers (``Retry-After`` for retryable errors)."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(ServiceError):
    code = "invalid_request"
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, *, limit: int, requested: int, prompt_tokens: int) -> None:
        super().__init__(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{requested} tokens ({prompt_tokens} in the messages, "
            f"{requested - prompt_tokens} in the completion). Please reduce the length of the "
            "messages or completion.",
            param="messages",
        )
        self.limit = limit
        self.requested = requested


class Unauthenticated(ServiceError):
    """No API key, or not one of the gateway's (``--api-key``)."""

    code = "invalid_api_key"
    status = 401
    type = "invalid_request_error"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class ModelNotFound(ServiceError):
    code = "model_not_found"
    status = 404
    type = "not_found_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model")
        self.model = model


class NotFound(ServiceError):
    code = "not_found"
    status = 404
    type = "not_found_error"


class _Unavailable(ServiceError):
    """Retryable 503s: ``Retry-After`` defaults to one second."""

    status = 503
    type = "service_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class NoWorkerAvailable(_Unavailable):
    code = "no_worker_available"


class ServiceUnavailable(_Unavailable):
    """A hop has no live instance (NATS answered "no responders")."""

    code = "service_unavailable"


class ShuttingDown(ServiceUnavailable):
    code = "shutting_down"


class WorkerLost(ServiceUnavailable):
    """The worker serving the request died and the request could not be migrated."""

    code = "worker_lost"


class FormatterLost(ServiceUnavailable):
    """The formatter of the request died (its worker found nobody on the stream subject)."""

    code = "formatter_lost"


class Overloaded(_Unavailable):
    """This instance already serves its limit of requests at once (the gateway's
    ``--max-concurrent-requests``); refused before any work was done for it."""

    code = "overloaded"


class AllWorkersBusy(_Unavailable):
    """Every live worker of the model is over a busy threshold (Dynamo's load shedding)."""

    code = "all_workers_busy"


class WorkerBusy(_Unavailable):
    """One worker's queue is full (``--max-waiting``); another worker may take the request."""

    code = "worker_busy"


class AllWorkersOverloaded(AllWorkersBusy):
    """``AllWorkersBusy`` answered with 529, as Dynamo does (``--busy-status 529``)."""

    status = 529
    type = "overloaded_error"


class QueueFull(_Unavailable):
    """The router queue is at its bound (``--queue-max-length``) or the request waited its
    longest (``--queue-max-wait-s``): Dynamo's overload status, with ``Retry-After``."""

    code = "queue_full"
    status = 529
    type = "overloaded_error"


class TokenBudgetExceeded(ServiceError):
    """The tenant spent its tokens per minute (``--admission-config``); ``Retry-After`` says
    when enough of them are a minute old. OpenAI's body: type ``tokens``, code
    ``rate_limit_exceeded``."""

    code = "rate_limit_exceeded"
    status = 429
    type = "tokens"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class UpstreamTimeout(ServiceError):
    code = "timeout"
    status = 504
    type = "timeout"
    retryable = True


class InternalError(ServiceError):
    pass


def _known_types() -> dict[str, str]:
    """``code`` → OpenAI ``type`` of every error class defined so far (first definer wins)."""
    found: dict[str, str] = {}
    pending: list[type[ServiceError]] = [ServiceError]
    while pending:
        cls = pending.pop(0)
        found.setdefault(cls.code, cls.type)
        pending.extend(cls.__subclasses__())
    return found


_STATUS_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    429: "tokens",
    503: "service_unavailable",
    504: "timeout",
}


def from_message(failed: RequestFailed) -> ServiceError:
    """Rebuild a typed error from its bus form, keeping the remote code, status and type."""
    error = ServiceError(failed.message, param=failed.param, retry_after_s=failed.retry_after_s)
    error.code = failed.code
    error.status = failed.status
    error.type = _known_types().get(failed.code) or _STATUS_TYPES.get(
        failed.status, ServiceError.type
    )
    error.retryable = failed.retry_after_s is not None
    return error
