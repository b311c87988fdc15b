"""HTTP/2 (RFC 9113) and gRPC wire pieces, pure: frame headers, settings, the header blocks the
server sends, ``grpc-timeout``, ``grpc-message`` and metadata encodings.

The server never indexes into HPACK's dynamic table (RFC 7541): every field it sends is a
static-table index or a literal without indexing, so response blocks are stateless bytes, and
the common ones are built once. Request blocks are decoded with the ``hpack`` package.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterable
from enum import IntEnum

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">IBI")
"""Length (24 bits) and type packed in the first word, flags, stream id (31 bits)."""
FRAME_HEADER_SIZE = 9
MESSAGE_PREFIX = struct.Struct(">BI")
"""gRPC length-prefixed message: compressed flag, length."""
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
MIN_FRAME_SIZE = 16_384
MAX_FRAME_SIZE = 2**24 - 1


class FrameType(IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag:
    END_STREAM = 0x1
    ACK = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class Setting(IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame, header and payload."""
    return FRAME_HEADER.pack(len(payload) << 8 | kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length << 8 | kind, flags, stream_id)


def settings_payload(settings: Iterable[tuple[int, int]]) -> bytes:
    return b"".join(struct.pack(">HI", key, value) for key, value in settings)


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload (its length is a multiple of 6)."""
    return [struct.unpack_from(">HI", payload, i) for i in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


def header_frames(stream_id: int, block: bytes, *, end_stream: bool, max_frame: int) -> bytes:
    """A HEADERS frame, followed by CONTINUATION frames when the block is larger than a frame."""
    end = Flag.END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return frame(FrameType.HEADERS, end | Flag.END_HEADERS, stream_id, block)
    pieces = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(FrameType.HEADERS, end, stream_id, pieces[0])]
    out += [frame(FrameType.CONTINUATION, 0, stream_id, p) for p in pieces[1:-1]]
    out.append(frame(FrameType.CONTINUATION, Flag.END_HEADERS, stream_id, pieces[-1]))
    return b"".join(out)


# --- HPACK encoding, without the dynamic table ------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1: ``value`` with an N-bit prefix; ``first`` holds the bits above it."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def leading_size_updates(block: bytes, limit: int = 2) -> int:
    """How many dynamic table size updates (RFC 7541 §6.3) open ``block``, counting no further
    than ``limit + 1``: §4.2 allows at most two, at its start."""
    count = pos = 0
    while count <= limit and pos < len(block) and block[pos] & 0xE0 == 0x20:
        count += 1
        if block[pos] & 0x1F == 0x1F:  # the integer goes on in 7-bit groups (§5.1)
            pos += 1
            while pos < len(block) and block[pos] & 0x80:
                pos += 1
        pos += 1
    return count


def _string(data: bytes) -> bytes:
    """RFC 7541 §5.2, without Huffman coding."""
    return _integer(len(data), 7, 0x00) + data


def literal(name: bytes, value: bytes) -> bytes:
    """A literal field without indexing and a literal name (RFC 7541 §6.2.2)."""
    return b"\x00" + _string(name) + _string(value)


_STATUS_200 = b"\x88"  # static table entry 8, ":status: 200"
_CONTENT_TYPE_INDEX = 31  # static table entry 31, "content-type"
TABLE_SIZE_ZERO = _integer(0, 5, 0x20)
"""A dynamic table size update to 0 (RFC 7541 §6.3): this encoder never uses the table."""


def _content_type(value: bytes) -> bytes:
    return _integer(_CONTENT_TYPE_INDEX, 4, 0x00) + _string(value)


RESPONSE_HEADERS = _STATUS_200 + _content_type(b"application/grpc")
"""The block before a gRPC response's first message."""
TRAILERS_OK = literal(b"grpc-status", b"0")


def http_status(status: int) -> bytes:
    """A bare HTTP response for a request that is not gRPC (e.g. 415), as a header block."""
    return b"\x08" + _string(str(status).encode())  # name ":status" from the static table


def trailers(
    code: int,
    message: str = "",
    metadata: Iterable[tuple[str, str | bytes]] = (),
    *,
    trailers_only: bool = False,
) -> bytes:
    """The block ending a gRPC response; ``trailers_only`` when no headers were sent before."""
    block = RESPONSE_HEADERS if trailers_only else b""
    block += TRAILERS_OK if code == 0 else literal(b"grpc-status", str(code).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    for key, value in metadata:
        block += literal(*encode_metadatum(key, value))
    return block


# --- gRPC header values -------------------------------------------------------------------------

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def parse_timeout(value: bytes) -> float:
    """``grpc-timeout`` in seconds: at most 8 digits and a unit (H M S m u n)."""
    digits, unit = value[:-1], value[-1:]
    if not (1 <= len(digits) <= 8 and digits.isdigit()) or unit not in _TIMEOUT_UNITS:
        raise ValueError(f"invalid grpc-timeout {value!r}")
    return int(digits) * _TIMEOUT_UNITS[unit]


_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> bytes:
    """``grpc-message``: printable ASCII but ``%`` as is, other UTF-8 bytes as ``%XX``."""
    data = message.encode()
    if all(b in _UNRESERVED for b in data):
        return data
    return b"".join(bytes((b,)) if b in _UNRESERVED else b"%%%02X" % b for b in data)


def encode_metadatum(key: str, value: str | bytes) -> tuple[bytes, bytes]:
    """A metadata pair as header bytes: ``-bin`` values base64 without padding."""
    name = key.lower().encode()
    if name.endswith(b"-bin"):
        raw = value if isinstance(value, bytes) else value.encode()
        return name, base64.b64encode(raw).rstrip(b"=")
    return name, value.encode() if isinstance(value, str) else value


def decode_metadatum(name: bytes, value: bytes) -> tuple[str, str | bytes]:
    """A request header as gRPC metadata: ``-bin`` values decoded from base64."""
    key = name.decode("latin-1")
    if key.endswith("-bin"):
        return key, base64.b64decode(value + b"=" * (-len(value) % 4))
    return key, value.decode("latin-1")
