"""Typed errors keep their code and status across the bus and render OpenAI bodies."""

import json

from shared.errors import (
    ContextLengthExceeded,
    ModelNotFound,
    NoWorkerAvailable,
    from_message,
)


def test_error_body_is_openai_shaped() -> None:
    body = json.loads(ModelNotFound("m").body())
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["type"] == "not_found_error"
    assert "m" in body["error"]["message"]


def test_context_length_message_names_the_limit() -> None:
    exc = ContextLengthExceeded(limit=100, requested=150, prompt_tokens=120)
    assert "100" in exc.message
    assert exc.status == 400


def test_retryable_errors_carry_retry_after() -> None:
    assert NoWorkerAvailable("none").headers() == {"Retry-After": "1"}


def test_remote_error_keeps_code_status_and_type() -> None:
    failed = NoWorkerAvailable("none").to_message("r1")
    rebuilt = from_message(failed)
    assert rebuilt.status == 503
    body = json.loads(rebuilt.body())["error"]
    assert body["code"] == "no_worker_available"
    assert body["type"] == "service_unavailable"
    assert rebuilt.headers() == {"Retry-After": "1"}


def test_remote_error_counts_under_its_remote_code() -> None:
    """The code a hop logs and counts is the remote one, never ``internal_error``."""
    failed = ModelNotFound("m").to_message("r1")
    assert from_message(failed).code == "model_not_found"


def test_unknown_remote_code_gets_the_type_of_its_status() -> None:
    from shared.messages import RequestFailed

    failed = RequestFailed(request_id="r", code="brand_new", message="m", status=404)
    rebuilt = from_message(failed)
    assert (rebuilt.code, rebuilt.type) == ("brand_new", "not_found_error")
