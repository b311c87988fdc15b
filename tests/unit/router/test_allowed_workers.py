"""``nvext.allowed_worker_ids``: only the named workers are candidates."""

from __future__ import annotations

from services.router.selection import allowed_workers
from shared.messages import WorkerCard

LIVE = [WorkerCard(worker_id=w, model="m") for w in ("w1", "w2", "w3")]


def test_no_restriction_keeps_every_live_worker() -> None:
    assert allowed_workers(LIVE, None) is LIVE


def test_only_named_workers_remain_in_live_order() -> None:
    assert [c.worker_id for c in allowed_workers(LIVE, ("w3", "w1"))] == ["w1", "w3"]


def test_named_workers_that_are_not_live_are_no_candidates() -> None:
    assert [c.worker_id for c in allowed_workers(LIVE, ("w2", "gone"))] == ["w2"]
    assert allowed_workers(LIVE, ("gone",)) == []
