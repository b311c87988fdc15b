"""KV event numbering (ids from 1, no gaps, a deliberate gap on overflow) and load reporting."""

from __future__ import annotations

from shared.messages import AllBlocksCleared, BlockRemoved, BlockStored
from shared.worker.kv_events import KvEventLog, LoadReporter


def _drain(log: KvEventLog) -> list[int]:
    ids = []
    log.seal(0.0)
    while (batch := log.oldest()) is not None:
        ids.append(batch.event_id)
        log.pop()
    return ids


class TestKvEventLog:
    def test_ids_count_batches_from_one_without_gaps(self) -> None:
        log = KvEventLog("w")
        ids = []
        for i in range(5):
            log.add([BlockRemoved(block_hashes=(i,))])
            if i % 2 == 0:
                ids += _drain(log)
        ids += _drain(log)
        assert ids == [1, 2, 3]  # pending events between sends are coalesced into one batch

    def test_a_batch_keeps_events_in_order_and_names_the_worker(self) -> None:
        log = KvEventLog("w")
        events: list[AllBlocksCleared | BlockStored | BlockRemoved] = [
            AllBlocksCleared(),
            BlockStored(block_hashes=(1,)),
            BlockRemoved(block_hashes=(1,)),
        ]
        log.add(events)
        log.seal(12.5)
        batch = log.oldest()
        assert batch is not None
        assert (batch.worker_id, batch.event_id, batch.events, batch.ts) == (
            "w",
            1,
            tuple(events),
            12.5,
        )

    def test_oldest_repeats_until_pop_so_a_failed_send_is_retried(self) -> None:
        log = KvEventLog("w")
        log.add([AllBlocksCleared()])
        log.seal(0.0)
        first = log.oldest()
        log.add([BlockRemoved(block_hashes=(1,))])
        assert log.oldest() is first  # new events stay pending until the next seal
        log.pop()
        assert log.oldest() is None
        log.seal(0.0)
        second = log.oldest()
        assert second is not None
        assert second.event_id == 2

    def test_seal_numbers_pending_events_for_a_dump(self) -> None:
        log = KvEventLog("w")
        assert log.seal(0.0) == 0
        log.add([AllBlocksCleared()])
        assert log.seal(0.0) == 1
        assert log.seal(0.0) == 1  # nothing new
        assert _drain(log) == [1]

    def test_overflow_drops_pending_events_and_skips_one_id(self) -> None:
        log = KvEventLog("w", max_pending=3)
        log.add([AllBlocksCleared()])
        assert _drain(log) == [1]
        log.add([BlockRemoved(block_hashes=(i,)) for i in range(4)])
        log.add([BlockRemoved(block_hashes=(9,))])
        assert (log.dropped_events, _drain(log)) == (4, [3])  # id 2 is the gap
        assert len(log) == 0


class TestLoadReporter:
    def test_reports_changes_rate_limited(self) -> None:
        reporter = LoadReporter(min_interval_s=0.05)
        assert reporter.due((1,), 0.0)
        assert not reporter.due((1,), 0.5)  # unchanged
        assert not reporter.due((2,), 0.01)  # too soon
        assert reporter.due((2,), 0.06)

    def test_an_unchanged_load_is_reported_again_every_heartbeat(self) -> None:
        reporter = LoadReporter(min_interval_s=0.05, heartbeat_s=1.0)
        assert reporter.due((1,), 0.0)
        assert not reporter.due((1,), 0.99)
        assert reporter.due((1,), 1.0)
        assert not reporter.due((1,), 1.5)

    def test_idle_reports_at_once(self) -> None:
        reporter = LoadReporter(min_interval_s=0.05)
        assert reporter.due((1,), 0.0)
        assert not reporter.may_report(0.01)
        assert reporter.may_report(0.01, is_idle=True)
        assert reporter.due((0,), 0.01, is_idle=True)
