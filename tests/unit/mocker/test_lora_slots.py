"""The mocker's simulated LoRA slots: ``max_loras`` at once, LRU swaps, first come first served."""

from __future__ import annotations

import pytest

from services.mocker.lora import AdapterSlots


def slots(max_loras: int = 1, load_time_s: float = 1.0) -> AdapterSlots[str]:
    s: AdapterSlots[str] = AdapterSlots(max_loras, load_time_s)
    for name in ("a", "b", "c"):
        s.hold(name, f"/{name}", now=0.0)
    return s


def test_hold_preloads_while_a_slot_is_free() -> None:
    s = slots(max_loras=2)
    assert set(s.loading) == {"a", "b"}
    assert s.advance(1.0) == []
    assert list(s.loaded) == ["a", "b"]


def test_a_request_for_a_loaded_adapter_enters_at_once() -> None:
    s = slots(max_loras=2)
    s.advance(1.0)
    assert s.admit("r1", "a", "r1")


def test_a_request_for_an_unloaded_adapter_waits_for_its_load() -> None:
    s = slots(max_loras=1)
    s.advance(1.0)  # "a" loaded
    assert not s.admit("r1", "b", "r1")
    assert s.advance(1.0) == []  # "a" is evicted (idle), "b" starts loading
    assert s.loading == {"b": 2.0}
    assert s.advance(2.0) == ["r1"]
    assert list(s.loaded) == ["b"]
    assert s.loads == 2


def test_a_slot_in_use_is_not_evicted() -> None:
    s = slots(max_loras=1)
    s.advance(1.0)
    assert s.admit("r1", "a", "r1")
    assert not s.admit("r2", "b", "r2")
    assert s.advance(5.0) == []  # "a" runs r1: "b" cannot load
    s.done("r1")
    s.advance(5.0)
    assert s.advance(6.0) == ["r2"]


def test_a_swap_drains_the_least_recently_used_adapter_while_others_go_on() -> None:
    s = slots(max_loras=2)
    s.advance(1.0)  # "a" and "b" loaded
    assert s.admit("r1", "a", "r1")
    assert s.admit("r2", "b", "r2")
    assert not s.admit("r3", "c", "r3")
    assert s.advance(1.0) == []  # both in use: "a" (least recently used) drains
    assert not s.admit("r4", "a", "r4")  # draining: its new requests wait
    assert s.admit("r5", "b", "r5")  # the other adapter goes on
    s.done("r1")
    assert s.advance(1.0) == []  # "a" evicted, "c" loading
    assert s.advance(2.0) == ["r3"]
    assert set(s.loaded) == {"b", "c"}
    assert s.num_waiting == 1  # r4 waits for "a" to come back


def test_least_recently_used_idle_adapter_is_evicted() -> None:
    s = slots(max_loras=2, load_time_s=0.0)
    s.advance(0.0)
    assert s.admit("r1", "a", "r1")
    s.done("r1")  # "a" used last
    assert not s.admit("r2", "c", "r2")
    assert s.advance(0.0) == ["r2"]
    assert set(s.loaded) == {"a", "c"}


def test_dropping_an_adapter_returns_its_waiting_requests() -> None:
    s = slots(max_loras=1)
    s.advance(1.0)
    assert s.admit("r1", "a", "r1")
    assert not s.admit("r2", "b", "r2")
    assert s.drop("b") == ["r2"]
    assert "b" not in s.held
    assert s.num_waiting == 0


def test_a_request_without_an_adapter_never_waits() -> None:
    assert slots().admit("r1", None, "r1")


def test_cancel_takes_a_waiting_request_out() -> None:
    s = slots(max_loras=1)
    s.advance(1.0)
    s.admit("r1", "b", "r1")
    assert s.cancel("r1") == "r1"
    assert s.cancel("r1") is None


def test_max_loras_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_loras"):
        AdapterSlots(0)


def test_a_draining_adapter_takes_requests_again_once_no_swap_needs_its_slot() -> None:
    s = slots(max_loras=2)
    s.advance(1.0)
    assert s.admit("r1", "a", "r1")
    assert s.admit("r2", "b", "r2")
    assert not s.admit("r3", "c", "r3")
    s.advance(1.0)  # "a" drains
    assert not s.admit("r4", "a", "r4")
    s.done("r2")  # "b" frees first: "c" takes its slot
    s.advance(1.0)
    assert s.advance(2.0) == ["r3", "r4"]  # "a" no longer drains: r4 goes in
