"""Image sizes read from file headers, checked against files Pillow writes."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from services.preprocessor.image_header import NotAnImage, read_header


def encoded(fmt: str, size: tuple[int, int] = (123, 45), mode: str = "RGB", **kw: Any) -> bytes:
    out = io.BytesIO()
    Image.new(mode, size, 0).save(out, fmt, **kw)
    return out.getvalue()


@pytest.mark.parametrize(
    ("fmt", "kw", "name"),
    [
        ("PNG", {}, "png"),
        ("JPEG", {}, "jpeg"),
        ("JPEG", {"progressive": True}, "jpeg"),
        ("GIF", {}, "gif"),
        ("WEBP", {}, "webp"),
        ("WEBP", {"lossless": True}, "webp"),
    ],
)
def test_reads_the_size_of_each_format(fmt: str, kw: dict[str, Any], name: str) -> None:
    header = read_header(encoded(fmt, **kw))
    assert (header.format, header.width, header.height) == (name, 123, 45)


def test_reads_an_extended_webp_header() -> None:
    data = encoded("WEBP", (77, 33), mode="RGBA", exact=True)
    assert data[12:16] == b"VP8X"
    assert (read_header(data).width, read_header(data).height) == (77, 33)


def test_text_is_not_an_image() -> None:
    with pytest.raises(NotAnImage, match="not a PNG, JPEG, GIF or WebP"):
        read_header(b"hello, this is not a picture")


def test_a_truncated_png_is_not_an_image() -> None:
    with pytest.raises(NotAnImage, match="IHDR"):
        read_header(encoded("PNG")[:20])


def test_a_jpeg_without_a_frame_header_is_not_an_image() -> None:
    with pytest.raises(NotAnImage, match="frame header"):
        read_header(b"\xff\xd8\xff\xd9")


def test_a_header_of_zero_pixels_is_not_an_image() -> None:
    data = bytearray(encoded("GIF"))
    data[6:8] = b"\x00\x00"
    with pytest.raises(NotAnImage, match="0x45"):
        read_header(bytes(data))
