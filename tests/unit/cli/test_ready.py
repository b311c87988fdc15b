"""``jetserve up``'s readiness: a service's ``READY=1`` (``shared.notify``) reaches the launcher's
inbox over a real datagram socket; anything else sent there is ignored."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from services.cli.ready import ReadyInbox
from shared.notify import NOTIFY_SOCKET_ENV, notify_ready, ready_message, ready_pid


@pytest.fixture
def inbox() -> Iterator[ReadyInbox]:
    box = ReadyInbox()
    yield box
    box.close()


def test_a_service_that_started_is_ready(
    inbox: ReadyInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert inbox.poll() == set()
    monkeypatch.setenv(NOTIFY_SOCKET_ENV, inbox.address)
    notify_ready()
    assert inbox.poll() == {os.getpid()}
    assert inbox.poll() == {os.getpid()}  # remembered once read


def test_other_datagrams_are_ignored(inbox: ReadyInbox) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        for junk in (b"STATUS=loading", b"READY=1", b"READY=0\nMAINPID=7", b"\xff\xfe"):
            sock.sendto(junk, inbox.address)
        sock.sendto(ready_message(42), inbox.address)
    assert inbox.poll() == {42}


def test_without_a_supervisor_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NOTIFY_SOCKET_ENV, raising=False)
    notify_ready()  # no socket to send to: returns quietly


def test_a_supervisor_that_went_away_is_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    box = ReadyInbox()
    monkeypatch.setenv(NOTIFY_SOCKET_ENV, box.address)
    box.close()
    notify_ready()  # ECONNREFUSED / ENOENT: a warning, the service goes on


@pytest.mark.parametrize(
    ("datagram", "pid"),
    [
        (b"READY=1\nMAINPID=12", 12),
        (b"MAINPID=12\nREADY=1\nSTATUS=up", 12),
        (b"READY=1", None),
        (b"READY=1\nMAINPID=x", None),
        (b"RELOADING=1\nMAINPID=12", None),
    ],
)
def test_ready_pid(datagram: bytes, pid: int | None) -> None:
    assert ready_pid(datagram) == pid
