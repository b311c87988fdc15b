"""A stand-in for preprocessor + formatter, for gateway tests (HTTP and gRPC) on real NATS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from shared import codec
from shared.messages import Preprocess
from shared.subjects import Subjects

WAIT_S = 5.0

Send = Callable[[msgspec.Struct], Awaitable[None]]
Script = Callable[[Preprocess, Send], Coroutine[Any, Any, None]]


class FakeDownstream:
    """Answers each ``Preprocess`` the gateway publishes by running ``script`` on it."""

    def __init__(self, nc: Client, subjects: Subjects, script: Script) -> None:
        self._nc = nc
        self._subjects = subjects
        self.script = script
        self.seen: asyncio.Queue[Preprocess] = asyncio.Queue()
        self.release = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._nc.subscribe(self._subjects.preprocess, queue="preprocessor", cb=self._on)
        await self._nc.flush()

    async def _on(self, msg: Msg) -> None:
        request = codec.decode(msg.data, Preprocess)
        self.seen.put_nowait(request)

        async def send(message: msgspec.Struct) -> None:
            await self._nc.publish(request.reply_to, codec.encode(message))
            await self._nc.flush()

        task = asyncio.create_task(self.script(request, send))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def next_request(self) -> Preprocess:
        return await asyncio.wait_for(self.seen.get(), WAIT_S)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
