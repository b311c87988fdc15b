"""Typed errors keep their code and status across the bus and render OpenAI bodies."""

import json

from shared.errors import (
    ContextLengthExceeded,
    ModelNotFound,
    NoWorkerAvailable,
    from_message,
    http_status_of,
)


def test_error_body_is_openai_shaped() -> None:
    body = json.loads(ModelNotFound("m").body())
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["type"] == "not_found_error"
    assert "m" in body["error"]["message"]


def test_context_length_message_names_the_limit() -> None:
    exc = ContextLengthExceeded(limit=100, requested=150, prompt_tokens=120)
    assert "100" in exc.message
    assert exc.http_status == 400


def test_retryable_errors_carry_retry_after() -> None:
    assert NoWorkerAvailable("none").headers() == {"Retry-After": "1"}


def test_remote_error_keeps_code_status_and_type() -> None:
    failed = NoWorkerAvailable("none").to_message("r1")
    rebuilt = from_message(failed)
    assert http_status_of(rebuilt) == 503
    body = json.loads(rebuilt.body())["error"]
    assert body["code"] == "no_worker_available"
    assert body["type"] == "service_unavailable"
    assert rebuilt.headers() == {"Retry-After": "1"}
