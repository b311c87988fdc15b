"""Busy thresholds set at run time (``POST /busy_threshold``) reach every router replica, from
the broadcast and from the KV bucket at start; the gateway bus stores and lists them."""

from __future__ import annotations

from typing import Any

from services.gateway.config import GatewayConfig
from services.gateway.core.bus import NatsBus
from services.router.load import BusyThresholds
from shared import busy_thresholds, codec
from shared.bus import connect
from shared.messages import BusyThresholdsChanged
from shared.subjects import Subjects
from tests.integration.router_kv_support import running_router
from tests.support import eventually_async

MODEL = "m"


async def set_thresholds(nats_url: str, subjects: Subjects, **values: Any) -> BusyThresholdsChanged:
    """What the gateway does: store, then broadcast with the stored revision."""
    nc = await connect(nats_url, name="test-gateway")
    try:
        message = BusyThresholdsChanged(model=MODEL, **values)
        stored = await busy_thresholds.store(nc.jetstream(), subjects, message)
        await nc.publish(subjects.busy_threshold, codec.encode(stored))
        await nc.flush()
        return stored
    finally:
        await nc.drain()


async def test_every_replica_applies_a_broadcast(nats_url: str, subjects: Subjects) -> None:
    async with (
        running_router(nats_url, subjects, router_id="r1") as one,
        running_router(nats_url, subjects, router_id="r2") as two,
    ):
        await set_thresholds(nats_url, subjects, active_decode_blocks_threshold=0.25)
        wanted = BusyThresholds(decode_blocks_frac=0.25)
        await eventually_async(lambda: one.core.busy_of(MODEL) == wanted, message="r1")
        await eventually_async(lambda: two.core.busy_of(MODEL) == wanted, message="r2")


async def test_a_router_started_later_reads_the_bucket(nats_url: str, subjects: Subjects) -> None:
    await set_thresholds(nats_url, subjects, active_prefill_tokens_threshold=64)
    async with running_router(nats_url, subjects) as router:
        assert router.core.busy_of(MODEL) == BusyThresholds(prefill_tokens=64)


async def test_clearing_gives_the_router_its_settings_back(
    nats_url: str, subjects: Subjects
) -> None:
    async with running_router(nats_url, subjects, active_prefill_tokens_threshold=9) as router:
        await set_thresholds(nats_url, subjects, active_prefill_tokens_threshold_frac=0.5)
        frac = BusyThresholds(prefill_tokens_frac=0.5)
        await eventually_async(lambda: router.core.busy_of(MODEL) == frac, message="set")
        await set_thresholds(nats_url, subjects)
        own = BusyThresholds(prefill_tokens=9)
        await eventually_async(lambda: router.core.busy_of(MODEL) == own, message="cleared")


async def test_the_gateway_bus_stores_lists_and_broadcasts(
    nats_url: str, subjects: Subjects
) -> None:
    config = GatewayConfig(nats_url=nats_url, namespace=subjects.namespace, gateway_id="gw")
    bus = NatsBus(config, subjects=subjects)
    await bus.start()
    nc = await connect(nats_url, name="test-listener")
    heard = await nc.subscribe(subjects.busy_threshold)
    try:
        assert await bus.busy_thresholds() == []
        message = BusyThresholdsChanged(model=MODEL, active_decode_blocks_threshold=0.5)
        first = await bus.set_busy_thresholds(message)
        second = await bus.set_busy_thresholds(
            BusyThresholdsChanged(model="other", active_prefill_tokens_threshold=3)
        )
        assert second.revision > first.revision > 0
        assert sorted(m.model for m in await bus.busy_thresholds()) == [MODEL, "other"]
        assert await bus.busy_thresholds(MODEL) == [first]
        broadcast = codec.decode((await heard.next_msg(timeout=5)).data, BusyThresholdsChanged)
        assert broadcast == first
    finally:
        await heard.unsubscribe()  # the second broadcast is still queued: drain would wait
        await nc.drain()
        await bus.stop()
