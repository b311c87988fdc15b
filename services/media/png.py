"""Pure: PNG and animated PNG (APNG) files from RGB rows, with the standard library only.

A PNG is the 8-byte signature, then chunks (``length``, ``type``, ``data``, CRC-32 of type and
data): ``IHDR`` (size, 8-bit RGB), ``IDAT`` (the zlib stream of the rows, each led by filter
byte 0), ``IEND``. An APNG adds ``acTL`` (frame count, loops) and per frame an ``fcTL`` (its
size, offset and delay); the first frame's data is the ``IDAT`` (what a viewer without APNG
support shows), later frames go in ``fdAT`` chunks. ``fcTL`` and ``fdAT`` share one sequence
number counter (https://www.w3.org/TR/png-3/#apng-frame-control-chunk).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COMPRESSION_LEVEL = 6


def chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 over type and data."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _header(width: int, height: int) -> bytes:
    if width < 1 or height < 1:
        raise ValueError(f"an image needs a positive size, not {width}x{height}")
    # bit depth 8, colour type 2 (RGB), deflate, adaptive filtering, no interlace
    return chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))


def _pixels(width: int, rows: Iterable[bytes]) -> bytes:
    """The compressed image data: a row equal to the one above as filter type 2 (up: all
    zeros, which deflate packs far better than a repeat), any other row as type 0 (none)."""
    stride = 3 * width
    same = b"\x02" + bytes(stride)
    raw = bytearray()
    previous = b""
    for row in rows:
        if len(row) != stride:
            raise ValueError(f"a row of a {width}-pixel RGB image has {stride} bytes")
        if row == previous:
            raw += same
        else:
            raw += b"\x00"
            raw += row
        previous = row
    return zlib.compress(bytes(raw), COMPRESSION_LEVEL)


def encode_png(width: int, height: int, rows: Iterable[bytes]) -> bytes:
    """A PNG of ``height`` RGB rows of ``3 * width`` bytes each."""
    data = _pixels(width, rows)
    return SIGNATURE + _header(width, height) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def encode_apng(
    width: int, height: int, frames: Sequence[Iterable[bytes]], *, fps: int, loops: int = 0
) -> bytes:
    """An animated PNG: every frame full size, shown ``1/fps`` s each (``loops`` 0 = forever)."""
    if not frames:
        raise ValueError("an animation needs at least one frame")
    if not 1 <= fps <= 65535:
        raise ValueError(f"fps must be 1..65535, not {fps}")
    parts = [
        SIGNATURE,
        _header(width, height),
        chunk(b"acTL", struct.pack(">II", len(frames), loops)),
    ]
    seq = 0
    for index, rows in enumerate(frames):
        # fcTL: sequence, size, offset (0, 0), delay fps-th of a second, dispose none, blend source
        control = struct.pack(">IIIIIHHBB", seq, width, height, 0, 0, 1, fps, 0, 0)
        parts.append(chunk(b"fcTL", control))
        seq += 1
        data = _pixels(width, rows)
        if index == 0:
            parts.append(chunk(b"IDAT", data))
        else:
            parts.append(chunk(b"fdAT", struct.pack(">I", seq) + data))
            seq += 1
    parts.append(chunk(b"IEND", b""))
    return b"".join(parts)
