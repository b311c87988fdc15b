"""Typed expected failures: stable codes, HTTP status, OpenAI error type, ``RequestFailed``."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from shared.messages import RequestFailed


class ServiceError(Exception):
    """Base for expected failures. ``code`` is stable; the message is for humans."""

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500
    error_type: ClassVar[str] = "internal_server_error"
    retryable: ClassVar[bool] = False

    def __init__(
        self, message: str, *, param: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        """The HTTP status (a remote error keeps the one its service chose)."""
        return self.http_status

    @property
    def wire_code(self) -> str:
        """The stable code clients see."""
        return self.code

    @property
    def wire_type(self) -> str:
        """The OpenAI error ``type``."""
        return self.error_type

    def to_message(self, request_id: str) -> RequestFailed:
        """The bus form of this error, for the request's reply subject."""
        return RequestFailed(
            request_id=request_id,
            code=self.wire_code,
            message=self.message,
            status=self.status,
            retry_after_s=self.retry_after_s,
            param=self.param,
        )

    def body(self) -> bytes:
        """The OpenAI error envelope ``{"error": {"message", "type", "code", "param"}}``."""
        return msgspec.json.encode(
            {
                "error": {
                    "message": self.message,
                    "type": self.wire_type,
                    "code": self.wire_code,
                    "param": self.param,
                }
            }
        )

    def headers(self) -> dict[str, str]:
        """Extra HTTP headers (``Retry-After`` for retryable errors)."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class InvalidRequest(ServiceError):
    code = "invalid_request"
    http_status = 400
    error_type = "invalid_request_error"


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


class ModelNotFound(ServiceError):
    code = "model_not_found"
    http_status = 404
    error_type = "not_found_error"

    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.", param="model")
        self.model = model


class NotFound(ServiceError):
    code = "not_found"
    http_status = 404
    error_type = "not_found_error"


class NoWorkerAvailable(ServiceError):
    code = "no_worker_available"
    http_status = 503
    error_type = "service_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class ServiceUnavailable(ServiceError):
    """A hop has no live instance (NATS answered "no responders")."""

    code = "service_unavailable"
    http_status = 503
    error_type = "service_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class ShuttingDown(ServiceUnavailable):
    code = "shutting_down"


class AllWorkersBusy(ServiceError):
    """Every live worker of the model is over a busy threshold (Dynamo's load shedding)."""

    code = "all_workers_busy"
    http_status = 503
    error_type = "service_unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class AllWorkersOverloaded(AllWorkersBusy):
    """``AllWorkersBusy`` answered with 529, as Dynamo does (``--busy-status 529``)."""

    http_status = 529
    error_type = "overloaded_error"


class UpstreamTimeout(ServiceError):
    code = "timeout"
    http_status = 504
    error_type = "timeout"
    retryable = True


class InternalError(ServiceError):
    pass


_BY_CODE: dict[str, type[ServiceError]] = {}


def _register(cls: type[ServiceError]) -> None:
    _BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _register(sub)


_register(ServiceError)


class RemoteError(ServiceError):
    """A failure reported by another service, rebuilt at the gateway with its own status/code."""

    def __init__(self, failed: RequestFailed) -> None:
        super().__init__(failed.message, param=failed.param, retry_after_s=failed.retry_after_s)
        self._code = failed.code
        self._status = failed.status
        known = _BY_CODE.get(failed.code)
        self._type = known.error_type if known else _type_for_status(failed.status)

    @property
    def remote_code(self) -> str:
        return self._code

    @property
    def status(self) -> int:
        return self._status

    @property
    def wire_code(self) -> str:
        return self._code

    @property
    def wire_type(self) -> str:
        return self._type


def _type_for_status(status: int) -> str:
    return {
        400: "invalid_request_error",
        404: "not_found_error",
        503: "service_unavailable",
        504: "timeout",
    }.get(status, "internal_server_error")


def http_status_of(exc: ServiceError) -> int:
    """The HTTP status for any ServiceError, remote ones included."""
    return exc.status


def from_message(failed: RequestFailed) -> RemoteError:
    """Rebuild a typed error from its bus form (keeps the remote code and status)."""
    return RemoteError(failed)
