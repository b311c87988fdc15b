"""The sparse decision (``scoring.choose_sparse``: only workers with requests in flight costed
one by one) picks the same worker, with the same use of the random generator, as scoring every
worker (``RoutingCore.decide_exhaustive``), on random fleets, caches, loads and prompts; and
what it lists and counts agrees with the exhaustive candidates."""

from __future__ import annotations

import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.router.core import LIST_ALL_UP_TO, CoreSettings, RoutingCore
from services.router.scoring import LISTED
from services.router.sync import KvSync
from shared.hashing import prefix_hashes
from shared.messages import (
    BlockStored,
    Generate,
    KvEventBatch,
    RoutingHints,
    SamplingParams,
    WorkerCard,
)

BLOCK = 4
MODEL = "m"


def _gen(request_id: str, tokens: list[int], weight: float | None = None) -> Generate:
    hints = RoutingHints(overlap_score_weight=weight) if weight is not None else None
    return Generate(
        request_id=request_id,
        model=MODEL,
        token_ids=tuple(tokens),
        sampling=SamplingParams(),
        stream_to="s",
        routing=hints,
    )


@st.composite
def scenes(draw: st.DrawFn) -> tuple[RoutingCore, list[WorkerCard], Generate, int]:
    """A fleet, its caches (KV events), its active load (decisions committed, some prefills
    done, some freed), and a prompt that may share a prefix with what is cached."""
    n = draw(st.sampled_from([1, 2, 3, 5, 8, LIST_ALL_UP_TO, LIST_ALL_UP_TO + 1, 40, 60, 150]))
    rng = random.Random(draw(st.integers(0, 2**32)))
    bases = [[rng.randrange(1, 50) for _ in range(64)] for _ in range(3)]  # few tokens: ties
    inflight = draw(st.booleans())
    core = RoutingCore(
        CoreSettings(mode="kv", router_id="r", inflight_overlap=inflight), sync=KvSync()
    )
    cards = [
        WorkerCard(worker_id=f"w{i:03d}", model=MODEL, block_size=BLOCK, kv_blocks=4096)
        for i in range(n)
    ]
    rng.shuffle(cards)  # the registry's order is not sorted
    for seq, _ in enumerate(range(draw(st.integers(0, 12))), 1):
        worker = rng.choice(cards).worker_id
        hashes = prefix_hashes(rng.choice(bases)[: rng.randrange(BLOCK, 64)], BLOCK)
        stored = BlockStored(block_hashes=tuple(hashes), parent_hash=None)
        core.sync.on_batch(KvEventBatch(worker_id=worker, event_id=seq, events=(stored,)), seq)
    for i in range(draw(st.integers(0, 20))):
        prompt = [*rng.choice(bases)[: rng.randrange(1, 64)], rng.randrange(50, 99)]
        decision = core.decide_exhaustive(_gen(f"bg{i}", prompt), cards, now=0, rng=rng)
        # Land it on a random worker: uneven load.
        core.commit(msgspec.structs.replace(decision, worker_id=rng.choice(cards).worker_id), 0)
        if rng.random() < 0.3:
            core.on_cancel(f"bg{i}")
        elif rng.random() < 0.3:
            core.load.prefill_done(f"bg{i}")
    shared = draw(st.integers(0, 64))
    tokens = rng.choice(bases)[:shared] + [
        rng.randrange(1, 99) for _ in range(draw(st.integers(0, 40)))
    ]
    weight = draw(st.sampled_from([None, 0.0, 0.5, 2.0]))
    return core, cards, _gen("req", tokens or [1], weight), draw(st.integers(0, 2**32))


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_sparse_and_exhaustive_pick_the_same_worker(
    scene: tuple[RoutingCore, list[WorkerCard], Generate, int],
) -> None:
    core, cards, gen, seed = scene
    rng_sparse, rng_all = random.Random(seed), random.Random(seed)
    sparse = core.decide(gen, cards, now=0, rng=rng_sparse)
    every = core.decide_exhaustive(gen, cards, now=0, rng=rng_all)
    assert sparse.worker_id == every.worker_id
    assert rng_sparse.getstate() == rng_all.getstate()
    assert (sparse.overlap_blocks, sparse.prefill_tokens) == (
        every.overlap_blocks,
        every.prefill_tokens,
    )
    by_id = {c.worker_id: c for c in every.candidates}
    assert all(by_id[c.worker_id] == c for c in sparse.candidates)
    assert sparse.worker_id in {c.worker_id for c in sparse.candidates}
    assert len(sparse.candidates) <= max(LISTED, LIST_ALL_UP_TO if len(cards) <= 32 else 0)
    assert len(sparse.candidates) + sparse.idle_workers + sparse.unlisted_workers == len(
        every.candidates
    )
    listed = {c.worker_id for c in sparse.candidates}
    rest = sorted(c.cost for c in every.candidates if c.worker_id not in listed)
    for _ in range(sparse.idle_workers):  # the idle ones, at the idle cost
        rest.remove(sparse.idle_cost)
    dearest = max(c.cost for c in sparse.candidates)
    assert all(cost >= dearest for cost in rest)  # the unlisted ones with state
    if len(cards) <= LIST_ALL_UP_TO:
        assert sparse == every  # a small fleet's decision lists everyone, as before


def test_a_large_idle_fleet_lists_only_the_chosen_worker() -> None:
    core = RoutingCore(CoreSettings(mode="kv", router_id="r"), sync=KvSync())
    cards = [WorkerCard(worker_id=f"w{i:04d}", model=MODEL, block_size=BLOCK) for i in range(500)]
    decision = core.decide(_gen("a", list(range(40))), cards, now=0, rng=random.Random(1))
    assert [c.worker_id for c in decision.candidates] == [decision.worker_id]
    assert (decision.idle_workers, decision.idle_cost) == (499, decision.candidates[0].cost)
