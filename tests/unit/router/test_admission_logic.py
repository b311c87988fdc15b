"""Admission's pure parts: the windowed ledger, the queue's order and the class shares.

The last test runs two replicas' queues against one simulated fleet, with 90 % of the premium
traffic entering at one replica, and checks the served shares come out at the weights (4:1).
"""

from __future__ import annotations

import random

from services.router.ledger import Ledger, WindowCounts
from services.router.queue import BACKLOG_TTL_S, RouterQueue, Shares, Waiting
from shared.admission import AdmissionPolicy, PolicyClass
from shared.messages import (
    AdmissionBacklog,
    AdmissionServed,
    Generate,
    RouteDecision,
    RoutingHints,
    SamplingParams,
)

POLICY = AdmissionPolicy(
    classes={"premium": PolicyClass(weight=4), "regular": PolicyClass(weight=1)},
    default_class="regular",
    quantum_tokens=512,
)


def _decision(rid: str, router: str, cls: str, uncached: int, tenant: str = "") -> RouteDecision:
    return RouteDecision(
        request_id=rid,
        router_id=router,
        worker_id="w",
        model="m",
        mode="kv",
        prefill_tokens=uncached,
        prompt_tokens=uncached,
        policy_class=cls,
        tenant=tenant,
    )


def _waiting(rid: str, cls: str = "regular", *, tier: int = 0, order: float = 0.0) -> Waiting:
    gen = Generate(
        request_id=rid,
        model="m",
        token_ids=(1,) * 100,
        sampling=SamplingParams(),
        stream_to="s",
        routing=RoutingHints(policy_class=cls),
    )
    return Waiting(gen, cls, tier, order, enqueued_at=0, expires_at=30, tokens=100)


class TestWindowCounts:
    def test_sums_over_the_window_and_forgets_older_seconds(self) -> None:
        counts = WindowCounts(window_s=10)
        counts.add("a", 5, ts=100.2)
        counts.add("a", 7, ts=100.9)
        counts.add("a", 1, ts=105.0)
        assert counts.total("a", now=106) == 13
        assert counts.total("a", now=111.5) == 1  # second 100 is over 10 s old
        assert counts.total("a", now=116.5) == 0
        assert counts.totals(now=116.5) == {}

    def test_late_records_land_in_their_own_second(self) -> None:
        counts = WindowCounts(window_s=10)
        counts.add("a", 1, ts=105)
        counts.add("a", 2, ts=101)
        counts.add("a", 4, ts=103)
        assert counts.total("a", now=112.5) == 1 + 4  # 101 went, 103 and 105 stay

    def test_retry_after_is_when_enough_tokens_are_a_window_old(self) -> None:
        counts = WindowCounts(window_s=60)
        counts.add("t", 600, ts=1000)
        counts.add("t", 600, ts=1030)
        assert counts.retry_after("t", limit=1000, now=1040) == 1061 - 1040
        assert counts.retry_after("t", limit=2000, now=1040) == 0.0


class TestLedger:
    def test_counts_every_replicas_decisions_and_stores_only_its_own(self) -> None:
        ledger = Ledger("r1")
        ledger.on_decision(_decision("a", "r1", "premium", 300, tenant="acme"), "regular", 10)
        ledger.on_decision(_decision("b", "r2", "", 200, tenant="acme"), "regular", 10)
        assert ledger.served.totals(10) == {"premium": 300, "regular": 200}
        assert ledger.spent.total("acme", 10) == 500
        ledger.on_finished("a", 50, 11)
        ledger.on_finished("b", 70, 11)
        ledger.on_finished("b", 70, 11)  # once
        assert ledger.spent.total("acme", 11) == 620
        record = ledger.pending(12)
        assert record is not None
        assert (record.served, record.spent) == ({"premium": 300}, {"acme": 350})
        assert ledger.pending(13) is None

    def test_a_starting_replica_replays_stored_records(self) -> None:
        ledger = Ledger("new")
        record = AdmissionServed(router_id="old", ts=50, served={"regular": 9}, spent={"t": 4})
        ledger.replay(record)
        assert (ledger.served.total("regular", 55), ledger.spent.total("t", 55)) == (9, 4)


class TestQueueOrder:
    def test_higher_tier_first_then_priority_then_arrival(self) -> None:
        queue = RouterQueue(max_length=10)
        shares = Shares(POLICY, Ledger("r1"))
        for w in (
            _waiting("late"),
            _waiting("early", order=-5.0),  # jumped 5 s ahead
            _waiting("vip", tier=1),
        ):
            assert queue.push(w)
        order = []
        while (head := queue.next(shares, "m", now=0)) is not None:
            order.append(head.request_id)
            queue.remove(head.request_id)
        assert order == ["vip", "early", "late"]

    def test_a_full_queue_refuses_and_a_request_put_back_keeps_its_turn(self) -> None:
        queue = RouterQueue(max_length=2)
        first, second = _waiting("first"), _waiting("second")
        assert queue.push(first)
        assert queue.push(second)
        assert not queue.push(_waiting("third"))
        queue.remove("first")
        assert queue.push(first)  # tried and put back: still ahead of "second"
        head = queue.next(Shares(POLICY, Ledger("r1")), "m", now=0)
        assert head is not None
        assert head.request_id == "first"

    def test_expired_requests_leave(self) -> None:
        queue = RouterQueue(max_length=5)
        queue.push(_waiting("a"))
        assert [w.request_id for w in queue.expired(now=31)] == ["a"]
        assert len(queue) == 0


class TestShares:
    def test_the_class_behind_its_share_goes_first(self) -> None:
        ledger = Ledger("r1")
        ledger.on_decision(_decision("x", "r1", "premium", 4000), "regular", 0)
        ledger.on_decision(_decision("y", "r1", "regular", 2000), "regular", 0)
        shares = Shares(POLICY, ledger)
        # premium: 4000/4 = 1000 per weight; regular: 2000 > 1000 + a quantum.
        assert shares.choose(["premium", "regular"], "m", {"premium", "regular"}, 1) == "premium"

    def test_a_class_ahead_leaves_the_worker_to_a_class_waiting_at_a_peer(self) -> None:
        ledger = Ledger("r1")
        ledger.on_decision(_decision("x", "r1", "premium", 8000), "regular", 0)
        shares = Shares(POLICY, ledger)
        assert shares.choose(["premium"], "m", {"premium"}, 1) == "premium"  # nobody else waits
        backlog = AdmissionBacklog(router_id="r2", ts=1, queued={"m": {"regular": 500}})
        shares.on_backlog(backlog, now=1)
        assert shares.choose(["premium"], "m", {"premium"}, 1) is None  # 2000 > 0 + 512
        assert shares.choose(["premium"], "other-model", {"premium"}, 1) == "premium"
        # The peer went quiet: its backlog no longer holds anyone back.
        assert shares.choose(["premium"], "m", {"premium"}, 1 + BACKLOG_TTL_S + 0.1) == "premium"


def test_two_replicas_with_skewed_ingress_serve_the_weights() -> None:
    """A saturated fleet of 8 slots, each request 1,000 uncached tokens for 1 s. Premium
    arrives 90 % at r1, regular all at r2; both over capacity. Served tokens come out 4:1."""
    rng = random.Random(7)
    ledgers = {r: Ledger(r) for r in ("r1", "r2")}
    shares = {r: Shares(POLICY, ledgers[r]) for r in ledgers}
    queues = {r: RouterQueue(max_length=10_000) for r in ledgers}
    running: list[float] = []
    served = {"premium": 0, "regular": 0}
    now, seq = 0.0, 0
    while now < 600:
        now += 0.01
        for _ in range(rng.choice((0, 1, 1, 2))):  # ~1 premium and ~1 regular per 10 ms
            seq += 1
            router = "r1" if rng.random() < 0.9 else "r2"
            queues[router].push(_waiting(f"p{seq}", "premium", order=now))
            queues["r2"].push(_waiting(f"g{seq}", "regular", order=now))
        running = [t for t in running if t > now]
        for router in rng.sample(sorted(queues), 2):  # the replicas race for free slots
            for peer in queues:
                if peer != router:  # each replica hears the other's backlog
                    queued = {"m": queues[peer].backlog()}
                    shares[router].on_backlog(
                        AdmissionBacklog(router_id=peer, ts=now, queued=queued), now
                    )
            while len(running) < 8:
                head = queues[router].next(shares[router], "m", now)
                if head is None:
                    break
                queues[router].remove(head.request_id)
                running.append(now + 1.0)
                decision = _decision(head.request_id, router, head.policy_class, 1000)
                for ledger in ledgers.values():  # every replica sees every decision
                    ledger.on_decision(decision, "regular", now)
                if now > 120:  # after warm-up
                    served[head.policy_class] += 1000
    ratio = served["premium"] / served["regular"]
    assert 3.6 <= ratio <= 4.4, served
