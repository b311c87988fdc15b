"""For the gateway's tests (HTTP and gRPC) on real NATS: the real app served by uvicorn in the
test's event loop, and a stand-in for preprocessor + formatter (it numbers the chunks and answers
``StreamResume`` for the requests it is serving, as the formatter does, decision 018)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import uvicorn
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.gateway.config import GatewayConfig
from services.gateway.core.bus import NatsBus
from services.gateway.http.app import create_app
from shared import codec
from shared.messages import Preprocess, ResponseChunk, StreamHeld, StreamResume
from shared.subjects import Subjects
from tests.support import eventually_async, eventually_awaited, free_port

WAIT_S = 5.0

Send = Callable[[msgspec.Struct], Awaitable[None]]
Script = Callable[[Preprocess, Send], Coroutine[Any, Any, None]]


class FakeDownstream:
    """Answers each ``Preprocess`` the gateway publishes by running ``script`` on it.

    ``ResponseChunk``s are numbered (``seq``) in the order sent; while a script runs, a
    ``StreamResume`` for its request is answered ``StreamHeld`` (nothing to replay: no chunk
    is lost on one server).
    """

    def __init__(self, nc: Client, subjects: Subjects, script: Script) -> None:
        self._nc = nc
        self._subjects = subjects
        self.script = script
        self.seen: asyncio.Queue[Preprocess] = asyncio.Queue()
        self.release = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sent: dict[str, int] = {}
        """Per request being served: how many chunks were sent."""

    async def start(self) -> None:
        await self._nc.subscribe(self._subjects.preprocess, queue="preprocessor", cb=self._on)
        await self._nc.subscribe(self._subjects.stream_resume, cb=self._on_resume)
        await self._nc.flush()

    async def _on(self, msg: Msg) -> None:
        request = codec.decode(msg.data, Preprocess)
        self.seen.put_nowait(request)
        rid = request.request_id
        self._sent[rid] = 0

        async def send(message: msgspec.Struct) -> None:
            if isinstance(message, ResponseChunk):
                message = msgspec.structs.replace(message, seq=self._sent[rid])
                self._sent[rid] += 1
            await self._nc.publish(request.reply_to, codec.encode(message))
            await self._nc.flush()

        task = asyncio.create_task(self.script(request, send))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._sent.pop(rid, None))

    async def _on_resume(self, msg: Msg) -> None:
        resume = codec.decode(msg.data, StreamResume)
        sent = self._sent.get(resume.request_id)
        if sent is not None:
            held = StreamHeld(request_id=resume.request_id, holder="formatter", next_seq=sent)
            await msg.respond(codec.encode(held))

    async def next_request(self) -> Preprocess:
        return await asyncio.wait_for(self.seen.get(), WAIT_S)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass
class Gateway:
    config: GatewayConfig
    server: uvicorn.Server

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.config.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.config.grpc_port}"


def gateway_config(
    nats_url: str, subjects: Subjects, timeout_s: float, **overrides: Any
) -> GatewayConfig:
    """A test gateway's settings: free ports, one timeout for the first and every next chunk."""
    settings: dict[str, Any] = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "request_timeout_s": timeout_s,
        "stream_idle_timeout_s": timeout_s,
        "gateway_id": "gw1",
        **overrides,
    }
    return GatewayConfig(nats_url=nats_url, namespace=subjects.namespace, **settings)


@contextlib.asynccontextmanager
async def served_gateway(
    config: GatewayConfig, *, serve_grpc: bool = False
) -> AsyncIterator[Gateway]:
    """The real gateway app under uvicorn (httptools) on ``config.http_port``, in this loop."""
    app = create_app(config, bus=NatsBus(config), serve_grpc=serve_grpc)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=config.http_port,
            http="httptools",
            ws="none",
            lifespan="on",
            log_config=None,
            access_log=False,
        )
    )
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), "uvicorn to start")
    assert server.started, "gateway failed to start"
    try:
        yield Gateway(config, server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, WAIT_S * 2)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` after ``timeout_s``."""
    await eventually_async(
        condition, timeout_s=timeout_s, message=f"timed out waiting for {what}", interval_s=0.01
    )


async def until_live(http: httpx.AsyncClient, timeout_s: float = WAIT_S) -> None:
    """Return once the gateway's ``/health`` is 200: it sees a live worker for the model."""

    async def healthy() -> bool:
        return (await http.get("/health")).status_code == 200

    await eventually_awaited(
        healthy, timeout_s=timeout_s, message="the model never became live (/health not 200)"
    )
