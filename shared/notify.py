"""Tell whoever started this process that it is ready: systemd's notify protocol (``sd_notify``).

A supervisor that sets ``NOTIFY_SOCKET`` (``jetserve up``, or systemd with ``Type=notify``)
receives one datagram, ``READY=1`` and ``MAINPID=<pid>``, once the service has started; without
the variable this does nothing. ``jetserve up`` says it is up only when every process has.
"""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"


def notify_ready() -> None:
    """Send ``READY=1`` to ``$NOTIFY_SOCKET`` (a path, or ``@name`` in the abstract namespace);
    a supervisor that went away is a warning, never a failure of the service."""
    address = os.environ.get(NOTIFY_SOCKET_ENV)
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(ready_message(os.getpid()), address)
    except OSError as exc:
        log.warning("ready_notify_failed", socket=address, error=str(exc))


def ready_message(pid: int) -> bytes:
    return f"READY=1\nMAINPID={pid}".encode()


def ready_pid(datagram: bytes) -> int | None:
    """The ``MAINPID`` of a ``READY=1`` datagram; ``None`` for anything else."""
    fields = dict(
        line.split("=", 1) for line in datagram.decode(errors="replace").splitlines() if "=" in line
    )
    if fields.get("READY") != "1":
        return None
    try:
        return int(fields["MAINPID"])
    except (KeyError, ValueError):
        return None
