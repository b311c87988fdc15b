"""Where vLLM publishes each data-parallel rank's KV events. Pure but for probing free ports.

Rank ``r`` publishes on the configured endpoints moved by ``offset_endpoint``, which is vLLM's
``ZmqEventPublisher.offset_endpoint_port`` (``vllm/distributed/kv_events.py``, read at commit
0181ea3173e53eea8cf04a86891488e3dc89bb34): a ``tcp`` endpoint's port plus the rank, an ``inproc``
endpoint suffixed ``_dp<rank>``, rank 0 unchanged, anything else (``ipc://``) refused for a rank
above 0. So a server with ``--data-parallel-size`` N and ``"endpoint": "tcp://*:5557"`` publishes
on ports 5557 to 5557 + N - 1, and its replay endpoint must start N ports further at least.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

__all__ = ["KvSource", "loopback_sources", "offset_endpoint", "overlapping", "rank_sources"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KvSource:
    """Where one data-parallel rank publishes its KV events."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    dp_rank: int = 0
    bind: bool = False
    """The subscriber binds ``endpoint`` and the publisher connects (see ``zmq_events``)."""


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """The endpoint vLLM's rank ``dp_rank`` uses for a configured ``endpoint``."""
    if dp_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{dp_rank}"
    if "tcp" in endpoint:
        if ":" not in endpoint:
            return endpoint
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + dp_rank}"  # a port that is no number: ValueError, as vLLM
    raise ValueError(
        f"vLLM cannot offset {endpoint!r} for data-parallel rank {dp_rank}: "
        "a data-parallel server publishes KV events on tcp (or inproc) endpoints"
    )


def rank_sources(
    endpoint: str,
    replay_endpoint: str | None,
    topic: str,
    dp_size: int,
    *,
    bind: bool = False,
) -> tuple[KvSource, ...]:
    """Every rank's endpoints, for a publisher configured with ``endpoint``/``replay_endpoint``."""
    return tuple(
        KvSource(
            endpoint=offset_endpoint(endpoint, rank),
            replay_endpoint=(
                offset_endpoint(replay_endpoint, rank) if replay_endpoint is not None else None
            ),
            topic=topic,
            dp_rank=rank,
            bind=bind,
        )
        for rank in range(dp_size)
    )


def _free_port_run(count: int, host: str = "127.0.0.1", tries: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports free on ``host`` just now."""
    for _ in range(tries):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        free = True
        for port in range(base, base + count):
            with socket.socket() as probe:
                try:
                    probe.bind((host, port))
                except OSError:
                    free = False
                    break
        if free:
            return base
    raise OSError(f"no {count} consecutive free ports on {host}")


def loopback_sources(dp_size: int, topic: str) -> tuple[str, str, tuple[KvSource, ...]]:
    """In-process data parallelism: ``(endpoint, replay_endpoint, sources)``, vLLM's
    ``KVEventsConfig`` endpoints on loopback ports (``ipc://`` cannot be offset per rank).
    vLLM connects its publishers to ``endpoint`` + rank, which the subscribers bind; it binds
    the replay sockets. Nothing listens beyond 127.0.0.1."""
    base = _free_port_run(2 * dp_size)
    endpoint = f"tcp://127.0.0.1:{base}"
    replay = f"tcp://127.0.0.1:{base + dp_size}"
    return endpoint, replay, rank_sources(endpoint, replay, topic, dp_size, bind=True)


def overlapping(sources: tuple[KvSource, ...]) -> list[str]:
    """Endpoints two ranks (or a rank's events and another's replay) would both bind."""
    seen: set[str] = set()
    clash: list[str] = []
    for source in sources:
        for endpoint in (source.endpoint, source.replay_endpoint):
            if endpoint is None:
                continue
            if endpoint in seen:
                clash.append(endpoint)
            seen.add(endpoint)
    return clash
