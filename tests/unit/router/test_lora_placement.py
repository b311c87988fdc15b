"""Adapter placement (``services.router.lora_placement``): pure rules, a simulated fleet."""

from __future__ import annotations

from services.router.lora_placement import (
    Action,
    AdapterDemand,
    PlacementSettings,
    WorkerView,
    holders,
    plan,
    views,
)
from shared.messages import LoraAdapter, WorkerCard

SETTINGS = PlacementSettings(min_inflight=4, imbalance=1.5)


def worker(wid: str, loras: str, inflight: int, max_loras: int = 2) -> WorkerView:
    return WorkerView(
        worker_id=wid,
        loras={name: f"/{name}" for name in loras.split()},
        max_loras=max_loras,
        inflight=inflight,
    )


def test_a_hot_adapter_gets_the_least_loaded_other_worker() -> None:
    fleet = [worker("w0", "hot a", 20), worker("w1", "b", 2), worker("w2", "c d", 1)]
    actions = plan(fleet, {"hot": 20, "b": 2, "c": 1}, settings=SETTINGS)
    assert actions == [Action("load", "w2", "hot", "/hot")]


def test_a_full_target_drops_its_coldest_adapter_held_elsewhere() -> None:
    fleet = [worker("w0", "hot a", 20), worker("w1", "a b", 1)]
    actions = plan(fleet, {"hot": 20, "a": 1, "b": 0}, settings=SETTINGS)
    assert actions == [Action("load", "w1", "hot", "/hot"), Action("unload", "w1", "a")]


def test_a_last_holder_is_never_dropped() -> None:
    fleet = [worker("w0", "hot", 20), worker("w1", "a b", 1)]
    actions = plan(fleet, {"hot": 20, "a": 1}, settings=SETTINGS)
    assert actions == [Action("load", "w1", "hot", "/hot")]


def test_balanced_demand_changes_nothing() -> None:
    fleet = [worker("w0", "a", 10), worker("w1", "b", 10)]
    assert plan(fleet, {"a": 10, "b": 10}, settings=SETTINGS) == []


def test_little_demand_changes_nothing() -> None:
    fleet = [worker("w0", "a", 3), worker("w1", "b", 0)]
    assert plan(fleet, {"a": 3}, settings=SETTINGS) == []


def test_an_adapter_cooling_down_is_left_alone() -> None:
    fleet = [worker("w0", "hot", 20), worker("w1", "b", 0)]
    assert plan(fleet, {"hot": 20}, settings=SETTINGS, cooling=frozenset({"hot"})) == []


def test_a_worker_busier_than_the_adapter_per_holder_is_no_target() -> None:
    fleet = [worker("w0", "hot", 10), worker("w1", "b", 30)]
    assert plan(fleet, {"hot": 10, "b": 30}, settings=SETTINGS) == []


def test_a_cold_copy_over_max_loras_is_dropped() -> None:
    fleet = [worker("w0", "a b c", 2), worker("w1", "a", 1)]
    assert plan(fleet, {"a": 1, "b": 1}, settings=SETTINGS) == [Action("unload", "w0", "a")]


def test_one_worker_is_no_fleet() -> None:
    assert plan([worker("w0", "a", 50)], {"a": 50}, settings=SETTINGS) == []


def test_demand_counts_requests_until_they_end() -> None:
    demand = AdapterDemand()
    demand.add("r1", "w0", "a")
    demand.add("r2", "w0", "")
    demand.add("r1", "w1", "a")  # migrated: counted once, where it is now
    assert demand.by_adapter == {"a": 1}
    assert demand.by_worker == {"w0": 1, "w1": 1}
    demand.free("r1")
    demand.keep_only({"w1"})
    assert len(demand) == 0


def test_views_and_holders_read_the_cards() -> None:
    cards = [
        WorkerCard(
            worker_id="w1", model="m", loras=(LoraAdapter(name="a", path="/a"),), max_loras=2
        ),
        WorkerCard(worker_id="w0", model="m"),
    ]
    assert [c.worker_id for c in holders(cards, "a")] == ["w1"]
    assert views(cards, AdapterDemand()) == [worker("w1", "a", 0)]


def test_zipf_demand_converges_to_more_holders_for_hotter_adapters() -> None:
    """Simulated fleet: 4 workers, 2 adapters each at first, Zipf demand; apply each plan to the
    cards (as the workers would) until nothing changes; the hottest adapter ends with the most
    holders and no adapter loses its last holder."""
    names = [f"a{i}" for i in range(8)]
    held = {f"w{i}": {names[i], names[i + 4]} for i in range(4)}
    weights = [1 / (k + 1) for k in range(8)]
    total = 64
    demand = {n: round(total * w / sum(weights)) for n, w in zip(names, weights, strict=True)}
    for _ in range(40):
        per_worker = {
            w: sum(demand[n] / sum(1 for h in held.values() if n in h) for n in loras)
            for w, loras in held.items()
        }
        fleet = [
            WorkerView(w, {n: f"/{n}" for n in sorted(loras)}, 2, round(per_worker[w]))
            for w, loras in sorted(held.items())
        ]
        actions = plan(fleet, demand, settings=SETTINGS)
        if not actions:
            break
        for action in actions:
            if action.kind == "load":
                held[action.worker_id].add(action.lora_name)
            else:
                held[action.worker_id].discard(action.lora_name)
    count = {n: sum(1 for h in held.values() if n in h) for n in names}
    assert count["a0"] >= 2
    assert count["a0"] >= max(count[n] for n in names[1:])
    assert all(c >= 1 for c in count.values())
