"""Replay replies of vLLM's ZMQ publisher, as a DEALER receives them, in both releases' layouts
(``vllm/distributed/kv_events.py`` ``ZmqEventPublisher._service_replay``)."""

from __future__ import annotations

from services.vllm_worker.kv_wire import END_SEQ, encode_seq
from services.vllm_worker.zmq_events import replay_frames


def test_replies_without_the_topic_before_vllm_0_33() -> None:
    assert replay_frames([b"", encode_seq(7), b"payload"]) == (encode_seq(7), b"payload")
    assert replay_frames([b"", END_SEQ, b""]) == (END_SEQ, b"")


def test_replies_with_the_topic_since_vllm_0_33() -> None:
    assert replay_frames([b"", b"kv", encode_seq(7), b"payload"]) == (encode_seq(7), b"payload")
    assert replay_frames([b"", b"", END_SEQ, b""]) == (END_SEQ, b"")


def test_anything_else_is_refused() -> None:
    assert replay_frames([encode_seq(7), b"payload"]) is None
    assert replay_frames([b"x", b"kv", encode_seq(7), b"payload"]) is None
