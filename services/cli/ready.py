"""Where ``jetserve up``'s processes say they are ready (``shared.notify``, systemd's protocol).

One datagram socket in a private temporary directory, passed to every child as
``NOTIFY_SOCKET``; ``poll`` collects the pids that have sent ``READY=1`` so far.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

from shared.notify import NOTIFY_SOCKET_ENV, ready_pid


class ReadyInbox:
    """Collects ``READY=1`` datagrams; ``env`` is what a child needs to send one."""

    def __init__(self) -> None:
        # Its own short directory: a socket path must stay under ~100 bytes (macOS: 104).
        self._dir = Path(tempfile.mkdtemp(prefix="jetserve-ready-"))
        self.address = str(self._dir / "notify")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(self.address)
        self._sock.setblocking(False)
        self._ready: set[int] = set()

    @property
    def env(self) -> dict[str, str]:
        return {NOTIFY_SOCKET_ENV: self.address}

    def poll(self) -> set[int]:
        """Every pid that has said ``READY=1`` (reads what has arrived, never waits)."""
        while True:
            try:
                datagram = self._sock.recv(4096)
            except (BlockingIOError, OSError):
                return set(self._ready)
            pid = ready_pid(datagram)
            if pid is not None:
                self._ready.add(pid)

    def close(self) -> None:
        self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)
