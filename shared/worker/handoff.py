"""Disaggregated serving on a worker: prefill phases it runs, decode phases whose source blocks
it has not released yet, and the data-parallel rank of each request. Pure: the runtime publishes
what comes out (``take_ready``) and passes the wall clock in.

Prefill phase (``Generate.prefill_to``): nothing streams to a formatter. The request's emissions
are gathered here; its last one becomes ``PrefillResult`` (the engine's ``kv_transfer_params``
as the ``KvTransfer`` handle, expiring after the engine's pin timeout) for ``prefill_to``; a
request that ends otherwise (cancelled, failed, shut down) becomes ``RequestFailed`` there.

Decode phase (``Generate.kv_transfer``): the request streams like any other; its prefill worker
is told once (``KvRelease`` on ``kv_release(source)``) when the blocks are pulled, or when the
request ends before that (``pop_release``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.errors import ServiceError
from shared.messages import Generate, KvTransfer, PrefillResult, RequestFailed
from shared.worker.records import Emission

__all__ = ["PREFILL_CANCELLED", "Handoffs", "Prefill", "RequestCancelled"]

PREFILL_CANCELLED = "the prefill phase was cancelled"


class RequestCancelled(ServiceError):
    """A prefill phase cancelled (the client went away, or its router gave up): what its router
    hears instead of a ``PrefillResult``. Not retryable."""

    code = "cancelled"
    status = 499
    type = "invalid_request_error"


@dataclass(slots=True)
class Prefill:
    """One prefill phase in flight on this worker."""

    prefill_to: str
    attempt: int
    dp_rank: int
    prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0


class Handoffs:
    """A worker's prefill phases, pending releases and request ranks (see the module doc)."""

    def __init__(self, worker_id: str, *, pin_timeout_s: float = 0.0) -> None:
        self.worker_id = worker_id
        self.pin_timeout_s = pin_timeout_s
        """The engine's pin timeout (``EngineFacts.kv_pin_timeout_s``; 0 = it names none)."""
        self.prefills: dict[str, Prefill] = {}
        self.releases: dict[str, str] = {}
        """Decode phases not released yet: request id -> ``kv_release`` subject of the source."""
        self.ranks: dict[str, int] = {}
        """Requests on a rank above 0: request id -> rank (for their lifecycle phases)."""
        self.ready: list[tuple[str, PrefillResult | RequestFailed]] = []
        """Answers for routers, with their subjects, not yet published."""

    def open_prefill(self, gen: Generate) -> None:
        """A prefill phase was admitted."""
        self.prefills[gen.request_id] = Prefill(
            gen.prefill_to, gen.attempt, gen.dp_rank, prompt_tokens=len(gen.token_ids)
        )

    def attempt(self, request_id: str) -> int | None:
        """The ``Generate.attempt`` of a prefill phase running here (None: none is)."""
        prefill = self.prefills.get(request_id)
        return prefill.attempt if prefill is not None else None

    def add(self, emission: Emission, now: float) -> bool:
        """A prefill phase's emission; True once it is done (its answer is ready to go)."""
        prefill = self.prefills.get(emission.request_id)
        if prefill is None:
            return False
        if emission.choice == 0:
            prefill.token_ids.extend(emission.token_ids)
        if emission.cached_tokens:
            prefill.cached_tokens = emission.cached_tokens
        if not emission.done:
            return False
        del self.prefills[emission.request_id]
        if emission.finish_reason == "cancelled":
            failure = RequestCancelled(PREFILL_CANCELLED)
            self.ready.append((prefill.prefill_to, failure.to_message(emission.request_id)))
            return True
        expires_at = now + self.pin_timeout_s if self.pin_timeout_s > 0 else 0.0
        result = PrefillResult(
            request_id=emission.request_id,
            worker_id=self.worker_id,
            dp_rank=prefill.dp_rank,
            kv_transfer=KvTransfer(
                source_worker_id=self.worker_id,
                source_dp_rank=prefill.dp_rank,
                params=dict(emission.kv_transfer_params or {}),
                expires_at=expires_at,
            ),
            token_ids=tuple(prefill.token_ids),
            prompt_tokens=emission.prompt_tokens or prefill.prompt_tokens,
            cached_tokens=prefill.cached_tokens,
        )
        self.ready.append((prefill.prefill_to, result))
        return True

    def fail(self, request_id: str, error: ServiceError) -> bool:
        """End a prefill phase with ``error`` for its router; False if none runs here."""
        prefill = self.prefills.pop(request_id, None)
        if prefill is None:
            return False
        self.ready.append((prefill.prefill_to, error.to_message(request_id)))
        return True

    def take_ready(self) -> list[tuple[str, PrefillResult | RequestFailed]]:
        """The answers to publish now, oldest first."""
        ready, self.ready = self.ready, []
        return ready

    def forget(self, request_id: str) -> None:
        """A request replaced by a later attempt of itself: drop its prefill and rank."""
        self.prefills.pop(request_id, None)
        self.ranks.pop(request_id, None)

    def pop_release(self, request_id: str) -> str | None:
        """The ``kv_release`` subject still owed for a decode phase (None: none is)."""
        return self.releases.pop(request_id, None) if self.releases else None

    def pop_rank(self, request_id: str) -> int:
        """The rank of a request that ended (0 unless it ran on a rank above 0)."""
        return self.ranks.pop(request_id, 0) if self.ranks else 0

    def rank(self, request_id: str) -> int:
        """The rank a request runs on."""
        return self.ranks.get(request_id, 0) if self.ranks else 0
