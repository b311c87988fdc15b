"""Subscribe to vLLM's KV events over ZMQ and hand them on under JetServe's hashes.

The I/O half of the relay (``kv_wire`` decodes, ``kv_relay`` decides). It follows vLLM's
``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``, read at commits
b4e69e0af33f4698e157a262cc787fe61983cd3d and 0181ea3173e53eea8cf04a86891488e3dc89bb34):

- a SUB socket connects to the publisher's PUB endpoint and subscribes to its topic; each
  message is ``(topic, seq, payload)``, ``seq`` 8 bytes big-endian;
- on a gap, at start, and whenever the feed has been quiet for ``idle_replay_s`` (PUB/SUB
  drops silently: a subscription still being set up, a full queue), a DEALER socket asks the
  publisher's ROUTER replay endpoint for every buffered batch from the first missing ``seq``:
  it sends ``(b"", seq)``, gets ``(b"", seq, payload)`` frames in order, then ``(b"", END_SEQ,
  b"")``; vLLM 0.33 adds the topic (``(b"", topic, seq, payload)``, end ``(b"", b"", END_SEQ,
  b"")``: ``_service_replay`` as installed by ``make test-vllm``), and both are read. A batch
  older than the buffer is lost for good (``KvRelay.lost``);
- a live ``seq`` at or below the last one means the publisher restarted: the relay starts over.

``bind``: the SUB socket binds and the publisher connects. vLLM's publisher binds an endpoint
with ``*``, ``::``, ``ipc://`` or ``inproc://`` and connects to any other
(``ZmqEventPublisher._socket_setup``), so a ``tcp://127.0.0.1:port`` endpoint (in-process
data-parallel ranks: one loopback port per rank, nothing bound on other interfaces) is bound here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import structlog
import zmq
import zmq.asyncio

from services.vllm_worker.kv_relay import Gap, KvRelay
from services.vllm_worker.kv_wire import END_SEQ, WireError, decode_batch, decode_seq, encode_seq
from shared.messages import AnyKvEvent
from shared.tasks import cancel_and_wait

log = structlog.get_logger(__name__)

__all__ = ["KvEventSubscriber"]


def replay_frames(frames: list[bytes]) -> tuple[bytes, bytes] | None:
    """``(seq, payload)`` of a replay reply as a DEALER receives it: ``(b"", seq, payload)``
    (vLLM before 0.33) or ``(b"", topic, seq, payload)`` (0.33); None for anything else."""
    if len(frames) == 3 and frames[0] == b"":
        return frames[1], frames[2]
    if len(frames) == 4 and frames[0] == b"":
        return frames[2], frames[3]
    return None


class KvEventSubscriber:
    """One engine's KV event feed: ``on_events`` gets each batch's JetServe events."""

    def __init__(
        self,
        relay: KvRelay,
        endpoint: str,
        on_events: Callable[[list[AnyKvEvent]], None],
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        idle_replay_s: float = 1.0,
        bind: bool = False,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.relay = relay
        self.endpoint = endpoint
        self.bind = bind
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.replay_timeout_s = replay_timeout_s
        self.idle_replay_s = idle_replay_s
        self.batches = 0
        """Batches applied (live or replayed)."""
        self.replays = 0
        self.received = 0
        """Messages read from the SUB socket."""
        self._on_events = on_events
        self._last_live = -1
        self._own_context = context is None
        self._context = context or zmq.asyncio.Context()
        self._sub: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect (or bind) and start reading (never waits for the publisher)."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        if self.bind:
            sub.bind(self.endpoint)
        else:
            sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.create_task(self._run(), name="vllm-kv-events")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait((self._task,))
            self._task = None
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None
        if self._own_context and not self._context.closed:
            self._context.term()

    async def _run(self) -> None:
        assert self._sub is not None
        await self._guarded(self._replay(self.relay.next_seq))  # what came before we joined
        while True:
            idle = self.replay_endpoint is not None and self.idle_replay_s > 0
            if idle and not await self._sub.poll(int(self.idle_replay_s * 1000)):
                # PUB/SUB drops silently (a slow joiner, a full queue): a quiet feed asks the
                # replay socket for anything after the last batch it saw.
                await self._guarded(self._replay(self.relay.next_seq))
                continue
            frames = await self._sub.recv_multipart()
            self.received += 1
            await self._guarded(self._on_message(frames))

    async def _guarded(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad batch must not end the feed: log it once, go on
            log.exception("kv_event_batch_failed")

    async def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            log.warning("kv_event_frames_unexpected", frames=len(frames))
            return
        seq = decode_seq(frames[1])
        if seq <= self._last_live:
            # A live feed only goes forward: the publisher restarted (a new engine, an empty
            # cache, numbering from 0 again).
            log.warning("kv_publisher_restarted", seq=seq, last=self._last_live)
            self._emit(self.relay.lost(seq))
        self._last_live = seq
        check = self.relay.check(seq)
        if check is False:
            return
        if isinstance(check, Gap):
            await self._replay(check.from_seq)
            if self.relay.next_seq > seq:
                return  # the replay brought this batch too
            if self.relay.next_seq < seq:
                log.warning("kv_events_lost", first=self.relay.next_seq, resume=seq)
                self._emit(self.relay.lost(seq))
        self._apply(seq, frames[2])

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except WireError as exc:
            log.warning("message_undecodable", kind="vllm_kv_event_batch", seq=seq, error=str(exc))
            self._emit(self.relay.lost(seq + 1))
            return
        self.batches += 1
        self._emit(self.relay.apply(seq, batch))

    def _emit(self, events: list[AnyKvEvent]) -> None:
        if events:
            self._on_events(events)

    async def _replay(self, from_seq: int) -> None:
        """Ask the replay socket for batches from ``from_seq`` and apply what it has."""
        if self.replay_endpoint is None:
            return
        self.replays += 1
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart((b"", encode_seq(from_seq)))
            while True:
                async with asyncio.timeout(self.replay_timeout_s):
                    frames = await dealer.recv_multipart()
                reply = replay_frames(frames)
                if reply is None:
                    log.warning("kv_replay_frames_unexpected", frames=len(frames))
                    return
                seq_bytes, payload = reply
                seq = decode_seq(seq_bytes)
                if seq == END_SEQ:
                    return
                check = self.relay.check(seq)
                if check is False:
                    continue
                if isinstance(check, Gap):  # older than the publisher's buffer
                    log.warning("kv_events_lost", first=self.relay.next_seq, resume=seq)
                    self._emit(self.relay.lost(seq))
                self._apply(seq, payload)
        except TimeoutError:
            log.warning("kv_replay_timed_out", from_seq=from_seq)
        finally:
            dealer.close(linger=0)
