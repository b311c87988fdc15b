"""Session affinity decisions (``services.router.sessions``): plans, writes, the table."""

from __future__ import annotations

import pytest

from services.router.sessions import (
    Binding,
    Plan,
    SessionTable,
    plan,
    refresh_after_s,
    session_key,
    settle,
)
from shared.sessions import speculative_request_id

BOUND = Binding("w1", 0, revision=3, updated_at=100.0)


class TestPlan:
    def test_a_first_turn_is_routed_normally(self) -> None:
        assert plan(None, "hard", is_live=False, is_busy=False) == Plan("new")

    @pytest.mark.parametrize("mode", ["hard", "soft"])
    def test_a_live_idle_bound_worker_takes_the_turn(self, mode: str) -> None:
        assert plan(BOUND, mode, is_live=True, is_busy=False) == Plan("hit", "w1")  # type: ignore[arg-type]

    def test_hard_keeps_a_busy_bound_worker(self) -> None:
        assert plan(BOUND, "hard", is_live=True, is_busy=True) == Plan("hit", "w1")

    def test_soft_leaves_a_busy_bound_worker(self) -> None:
        assert plan(BOUND, "soft", is_live=True, is_busy=True) == Plan("busy")

    @pytest.mark.parametrize("mode", ["hard", "soft"])
    def test_a_dead_bound_worker_is_left(self, mode: str) -> None:
        assert plan(BOUND, mode, is_live=False, is_busy=False) == Plan("dead")  # type: ignore[arg-type]

    def test_the_target_names_the_bound_rank(self) -> None:
        ranked = Binding("w1", 2, revision=1, updated_at=0.0)
        assert plan(ranked, "hard", is_live=True, is_busy=False).target == "w1#2"


class TestSettle:
    def test_a_first_turn_creates_the_binding(self) -> None:
        assert settle(Plan("new"), None, "w2", now=0.0, refresh_after_s=10.0) == "create"

    def test_a_turn_elsewhere_moves_the_binding(self) -> None:
        assert settle(Plan("dead"), BOUND, "w2", now=101.0, refresh_after_s=10.0) == "move"

    def test_a_busy_turn_that_chose_the_bound_worker_anyway_does_not_move(self) -> None:
        assert settle(Plan("busy"), BOUND, "w1", now=101.0, refresh_after_s=10.0) == "none"

    def test_a_recently_written_binding_is_not_written_again(self) -> None:
        assert settle(Plan("hit", "w1"), BOUND, "w1", now=109.0, refresh_after_s=10.0) == "none"

    def test_an_older_binding_is_refreshed_when_used(self) -> None:
        assert settle(Plan("hit", "w1"), BOUND, "w1", now=110.0, refresh_after_s=10.0) == "refresh"

    def test_refresh_comes_every_quarter_ttl(self) -> None:
        assert refresh_after_s(600.0) == 150.0


class TestSessionTable:
    def test_a_binding_lives_until_its_ttl(self) -> None:
        table = SessionTable(ttl_s=60.0)
        table.put("k", BOUND)
        assert table.get("k", now=159.0) == BOUND
        assert table.get("k", now=160.0) is None
        assert len(table) == 0

    def test_an_older_revision_does_not_replace_a_newer_one(self) -> None:
        table = SessionTable(ttl_s=60.0)
        newer = Binding("w2", 0, revision=5, updated_at=101.0)
        table.put("k", newer)
        assert not table.put("k", BOUND)
        assert table.get("k", now=101.0) == newer

    def test_a_delete_before_a_newer_write_keeps_the_write(self) -> None:
        table = SessionTable(ttl_s=60.0)
        table.put("k", BOUND)
        table.remove("k", revision=2)
        assert table.get("k", now=100.0) == BOUND
        table.remove("k", revision=4)
        assert table.get("k", now=100.0) is None

    def test_expire_drops_every_old_binding(self) -> None:
        table = SessionTable(ttl_s=10.0)
        table.put("a", BOUND)
        table.put("b", Binding("w2", 0, revision=1, updated_at=105.0))
        assert table.expire(now=111.0) == 1
        assert len(table) == 1


class TestNames:
    def test_session_keys_are_valid_kv_keys_and_differ_by_model(self) -> None:
        key = session_key("m", "any id / with spaces.and*wildcards")
        assert key.isalnum()
        assert key != session_key("other", "any id / with spaces.and*wildcards")

    def test_speculative_ids_are_per_session_else_per_request(self) -> None:
        by_session = speculative_request_id("r1", "m", "s")
        assert by_session == speculative_request_id("r2", "m", "s")
        assert speculative_request_id("r1", "m", None) == "r1-spec"
