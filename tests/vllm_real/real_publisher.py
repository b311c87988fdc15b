"""vLLM's own KV event publisher behind the interface the fakes use of ``FakeKvPublisher``.

``RealKvPublisher`` runs vLLM's ``vllm.distributed.kv_events.ZmqEventPublisher`` (its PUB
socket, publisher thread, replay buffer and ROUTER replay socket) on loopback TCP ports the OS
picks, and turns the fakes' ``Stored`` / ``Removed`` / ``Cleared`` into vLLM's own
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` in a ``KVEventBatch``: what goes over
the socket is vLLM's own encoding of vLLM's own structs. ``FakeAsyncLLM`` (the engine stays a
fake: vLLM's real ``AsyncLLM`` needs a GPU) publishes through it.

Import only where vllm is installed (``make test-vllm``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable
from typing import Any, Literal

import zmq
from vllm.distributed import kv_events

from tests.fakes.vllm_fakes import FakeEvent, Removed, Stored

__all__ = ["RealKvPublisher", "socket_endpoint", "to_vllm_event"]

HOST = "tcp://127.0.0.1"


def socket_endpoint(socket: Any) -> str:
    """The address a socket bound (``tcp://127.0.0.1:*`` → the port the OS picked)."""
    value = socket.getsockopt(zmq.LAST_ENDPOINT)
    return value.decode() if isinstance(value, bytes) else str(value)


def to_vllm_event(event: FakeEvent) -> Any:
    """A fake's event as vLLM's struct (fields as ``FakeKvPublisher``'s map layout fills them)."""
    if isinstance(event, Stored):
        return kv_events.BlockStored(
            block_hashes=list(event.block_hashes),
            parent_block_hash=event.parent_block_hash,
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=None,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=event.extra_keys,
            group_idx=event.group_idx,
            kv_cache_spec_kind="full_attention" if event.group_idx is not None else None,
        )
    if isinstance(event, Removed):
        return kv_events.BlockRemoved(
            block_hashes=list(event.block_hashes), medium=event.medium, group_idx=event.group_idx
        )
    return kv_events.AllBlocksCleared()


def _layout() -> Literal["array", "map"]:
    """How this vLLM encodes an event: arrays (``array_like=True``, before vLLM PR #42892) or
    maps tagged ``type`` (after it; vLLM 0.33.0)."""
    return "array" if kv_events.BlockStored.__struct_config__.array_like else "map"


class RealKvPublisher:
    """vLLM's ``ZmqEventPublisher`` with ``FakeKvPublisher``'s interface (``KvPublisher`` in
    ``tests/fakes/vllm_fakes.py``): ``endpoint``, ``replay_endpoint``, ``topic``, ``layout``,
    ``publish(events)``, ``publish_empty()``, ``shutdown()``.

    There is no ``publish_raw``: vLLM's publisher only sends the ``KVEventBatch`` structs it
    encodes itself; ``publish_empty`` sends an empty one (``until_subscribed``'s probe).
    """

    def __init__(self, *, topic: str = "kv", buffer_steps: int = 10_000, replay: bool = True):
        kwargs: dict[str, Any] = {
            "endpoint": f"{HOST}:*",
            "replay_endpoint": f"{HOST}:*" if replay else None,
            "buffer_steps": buffer_steps,
            "topic": topic,
        }
        if "data_parallel_rank" in inspect.signature(kv_events.ZmqEventPublisher).parameters:
            kwargs["data_parallel_rank"] = 0
        self._publisher = kv_events.ZmqEventPublisher(**kwargs)
        self.topic = topic
        self.layout: Literal["array", "map"] = _layout()
        # vLLM keeps the wildcard endpoint it was given: the bound ports come from the sockets.
        self.endpoint = socket_endpoint(self._publisher._pub)
        replay_socket = self._publisher._replay
        self.replay_endpoint: str | None = (
            socket_endpoint(replay_socket) if replay_socket is not None else None
        )
        self.published = 0

    def publish(self, events: Iterable[FakeEvent]) -> None:
        batch = [to_vllm_event(e) for e in events]
        if not batch:
            return
        self._send(batch)

    def publish_empty(self) -> None:
        self._send([])

    def _send(self, events: list[Any]) -> None:
        self._publisher.publish(kv_events.KVEventBatch(ts=time.time(), events=events))
        self.published += 1

    def shutdown(self) -> None:
        """vLLM's own shutdown: drains the queue, joins the thread, closes both sockets."""
        self._publisher.shutdown()
