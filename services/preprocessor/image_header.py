"""Pure: an image file's format and size from its header (PNG, JPEG, GIF, WebP), no decoding.

The preprocessor needs only an image's width and height (its token count follows from them), so
it reads them from the header instead of depending on an imaging library (decision 032). The
layouts: PNG's IHDR chunk (RFC 2083 §4.1.1), GIF's logical screen descriptor (GIF89a §18), a
JPEG's first start-of-frame segment (ITU T.81 §B.2.2), and WebP's ``VP8 `` / ``VP8L`` / ``VP8X``
chunk (RFC 9649 §2.5-2.7).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FORMATS = ("png", "jpeg", "gif", "webp")
_PNG = b"\x89PNG\r\n\x1a\n"
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
"""JPEG start-of-frame markers (0xC4 DHT, 0xC8 JPG and 0xCC DAC share the range)."""
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})
"""JPEG markers with no length field (TEM, RSTn)."""


class NotAnImage(ValueError):
    """The bytes are not a PNG, JPEG, GIF or WebP file whose size can be read."""


@dataclass(frozen=True, slots=True)
class ImageHeader:
    format: str
    width: int
    height: int


def read_header(data: bytes) -> ImageHeader:
    """The format, width and height of an image file; ``NotAnImage`` for anything else (or a
    header that says 0 pixels)."""
    if data.startswith(_PNG):
        header = _png(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        header = _gif(data)
    elif data.startswith(b"\xff\xd8"):
        header = _jpeg(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        header = _webp(data)
    else:
        raise NotAnImage("not a PNG, JPEG, GIF or WebP file")
    if header.width < 1 or header.height < 1:
        raise NotAnImage(f"the {header.format} header says {header.width}x{header.height} pixels")
    return header


def _png(data: bytes) -> ImageHeader:
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise NotAnImage("a PNG file without its IHDR chunk")
    width, height = struct.unpack(">II", data[16:24])
    return ImageHeader("png", width, height)


def _gif(data: bytes) -> ImageHeader:
    if len(data) < 10:
        raise NotAnImage("a truncated GIF header")
    width, height = struct.unpack("<HH", data[6:10])
    return ImageHeader("gif", width, height)


def _jpeg(data: bytes) -> ImageHeader:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise NotAnImage("a JPEG file with a broken segment")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker in _STANDALONE:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            break
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF:
            if i + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return ImageHeader("jpeg", width, height)
        i += 2 + length
    raise NotAnImage("a JPEG file without a frame header")


def _webp(data: bytes) -> ImageHeader:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return ImageHeader("webp", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return ImageHeader("webp", width, height)
    raise NotAnImage("a WebP file without a readable VP8, VP8L or VP8X header")
