"""``jetserve tap`` output: decoding by the shared codec, JSON lines, subjects, durations."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from services.cli import tapformat
from shared import codec
from shared.messages import (
    AllBlocksCleared,
    BlockStored,
    Cancel,
    Candidate,
    Generate,
    KvEventBatch,
    ModelCard,
    Preprocess,
    ResponseChunk,
    RouteDecision,
    SamplingParams,
    TokenBatch,
    WorkerCard,
)

T0 = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _line(subject: str, data: bytes, **kwargs: object) -> dict[str, object]:
    out: dict[str, object] = json.loads(tapformat.line(subject, data, time=T0, **kwargs))  # type: ignore[arg-type]
    return out


class TestDecode:
    def test_every_request_path_message_decodes_to_its_type(self) -> None:
        samples: list[msgspec.Struct] = [
            Preprocess(request_id="r", api="chat", model="m", reply_to="x", created=1),
            Generate(
                request_id="r",
                model="m",
                token_ids=(1, 2),
                sampling=SamplingParams(),
                stream_to="s",
            ),
            TokenBatch(request_id="r", token_ids=(5,), finish_reason="length", worker_id="w1"),
            Cancel(request_id="r"),
            RouteDecision(
                request_id="r",
                router_id="rt",
                worker_id="w1",
                model="m",
                mode="kv",
                candidates=(Candidate(worker_id="w1", cost=1.5),),
            ),
        ]
        for message in samples:
            kind, fields = tapformat.decode("ns.v1.x", codec.encode(message))
            assert kind == type(message).__name__
            assert fields["request_id"] == "r"

    def test_kv_event_batch_shows_nested_events_with_their_type(self) -> None:
        events = (BlockStored(block_hashes=(7, 8)), AllBlocksCleared())
        batch = KvEventBatch(worker_id="w1", event_id=3, events=events)
        kind, fields = tapformat.decode("ns.v1.kv.w1", codec.encode(batch))
        assert kind == "KvEventBatch"
        assert "type" not in fields
        assert fields["events"][0]["type"] == "BlockStored"
        assert fields["events"][0]["block_hashes"] == [7, 8]
        assert fields["events"][1] == {"type": "AllBlocksCleared", "dp_rank": 0}

    def test_response_chunk_bytes_are_shown_as_text(self) -> None:
        chunk = ResponseChunk(request_id="r", data=b"data: [DONE]\n\n", done=True)
        _, fields = tapformat.decode("ns.v1.gateway.g.r", codec.encode(chunk))
        assert fields["data"] == "data: [DONE]\n\n"
        assert fields["done"] is True

    def test_non_utf8_bytes_are_shown_as_base64(self) -> None:
        chunk = ResponseChunk(request_id="r", data=b"\xff\xfe")
        _, fields = tapformat.decode("ns.v1.gateway.g.r", codec.encode(chunk))
        assert fields["data"] == {"base64": base64.b64encode(b"\xff\xfe").decode()}

    def test_untagged_records_decode_by_shape(self) -> None:
        card = ModelCard(model="m", context_length=8)
        assert tapformat.decode("x", codec.encode(card))[0] == "ModelCard"

    def test_worker_card_in_the_kv_bucket_names_bucket_and_key(self) -> None:
        card = WorkerCard(worker_id="w1", model="m")
        kind, fields = tapformat.decode("$KV.ns_workers.w1", codec.encode(card))
        assert kind == "WorkerCard"
        assert fields == {"bucket": "ns_workers", "key": "w1", "value": fields["value"]}
        assert fields["value"]["worker_id"] == "w1"

    def test_kv_delete_marker(self) -> None:
        kind, fields = tapformat.decode("$KV.b.k", b"", {"KV-Operation": "DEL"})
        assert (kind, fields["operation"]) == ("KvDelete", "DEL")

    def test_no_responders_status(self) -> None:
        kind, fields = tapformat.decode(
            "ns.v1.stream.f.r", b"", {"Status": "503", "Nats-Subject": "ns.v1.router.generate"}
        )
        assert kind == "NoResponders"
        assert fields["subject"] == "ns.v1.router.generate"

    def test_object_store_chunks_are_not_decoded(self) -> None:
        kind, fields = tapformat.decode("$O.ns_models.C.abc", b"x" * 10)
        assert kind == "object_chunk"
        assert fields["size"] == 10

    def test_json_payload_is_shown_parsed(self) -> None:
        assert tapformat.decode("$JS.API.INFO", b'{"a": 1}') == ("json", {"a": 1})

    def test_undecodable_payload_is_base64(self) -> None:
        kind, fields = tapformat.decode("ns.v1.x", b"\xc1garbage")
        assert kind == "raw"
        assert base64.b64decode(fields["base64"]) == b"\xc1garbage"

    def test_union_covers_messages_added_later(self) -> None:
        """Every concrete tagged Struct of shared.messages is in the union (bases are not)."""
        union = tapformat.message_union()
        names = {t.cls.__name__ for t in msgspec.inspect.type_info(union).types}
        assert {"Preprocess", "RouteDecision", "KvEventBatch", "WorkerLoad"} <= names
        assert "Message" not in names
        assert "KvEvent" not in names


class TestLine:
    def test_line_has_subject_type_time_fields(self) -> None:
        out = _line("ns.v1.cancel", codec.encode(Cancel(request_id="r")))
        assert list(out) == ["subject", "type", "time", "fields"]
        assert out["type"] == "Cancel"
        assert out["time"] == "2025-01-02T03:04:05.678901Z"

    def test_line_is_one_line(self) -> None:
        data = codec.encode(ResponseChunk(request_id="r", data=b"a\n\nb"))
        assert tapformat.line("s", data, time=T0).count(b"\n") == 1

    def test_reply_and_headers_are_shown_when_present(self) -> None:
        out = _line("s", b"{}", reply="inbox", headers={"Nats-Msg-Id": "x"})
        assert (out["reply"], out["headers"]) == ("inbox", {"Nats-Msg-Id": "x"})

    def test_replayed_messages_show_their_sequence_not_the_ack_subject(self) -> None:
        out = _line("s", b"{}", reply="$JS.ACK.S.c.1.4.4.0.0", seq=4)
        assert out["seq"] == 4
        assert "reply" not in out

    def test_raw_prints_base64_without_decoding(self) -> None:
        data = codec.encode(Cancel(request_id="r"))
        out = _line("ns.v1.cancel", data, raw=True)
        assert out["type"] == "raw"
        assert base64.b64decode(out["fields"]["base64"]) == data  # type: ignore[index]


class TestSubjects:
    @pytest.mark.parametrize(
        ("given", "expected"),
        [
            ("kv.>", "ns.v1.kv.>"),
            ("decisions", "ns.v1.decisions"),
            ("ns.v1.>", "ns.v1.>"),
            ("other.v1.kv.>", "other.v1.kv.>"),
            ("$KV.ns_workers.>", "$KV.ns_workers.>"),
            (">", ">"),
        ],
    )
    def test_expand_prefixes_relative_subjects(self, given: str, expected: str) -> None:
        assert tapformat.expand(given, "ns") == expected

    @pytest.mark.parametrize(
        ("pattern", "subject", "expected"),
        [
            ("a.*.c", "a.b.c", True),
            ("a.>", "a.b.c", True),
            ("a.>", "a", False),
            ("a.*", "a.b.c", False),
            ("a.b", "a.b", True),
            ("a.b", "a.c", False),
        ],
    )
    def test_matches(self, pattern: str, subject: str, expected: bool) -> None:
        assert tapformat.matches(pattern, subject) is expected

    @pytest.mark.parametrize(
        ("narrow", "wide", "expected"),
        [
            ("ns.v1.kv.w1", "ns.v1.kv.*", True),
            ("ns.v1.kv.*", "ns.v1.kv.*", True),
            ("ns.v1.kv.>", "ns.v1.kv.*", False),
            ("ns.v1.>", "ns.v1.kv.*", False),
            ("ns.v1.kv.*", "ns.v1.>", True),
            ("ns.v1.*.w1", "ns.v1.kv.*", False),
        ],
    )
    def test_is_subset(self, narrow: str, wide: str, expected: bool) -> None:
        assert tapformat.is_subset(narrow, wide) is expected

    @pytest.mark.parametrize(
        ("a", "b", "expected"),
        [
            ("ns.v1.>", "ns.v1.kv.*", True),
            ("ns.v1.*.w1", "ns.v1.kv.*", True),
            ("ns.v1.load.*", "ns.v1.kv.*", False),
            ("ns.v1.kv", "ns.v1.kv.*", False),
        ],
    )
    def test_overlaps(self, a: str, b: str, expected: bool) -> None:
        assert tapformat.overlaps(a, b) is expected

    @pytest.mark.parametrize(
        ("patterns", "expected"),
        [
            (["ns.v1.>"], "ns.v1.>"),
            (["ns.v1.kv.>", "ns.v1.decisions"], "ns.v1.>"),
            (["ns.v1.>", "_INBOX.>"], ">"),
            (["a", "a.b"], ">"),
            (["a.b", "a.b.c"], "a.>"),
            (["ns.*.kv", "ns.v1.kv"], "ns.>"),
        ],
    )
    def test_covering_matches_every_pattern(self, patterns: list[str], expected: str) -> None:
        assert tapformat.covering(patterns) == expected
        assert all(tapformat.is_subset(p, expected) for p in patterns)

    def test_stream_filter_is_the_pattern_when_the_stream_holds_it(self) -> None:
        assert tapformat.stream_filters("ns.v1.kv.w1", ["ns.v1.kv.*"]) == ["ns.v1.kv.w1"]

    def test_stream_filter_is_the_stream_subjects_for_a_wider_pattern(self) -> None:
        assert tapformat.stream_filters("ns.v1.>", ["ns.v1.kv.*", "x.y"]) == ["ns.v1.kv.*"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("30s", 30), ("5m", 300), ("1.5h", 5400), ("2d", 172800), ("250ms", 0.25)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert tapformat.parse_duration(text) == timedelta(seconds=seconds)


def test_parse_duration_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        tapformat.parse_duration("soon")
