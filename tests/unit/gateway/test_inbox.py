"""A request's reply queue: order, and the bound on bytes waiting for a slow client."""

from __future__ import annotations

from services.gateway.core.bus import Inbox
from services.gateway.core.errors import ClientTooSlow
from shared.messages import ResponseChunk


def _chunk(size: int) -> ResponseChunk:
    return ResponseChunk(request_id="r", data=b"x" * size)


def test_replies_come_out_in_order_and_free_their_bytes() -> None:
    inbox = Inbox(max_bytes=100)
    for _ in range(3):
        inbox.put_nowait(_chunk(40))
        assert inbox.get_nowait() == _chunk(40)
    assert inbox.empty()


def test_a_backlog_past_the_bound_becomes_one_error_and_later_replies_are_dropped() -> None:
    inbox = Inbox(max_bytes=100)
    inbox.put_nowait(_chunk(60))
    inbox.put_nowait(_chunk(60))
    inbox.put_nowait(_chunk(1))
    error = inbox.get_nowait()
    assert isinstance(error, ClientTooSlow)
    assert (error.code, error.status) == ("client_too_slow", 503)
    assert inbox.empty()


def test_no_bound_by_default() -> None:
    inbox = Inbox()
    for _ in range(1000):
        inbox.put_nowait(_chunk(1000))
    assert all(inbox.get_nowait() == _chunk(1000) for _ in range(1000))
