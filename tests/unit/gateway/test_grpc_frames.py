"""The HTTP/2 and gRPC wire pieces of the gateway's gRPC server, read back with ``hpack``."""

from __future__ import annotations

import struct

import hpack
import pytest

from services.gateway.grpc.http2.frames import (
    RESPONSE_HEADERS,
    TABLE_SIZE_ZERO,
    TRAILERS_OK,
    Flag,
    FrameType,
    decode_metadatum,
    encode_metadatum,
    frame,
    header_frames,
    http_status,
    leading_size_updates,
    literal,
    parse_settings,
    parse_timeout,
    percent_encode,
    settings_payload,
    trailers,
)


def _decode(block: bytes) -> list[tuple[bytes, bytes]]:
    decoder = hpack.Decoder(max_header_list_size=1 << 20)
    return decoder.decode(block, raw=True)  # type: ignore[return-value]


def _split_frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each frame in ``data``."""
    frames, pos = [], 0
    while pos < len(data):
        length_kind, flags, stream_id = struct.unpack_from(">IBI", data, pos)
        length = length_kind >> 8
        frames.append((length_kind & 0xFF, flags, stream_id, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return frames


class TestHpack:
    @pytest.mark.parametrize("size", [0, 1, 126, 127, 128, 254, 255, 16_510, 16_511, 70_000])
    def test_literal_lengths_at_integer_prefix_boundaries_decode(self, size: int) -> None:
        """Lengths use a 7-bit prefix: 127 is the first to need continuation bytes."""
        name, value = b"x" * max(size, 1), bytes(range(256)) * (size // 256) + b"v" * (size % 256)
        assert _decode(literal(name, value)) == [(name, value)]

    def test_literals_do_not_touch_the_decoders_dynamic_table(self) -> None:
        decoder = hpack.Decoder()
        decoder.decode(literal(b"k", b"v"), raw=True)
        assert decoder.header_table_size == 4096
        assert len(decoder.header_table.dynamic_entries) == 0

    def test_response_headers_are_status_200_and_grpc_content_type(self) -> None:
        assert _decode(RESPONSE_HEADERS) == [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
        ]

    def test_a_block_may_start_with_a_table_size_update_to_zero(self) -> None:
        assert _decode(TABLE_SIZE_ZERO + TRAILERS_OK) == [(b"grpc-status", b"0")]

    @pytest.mark.parametrize("status", [405, 415, 500])
    def test_http_status_is_a_bare_status_field(self, status: int) -> None:
        assert _decode(http_status(status)) == [(b":status", str(status).encode())]


class TestTrailers:
    def test_ok_is_status_zero_only(self) -> None:
        assert _decode(trailers(0)) == [(b"grpc-status", b"0")]

    def test_error_carries_status_message_and_metadata(self) -> None:
        block = trailers(3, "bad input", [("x-reason", "why"), ("x-blob-bin", b"\x00\xff")])
        assert _decode(block) == [
            (b"grpc-status", b"3"),
            (b"grpc-message", b"bad input"),
            (b"x-reason", b"why"),
            (b"x-blob-bin", b"AP8"),
        ]

    def test_trailers_only_starts_with_the_response_headers(self) -> None:
        assert _decode(trailers(12, "Method not found!", trailers_only=True)) == [
            (b":status", b"200"),
            (b"content-type", b"application/grpc"),
            (b"grpc-status", b"12"),
            (b"grpc-message", b"Method not found!"),
        ]

    def test_message_is_percent_encoded(self) -> None:
        assert (b"grpc-message", b"h%C3%A9llo %25") in _decode(trailers(2, "héllo %"))


class TestPercentEncode:
    @pytest.mark.parametrize(
        ("message", "expected"),
        [
            ("héllo %", b"h%C3%A9llo %25"),
            ("plain text, (ok) ~!", b"plain text, (ok) ~!"),
            ("", b""),
            ("tab\tnewline\n", b"tab%09newline%0A"),
            ("\x7f", b"%7F"),
            ("100%", b"100%25"),
            ("日本", b"%E6%97%A5%E6%9C%AC"),
        ],
    )
    def test_encodes_what_the_grpc_spec_reserves(self, message: str, expected: bytes) -> None:
        """Printable ASCII (0x20-0x7E) stays, except ``%``; every other UTF-8 byte is ``%XX``."""
        assert percent_encode(message) == expected


class TestParseTimeout:
    @pytest.mark.parametrize(
        ("value", "seconds"),
        [
            (b"1H", 3600.0),
            (b"2M", 120.0),
            (b"3S", 3.0),
            (b"100m", 0.1),
            (b"250u", 250e-6),
            (b"7n", 7e-9),
            (b"99999999S", 99_999_999.0),
            (b"0m", 0.0),
        ],
    )
    def test_units(self, value: bytes, seconds: float) -> None:
        assert parse_timeout(value) == pytest.approx(seconds)

    @pytest.mark.parametrize(
        "value",
        [b"", b"m", b"10", b"10s", b"10x", b"-1S", b"1.5S", b"123456789S", b" 1S", b"\xd9\xa1S"],
    )
    def test_rejects_malformed_values(self, value: bytes) -> None:
        with pytest.raises(ValueError, match="invalid grpc-timeout"):
            parse_timeout(value)


class TestMetadata:
    @pytest.mark.parametrize("raw", [b"", b"\x00", b"\x00\xff", b"\x00\xff\x10", bytes(range(256))])
    def test_bin_values_round_trip_as_base64_without_padding(self, raw: bytes) -> None:
        name, value = encode_metadatum("trace-bin", raw)
        assert (name, b"=" in value) == (b"trace-bin", False)
        assert decode_metadatum(name, value) == ("trace-bin", raw)

    def test_padded_bin_values_from_clients_decode_too(self) -> None:
        assert decode_metadatum(b"trace-bin", b"AP8=") == ("trace-bin", b"\x00\xff")

    def test_text_values_pass_through_and_keys_are_lowercased(self) -> None:
        assert encode_metadatum("X-Request-Id", "abc") == (b"x-request-id", b"abc")
        assert decode_metadatum(b"x-request-id", b"abc") == ("x-request-id", "abc")

    def test_bin_suffix_is_case_insensitive(self) -> None:
        """Keys are lowercased on the wire, so ``X-Data-Bin`` is a binary key as well."""
        assert encode_metadatum("X-Data-Bin", b"\x00\xff") == (b"x-data-bin", b"AP8")


class TestFrames:
    def test_frame_header_layout(self) -> None:
        data = frame(FrameType.WINDOW_UPDATE, 0, 7, b"\x00\x00\x01\x00")
        assert data == b"\x00\x00\x04\x08\x00\x00\x00\x00\x07\x00\x00\x01\x00"

    def test_settings_round_trip(self) -> None:
        pairs = [(0x3, 2), (0x4, 1000), (0x5, 16_384)]
        assert parse_settings(settings_payload(pairs)) == pairs

    def test_small_header_block_is_one_headers_frame(self) -> None:
        data = header_frames(1, b"abc", end_stream=True, max_frame=16)
        assert _split_frames(data) == [
            (FrameType.HEADERS, Flag.END_STREAM | Flag.END_HEADERS, 1, b"abc")
        ]

    def test_large_header_block_splits_into_continuations(self) -> None:
        block = bytes(range(40))
        frames = _split_frames(header_frames(3, block, end_stream=True, max_frame=16))
        assert [(kind, flags, sid) for kind, flags, sid, _ in frames] == [
            (FrameType.HEADERS, Flag.END_STREAM, 3),
            (FrameType.CONTINUATION, 0, 3),
            (FrameType.CONTINUATION, Flag.END_HEADERS, 3),
        ]
        assert b"".join(payload for *_, payload in frames) == block
        assert max(len(payload) for *_, payload in frames) == 16

    def test_block_of_exactly_two_frames_has_one_continuation(self) -> None:
        frames = _split_frames(header_frames(5, b"x" * 32, end_stream=False, max_frame=16))
        assert [(kind, flags) for kind, flags, *_ in frames] == [
            (FrameType.HEADERS, 0),
            (FrameType.CONTINUATION, Flag.END_HEADERS),
        ]

    def test_split_trailers_decode_to_the_same_fields(self) -> None:
        block = trailers(8, "x" * 100, [("k", "v" * 50)])
        frames = _split_frames(header_frames(1, block, end_stream=True, max_frame=20))
        assert _decode(b"".join(payload for *_, payload in frames)) == _decode(block)


class TestLeadingSizeUpdates:
    """RFC 7541 §4.2: at most two dynamic table size updates, at the start of a block."""

    def test_counts_the_updates_that_open_a_block(self) -> None:
        assert leading_size_updates(b"\x82\x86") == 0
        assert leading_size_updates(b"\x20\x82") == 1
        assert leading_size_updates(b"\x3f\xe1\x1f\x20\x82") == 2  # 4096 in 5+7+7 bits, then 0

    def test_stops_counting_past_the_limit(self) -> None:
        assert leading_size_updates(b"\x20" * 1_000_000) == 3

    def test_an_update_after_a_field_is_not_leading(self) -> None:
        assert leading_size_updates(b"\x82\x20") == 0
