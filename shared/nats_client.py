"""nats-py's client, writing each publish to the socket at once instead of a loop turn later.

nats-py appends a publish to a pending list and wakes a flusher task, which writes the list on
the event loop's next turn. On the request path every hop pays that turn (a task switch, a
future and a queue round trip) before its message leaves. Here a publish goes straight to the
socket when nothing is waiting in the pending list (order is kept) and the socket keeps up (the
transport's buffer is under ``DIRECT_MAX_BUFFERED``); otherwise, and while disconnected or for
messages with headers, nats-py's own path (pending list, flusher, ``drain`` backpressure)
takes it. A socket found closed (the server went away and nats-py has not noticed yet: uvloop
then refuses the write) hands the publish to that path too, which keeps it for the reconnect,
as nats-py does with every publish made while it reconnects. Measured in ``docs/benchmarks.md``
(c=1 budget).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.transport import TcpTransport
from nats.protocol import command

DIRECT_MAX_BUFFERED = 256 * 1024
"""Bytes the socket may have left unsent before publishes go back to the flusher (and its
``drain``): a slow server is not buried under an unbounded write buffer."""


class Client(NatsClient):
    """``nats.aio.client.Client`` with direct writes (see the module docstring)."""

    async def _send_publish(
        self,
        subject: str,
        reply: str,
        payload: bytes,
        payload_size: int,
        headers: dict[str, Any] | None,
    ) -> None:
        writer = self._direct_writer() if headers is None and subject else None
        if writer is not None:
            try:
                writer.write(command.pub_cmd(subject, reply, payload))
            except (RuntimeError, OSError):
                pass  # the socket closed under us: nats-py's path keeps it for the reconnect
            else:
                self.stats["out_msgs"] += 1
                self.stats["out_bytes"] += payload_size
                return
        await super()._send_publish(subject, reply, payload, payload_size, headers)

    def _direct_writer(self) -> asyncio.StreamWriter | None:
        """The socket's writer when a publish may go straight to it."""
        if self._pending or not self.is_connected or self.is_draining_pubs:
            return None
        transport = self._transport
        if type(transport) is not TcpTransport:  # TLS upgrades keep the class; websockets not
            return None
        writer = transport._io_writer  # nats-py keeps no public handle
        if writer is None or writer.transport.is_closing():  # lost, not yet noticed by nats-py
            return None
        if writer.transport.get_write_buffer_size() > DIRECT_MAX_BUFFERED:
            return None
        return writer
