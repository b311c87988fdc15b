"""The vLLM worker's KV event feed: an undecodable batch is logged as every service logs an
undecodable message, and counted as lost."""

from __future__ import annotations

from structlog.testing import capture_logs

from services.vllm_worker.kv_relay import KvRelay
from services.vllm_worker.zmq_events import KvEventSubscriber
from shared.messages import AllBlocksCleared


def test_an_undecodable_batch_is_message_undecodable_and_clears_the_relay() -> None:
    events: list[object] = []
    feed = KvEventSubscriber(KvRelay(block_size=4), "tcp://127.0.0.1:1", events.extend)
    try:
        with capture_logs() as logs:
            feed._apply(0, b"\xc1 not msgpack")
    finally:
        feed._context.term()
    assert [(e["event"], e["kind"], e["seq"]) for e in logs] == [
        ("message_undecodable", "vllm_kv_event_batch", 0)
    ]
    assert any(isinstance(e, AllBlocksCleared) for e in events)
    assert feed.relay.next_seq == 1
