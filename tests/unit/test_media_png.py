"""The mock media worker's PNG and APNG files, read back chunk by chunk with zlib alone: every
CRC, the header, each frame's rows, and the APNG sequence numbers."""

from __future__ import annotations

import struct
import zlib

import pytest

from services.media.png import SIGNATURE, chunk, encode_apng, encode_png


class Decoded:
    """A PNG / APNG read back: its size and every frame's RGB rows (filters undone)."""

    def __init__(self, width: int, height: int, frames: list[list[bytes]], kinds: list[bytes]):
        self.width, self.height, self.frames, self.kinds = width, height, frames, kinds


def read_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """Every chunk's type and data, each CRC checked; fails on anything malformed."""
    assert data[:8] == SIGNATURE, "not a PNG signature"
    chunks, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack_from(">I", data, pos + 8 + length)
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert pos == len(data), "trailing bytes"
    assert chunks[0][0] == b"IHDR"
    assert chunks[-1] == (b"IEND", b"")
    return chunks


def _rows(compressed: bytes, width: int, height: int) -> list[bytes]:
    raw = zlib.decompress(compressed)
    stride = 3 * width
    assert len(raw) == height * (stride + 1), "wrong amount of image data"
    rows: list[bytes] = []
    previous = bytes(stride)
    for y in range(height):
        line = raw[y * (stride + 1) : (y + 1) * (stride + 1)]
        kind, body = line[0], line[1:]
        if kind == 0:
            row = body
        elif kind == 2:
            row = bytes((a + b) & 0xFF for a, b in zip(body, previous, strict=True))
        else:
            raise AssertionError(f"unexpected filter type {kind}")
        rows.append(row)
        previous = row
    return rows


def decode(data: bytes) -> Decoded:
    """Read a PNG or an APNG written by ``services.media.png``."""
    chunks = read_chunks(data)
    width, height, depth, colour, comp, filt, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, comp, filt, interlace) == (8, 2, 0, 0, 0)
    frames: list[list[bytes]] = []
    idat = b"".join(body for kind, body in chunks if kind == b"IDAT")
    frames.append(_rows(idat, width, height))
    seqs: list[int] = []
    for kind, body in chunks:
        if kind == b"fcTL":
            seq, w, h, x, y = struct.unpack_from(">IIIII", body)
            assert (w, h, x, y) == (width, height, 0, 0)
            seqs.append(seq)
        elif kind == b"fdAT":
            seqs.append(struct.unpack_from(">I", body)[0])
            frames.append(_rows(body[4:], width, height))
    assert seqs == list(range(len(seqs))), "APNG sequence numbers must count up from 0"
    actl = [body for kind, body in chunks if kind == b"acTL"]
    if actl:
        count, _loops = struct.unpack(">II", actl[0])
        assert count == len(frames)
    return Decoded(width, height, frames, [kind for kind, _ in chunks])


def test_chunk_layout_and_crc() -> None:
    made = chunk(b"tEXt", b"abc")
    assert made[:4] == b"\x00\x00\x00\x03"
    assert made[4:11] == b"tEXtabc"
    assert struct.unpack(">I", made[11:])[0] == zlib.crc32(b"tEXtabc")


def test_png_round_trips_rows_including_repeated_ones() -> None:
    rows = [b"\x01\x02\x03\x04\x05\x06", b"\x01\x02\x03\x04\x05\x06", b"\xff\x00\x00\x00\xff\x00"]
    decoded = decode(encode_png(2, 3, rows))
    assert (decoded.width, decoded.height) == (2, 3)
    assert decoded.frames == [rows]
    assert decoded.kinds == [b"IHDR", b"IDAT", b"IEND"]


def test_apng_frames_and_sequence_numbers() -> None:
    frames = [[bytes([k, k, k]) * 4] * 2 for k in range(3)]
    data = encode_apng(4, 2, frames, fps=12)
    decoded = decode(data)
    assert decoded.frames == frames
    assert decoded.kinds == [
        b"IHDR",
        b"acTL",
        b"fcTL",
        b"IDAT",
        b"fcTL",
        b"fdAT",
        b"fcTL",
        b"fdAT",
        b"IEND",
    ]
    fctl = [body for kind, body in read_chunks(data) if kind == b"fcTL"]
    delays = {struct.unpack_from(">HH", body, 20) for body in fctl}
    assert delays == {(1, 12)}


@pytest.mark.parametrize(
    ("width", "height", "rows", "match"),
    [(0, 1, [], "positive size"), (2, 1, [b"\x00" * 5], "has 6 bytes")],
)
def test_bad_sizes_and_rows_are_refused(
    width: int, height: int, rows: list[bytes], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        encode_png(width, height, rows)


def test_apng_needs_frames_and_a_valid_rate() -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        encode_apng(1, 1, [], fps=24)
    with pytest.raises(ValueError, match="fps"):
        encode_apng(1, 1, [[b"\x00\x00\x00"]], fps=0)
