"""Error bodies the client sees: OpenAI envelope, status, codes, in-band stream errors."""

from __future__ import annotations

import msgspec

from services.gateway.core.errors import ClientDisconnected
from services.gateway.http import sse
from shared.errors import UpstreamTimeout, from_message
from shared.messages import RequestFailed


def test_remote_failure_keeps_its_code_and_status() -> None:
    failed = RequestFailed(request_id="r", code="no_worker_available", message="m", status=503)
    error = from_message(failed)
    assert (error.code, error.status) == ("no_worker_available", 503)


def test_local_error_code_is_its_class_code() -> None:
    assert ClientDisconnected("gone").code == "client_disconnected"


def test_error_frame_is_one_sse_event_with_the_openai_error() -> None:
    frame = sse.error_frame(UpstreamTimeout("slow"))
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    assert msgspec.json.decode(frame[6:])["error"] == {
        "message": "slow",
        "type": "timeout",
        "code": "timeout",
        "param": None,
    }


def test_error_tail_ends_the_stream_with_done() -> None:
    assert sse.error_tail(UpstreamTimeout("slow")).endswith(b"\n\ndata: [DONE]\n\n")
