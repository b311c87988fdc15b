"""A worker's answer on its ping subject (``Subjects.worker_ping``; decisions 017 and 018).

A router's probe is empty: answering at all is the answer. A formatter's ``WorkerPing`` asks
whether this worker holds that attempt of a request, answered with ``WorkerPong``; one that
does not decode is not answered (the asker times out, as for a worker that is gone).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from nats.aio.msg import Msg

from shared import codec
from shared.messages import WorkerPing, WorkerPong


def holds_nothing(_: WorkerPing) -> bool:
    """For workers that run no generation (embedders, media, tensor workers)."""
    return False


async def answer_ping(
    msg: Msg,
    holds: Callable[[WorkerPing], bool] = holds_nothing,
    *,
    on_undecodable: Callable[[codec.DecodeError], None] | None = None,
) -> None:
    """Answer a probe or a ``WorkerPing`` (``holds``: is that attempt here?)."""
    answer = b""
    if msg.data:
        try:
            ping = codec.decode(msg.data, WorkerPing)
        except codec.DecodeError as exc:
            if on_undecodable is not None:
                on_undecodable(exc)
            return
        answer = codec.encode(WorkerPong(request_id=ping.request_id, held=holds(ping)))
    with contextlib.suppress(Exception):  # the asker may be gone; nothing to do about it
        await msg.respond(answer)
