"""One KV event feed per data-parallel rank: a ``KvRelay`` and a ``KvEventSubscriber`` each.

vLLM runs one engine core per data-parallel rank, each with its own ``ZmqEventPublisher``: its
own sequence numbers, replay buffer and block hashes, on its own endpoints (``kv_endpoints``).
Each batch names its rank (``data_parallel_rank``), which the rank's relay stamps on every
JetServe event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from services.vllm_worker.kv_endpoints import KvSource
from services.vllm_worker.kv_relay import KvRelay
from services.vllm_worker.zmq_events import KvEventSubscriber
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.records import EngineInput

__all__ = ["FedEngine", "KvFeeds"]


class KvFeeds:
    """Each rank's relay and subscriber; ``on_events`` gets every rank's JetServe events."""

    def __init__(
        self,
        sources: Sequence[KvSource],
        *,
        block_size: int,
        on_events: Callable[[list[AnyKvEvent]], None],
    ) -> None:
        self.sources = tuple(sources)
        self.relays = [KvRelay(block_size=block_size, dp_rank=s.dp_rank) for s in self.sources]
        self.subscribers = [
            KvEventSubscriber(
                relay,
                source.endpoint,
                on_events,
                replay_endpoint=source.replay_endpoint,
                topic=source.topic,
                bind=source.bind,
            )
            for relay, source in zip(self.relays, self.sources, strict=True)
        ]

    async def start(self) -> None:
        for subscriber in self.subscribers:
            await subscriber.start()

    async def stop(self) -> None:
        for subscriber in self.subscribers:
            await subscriber.stop()

    def relay(self, dp_rank: int) -> KvRelay | None:
        for relay, source in zip(self.relays, self.sources, strict=True):
            if source.dp_rank == dp_rank:
                return relay
        return None

    def hint(self, request: EngineInput) -> None:
        """``KvRelay.hint`` on the rank that runs ``request``."""
        relay = self.relay(request.dp_rank)
        if relay is not None:
            relay.hint(request.token_ids, request.lora_name, request.hash_seed)

    def dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """Every rank's blocks, each event naming its rank."""
        return [event for relay in self.relays for event in relay.dump(with_tokens=with_tokens)]


class FedEngine:
    """What the in-process and remote vLLM engines share about their feeds (``feeds`` is set
    once the engine has started, None without KV events)."""

    feeds: KvFeeds | None = None

    @property
    def relay(self) -> KvRelay | None:
        """Rank 0's relay (None without KV events)."""
        return self.feeds.relays[0] if self.feeds is not None else None

    @property
    def subscriber(self) -> KvEventSubscriber | None:
        """Rank 0's subscriber (None without KV events)."""
        return self.feeds.subscribers[0] if self.feeds is not None else None
