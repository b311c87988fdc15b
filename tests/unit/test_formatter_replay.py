"""Decision 018's pure parts in the formatter: replay history, ended requests, when to ask."""

from __future__ import annotations

from typing import Any

import pytest

from services.formatter.detokenizer import load_tokenizer
from services.formatter.replay import ChunkHistory, FinishedStreams
from services.formatter.request import RequestFormatter
from shared.messages import Generate, TokenBatch
from shared.model_dir import ensure_default_model_dir
from tests.unit.migration_support import GEN, migratable_open


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_dir = ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())


def _history(*chunks: bytes, max_bytes: int = 1 << 20) -> ChunkHistory:
    history = ChunkHistory(max_bytes=max_bytes)
    for chunk in chunks:
        history.add(chunk)
    return history


class TestChunkHistory:
    def test_numbers_chunks_from_zero_and_replays_from_any_seq(self) -> None:
        history = _history(b"a", b"b", b"c")
        assert (history.first_seq, history.next_seq) == (0, 3)
        assert history.since(1) == [b"b", b"c"]
        assert history.since(0) == [b"a", b"b", b"c"]

    def test_a_resume_past_the_end_replays_nothing(self) -> None:
        assert _history(b"a").since(5) == []

    def test_drops_the_oldest_past_its_byte_bound(self) -> None:
        history = _history(b"aaaa", b"bbbb", b"cccc", max_bytes=9)
        assert (history.first_seq, history.next_seq, history.nbytes) == (1, 3, 8)
        assert history.since(0) == [b"bbbb", b"cccc"]  # from what is still held

    def test_keeps_the_newest_chunk_even_when_it_alone_is_too_big(self) -> None:
        history = _history(b"a", b"x" * 20, max_bytes=9)
        assert (history.first_seq, history.since(0)) == (1, [b"x" * 20])

    def test_keeps_the_very_bytes_it_was_given(self) -> None:
        chunk = b"chunk"
        assert _history(chunk).since(0)[0] is chunk


class TestFinishedStreams:
    def test_an_ended_request_is_found_until_keep_s(self) -> None:
        ended = FinishedStreams(keep_s=10.0)
        ended.add("r", "gw.r", _history(b"a", b"b"), now=100.0)
        found = ended.get("r", now=109.0)
        assert found is not None
        assert (found.reply_to, found.replay(1)) == ("gw.r", [b"b"])
        assert ended.get("r", now=110.0) is None

    def test_a_failed_request_replays_its_failure_after_its_chunks(self) -> None:
        ended = FinishedStreams()
        ended.add("r", "gw.r", _history(b"a"), now=0.0, tail=b"failed")
        found = ended.get("r", now=1.0)
        assert found is not None
        assert found.replay(0) == [b"a", b"failed"]
        assert found.replay(7) == [b"failed"]

    def test_prune_forgets_what_is_too_old(self) -> None:
        ended = FinishedStreams(keep_s=10.0)
        ended.add("old", "s", _history(b"a"), now=0.0)
        ended.add("new", "s", _history(b"b"), now=5.0)
        ended.prune(now=12.0)
        assert (len(ended), ended.nbytes) == (1, 1)

    def test_the_oldest_goes_past_the_count_bound(self) -> None:
        ended = FinishedStreams(max_requests=2)
        for n, request_id in enumerate(("a", "b", "c")):
            ended.add(request_id, "s", _history(b"x"), now=float(n))
        assert ended.get("a", now=3.0) is None
        assert ended.get("c", now=3.0) is not None

    def test_the_oldest_goes_past_the_byte_bound(self) -> None:
        ended = FinishedStreams(max_bytes=10)
        ended.add("a", "s", _history(b"x" * 6), now=0.0)
        ended.add("b", "s", _history(b"y" * 6), now=1.0)
        assert (ended.get("a", now=2.0), len(ended), ended.nbytes) == (None, 1, 6)

    def test_adding_a_request_again_replaces_it(self) -> None:
        ended = FinishedStreams()
        ended.add("r", "s", _history(b"aaa"), now=0.0)
        ended.add("r", "s", _history(b"b"), now=1.0)
        assert (len(ended), ended.nbytes) == (1, 1)


def _state(tokenizer: Any, *, generate: Generate | None = GEN, limit: int = 3) -> RequestFormatter:
    return RequestFormatter(migratable_open(generate, limit=limit, stream=True), tokenizer, now=0.0)


def _routed(tokenizer: Any, **kwargs: Any) -> RequestFormatter:
    state = _state(tokenizer, **kwargs)
    state.on_batch(TokenBatch(request_id="r", token_ids=(9707,), worker_id="w1"), now=0.0)
    return state


class TestStallCheck:
    def test_a_routed_request_without_a_batch_is_checked_once_per_period(
        self, tokenizer: Any
    ) -> None:
        state = _routed(tokenizer)
        assert not state.awaits_stall_check(now=1.0, after_s=2.0)
        assert state.awaits_stall_check(now=2.5, after_s=2.0)
        state.is_pinging = False  # answered
        assert not state.awaits_stall_check(now=3.5, after_s=2.0)
        assert state.awaits_stall_check(now=4.6, after_s=2.0)

    def test_one_check_at_a_time(self, tokenizer: Any) -> None:
        state = _routed(tokenizer)
        assert state.awaits_stall_check(now=2.5, after_s=2.0)
        assert not state.awaits_stall_check(now=9.0, after_s=2.0)
        assert not state.ping_started(now=9.0)

    def test_no_check_while_the_worker_is_unknown(self, tokenizer: Any) -> None:
        state = _state(tokenizer)
        assert not state.awaits_stall_check(now=5.0, after_s=2.0)
        state.worker_id = "w1"  # a router said where it went
        assert state.awaits_stall_check(now=5.0, after_s=2.0)

    @pytest.mark.parametrize(("generate", "limit"), [(None, 0), (GEN, 0)])
    def test_no_check_for_a_request_that_may_not_move(
        self, tokenizer: Any, generate: Generate | None, limit: int
    ) -> None:
        state = _routed(tokenizer, generate=generate, limit=limit)
        assert not state.awaits_stall_check(now=5.0, after_s=2.0)

    def test_no_check_once_the_migration_limit_is_spent(self, tokenizer: Any) -> None:
        state = _routed(tokenizer, limit=1)
        state.migrated("w1", now=1.0)
        state.worker_id = "w2"
        assert not state.awaits_stall_check(now=9.0, after_s=2.0)

    def test_the_reconnect_check_asks_at_once(self, tokenizer: Any) -> None:
        state = _routed(tokenizer)
        assert state.ping_started(now=0.1)


class TestGatewayGrace:
    def test_the_gateway_is_gone_only_after_the_grace(self, tokenizer: Any) -> None:
        state = _state(tokenizer)
        assert not state.gateway_gone(now=100.0, grace_s=5.0)
        state.gateway_away_since = 10.0
        assert not state.gateway_gone(now=15.0, grace_s=5.0)
        assert state.gateway_gone(now=15.1, grace_s=5.0)


def test_a_worker_holding_the_new_attempt_is_no_longer_counted_lost(tokenizer: Any) -> None:
    """Migrated off w1 (e.g. a batch gap) and routed to w1 again: losing w1 now matters."""
    state = _routed(tokenizer)
    state.migrated("w1", now=1.0)
    assert state.lost_workers == {"w1"}
    batch = TokenBatch(request_id="r", token_ids=(11,), worker_id="w1", attempt=1)
    state.on_batch(batch, now=2.0)
    assert (state.worker_id, state.lost_workers) == ("w1", set())
