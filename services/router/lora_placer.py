"""LoRA placement wiring: count adapters' requests in flight from every replica's decisions and
lifecycle events, and, on the replica that holds the placer lease, send the commands
``lora_placement.plan`` returns to the workers (decision 031).

Every replica counts the same requests (decisions are broadcast), so whichever holds the lease
plans from the whole fleet's traffic; only it sends commands, so two routers never order loads
against each other. Commands are idempotent at the workers and the cards are the truth: a plan
is made from the cards as they are, never from what the placer believes it ordered.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence

import nats.errors
import structlog
from nats.aio.client import Client

from services.router.lora_placement import (
    Action,
    AdapterDemand,
    PlacementSettings,
    plan,
    views,
)
from services.router.snapshots import Lease, lease_bucket
from shared import codec
from shared.messages import (
    LoadLoraAdapter,
    LoraAdapterAnswer,
    RouteDecision,
    UnloadLoraAdapter,
    WorkerCard,
)
from shared.subjects import Subjects
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

PLACER_LEASE_KEY = "lora-placer"
COMMAND_TIMEOUT_S = 10.0
"""A worker's answer to a load (which may read the adapter's weights) must come within this."""


class LoraPlacer:
    """One replica's share of adapter placement (see the module docstring)."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        *,
        router_id: str,
        cards: Callable[[], Sequence[WorkerCard]],
        settings: PlacementSettings,
        interval_s: float,
        cooldown_s: float,
        lease_ttl_s: float,
        replicas: int = 1,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._router_id = router_id
        self._cards = cards
        self._settings = settings
        self._interval_s = interval_s
        self._cooldown_s = cooldown_s
        self._lease_ttl_s = lease_ttl_s
        self._replicas = replicas
        self.enabled = enabled
        self._clock = clock
        self.demand = AdapterDemand()
        self._changed_at: dict[str, float] = {}
        self._lease: Lease | None = None
        self._tasks = TaskSet()

    async def start(self) -> None:
        if not self.enabled:
            return
        kv = await lease_bucket(
            self._nc.jetstream(), self._subjects, self._lease_ttl_s, replicas=self._replicas
        )
        self._lease = Lease(kv, self._router_id, key=PLACER_LEASE_KEY)
        self._tasks.spawn(self._loop(), name="router-lora-placer")

    async def stop(self) -> None:
        await self._tasks.close()
        if self._lease is not None:
            await self._lease.release()

    # --- demand (every replica) ----------------------------------------------------------------
    def on_decision(self, decision: RouteDecision) -> None:
        self.demand.add(decision.request_id, decision.worker_id, decision.lora_name)

    def on_end(self, request_id: str) -> None:
        self.demand.free(request_id)

    # --- placement (the lease holder) ----------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                assert self._lease is not None
                if await self._lease.refresh():
                    await self.place()
            except (nats.errors.Error, TimeoutError) as exc:
                log.warning("lora_placement_failed", error=repr(exc))

    async def place(self) -> list[Action]:
        """Plan from the live cards and the demand, per model, and send the commands."""
        cards = self._cards()
        self.demand.keep_only({c.worker_id for c in cards})
        now = self._clock()
        cooling = frozenset(
            lora for lora, at in self._changed_at.items() if now - at < self._cooldown_s
        )
        by_model: dict[str, list[WorkerCard]] = {}
        for card in cards:
            by_model.setdefault(card.model, []).append(card)
        sent: list[Action] = []
        for model in sorted(by_model):
            actions = plan(
                views(by_model[model], self.demand),
                self.demand.by_adapter,
                settings=self._settings,
                cooling=cooling,
            )
            for action in actions:
                self._changed_at[action.lora_name] = now
                if await self._send(action):
                    sent.append(action)
        return sent

    async def _send(self, action: Action) -> bool:
        command_id = f"lora-{uuid.uuid4().hex[:12]}"
        command: LoadLoraAdapter | UnloadLoraAdapter
        if action.kind == "load":
            command = LoadLoraAdapter(
                request_id=command_id,
                lora_name=action.lora_name,
                lora_path=action.lora_path,
                requested_by=self._router_id,
            )
        else:
            command = UnloadLoraAdapter(
                request_id=command_id, lora_name=action.lora_name, requested_by=self._router_id
            )
        subject = self._subjects.worker_lora(action.worker_id)
        try:
            reply = await self._nc.request(
                subject, codec.encode(command), timeout=COMMAND_TIMEOUT_S
            )
            answer = codec.decode(reply.data, LoraAdapterAnswer)
        except (nats.errors.Error, TimeoutError, codec.DecodeError) as exc:
            log.warning("lora_command_failed", action=action.kind, error=repr(exc))
            return False
        log.info(
            "lora_placed",
            action=action.kind,
            worker_id=action.worker_id,
            lora_name=action.lora_name,
            ok=answer.ok,
            changed=answer.changed,
            demand=self.demand.by_adapter.get(action.lora_name, 0),
        )
        return answer.ok
