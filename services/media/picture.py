"""Pure: the mock's deterministic pictures — a tiled gradient whose colours and pattern come
from a hash of (prompt, negative prompt, seed, size, index); a video scrolls it one tile per
frame.

Same inputs, same bytes: a client can test caching and fan-out against it, and two prompts (or
two items of one request) differ visibly. Rows are built per tile row and reused, so even a
1792x1024 image costs little more than its compression.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from services.media.png import encode_apng, encode_png

Colour = tuple[int, int, int]


def digest(
    prompt: str, *, seed: int | None, width: int, height: int, index: int, extra: str = ""
) -> bytes:
    """The 32 bytes everything about one picture is derived from."""
    key = f"{prompt}\x00{extra}\x00{seed}\x00{width}x{height}\x00{index}"
    return hashlib.sha256(key.encode()).digest()


class Pattern:
    """A grid of tiles coloured from ``digest``: a gradient between two colours, every tile
    whose hash bit is set shown in a third."""

    __slots__ = ("_colours", "cols", "height", "rows", "tile", "width")

    def __init__(self, key: bytes, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.tile = max(4, min(width, height) // 8)
        self.cols = -(-width // self.tile)
        self.rows = -(-height // self.tile)
        a: Colour = (key[0], key[1], key[2])
        b: Colour = (key[3], key[4], key[5])
        accent: Colour = (255 - key[6], 255 - key[7], 255 - key[8])
        span = max(1, self.cols + self.rows - 2)
        colours: list[list[bytes]] = []
        for ty in range(self.rows):
            line = []
            for tx in range(self.cols):
                bit = key[(tx * 7 + ty * 13) % 32] >> ((tx + ty) % 8) & 1
                if bit:
                    rgb = accent
                else:
                    t = (tx + ty) / span
                    rgb = (_mix(a[0], b[0], t), _mix(a[1], b[1], t), _mix(a[2], b[2], t))
                line.append(bytes(rgb))
            colours.append(line)
        self._colours = colours

    def scanlines(self, shift: int = 0) -> Iterator[bytes]:
        """The image's rows, the tiles moved ``shift`` columns to the left (wrapping)."""
        tile, width, cols = self.tile, self.width, self.cols
        stride = 3 * width
        for ty, line in enumerate(self._colours):
            row = b"".join(line[(tx + shift) % cols] * tile for tx in range(cols))[:stride]
            for _ in range(min(tile, self.height - ty * tile)):
                yield row


def _mix(a: int, b: int, t: float) -> int:
    return round(a + (b - a) * t)


def image_png(
    prompt: str, *, seed: int | None, width: int, height: int, index: int, extra: str = ""
) -> bytes:
    """One deterministic PNG."""
    key = digest(prompt, seed=seed, width=width, height=height, index=index, extra=extra)
    return encode_png(width, height, Pattern(key, width, height).scanlines())


def video_apng(
    prompt: str,
    *,
    seed: int | None,
    width: int,
    height: int,
    index: int,
    frames: int,
    fps: int,
    extra: str = "",
) -> bytes:
    """One deterministic animated PNG of ``frames`` frames at ``fps``."""
    key = digest(
        prompt, seed=seed, width=width, height=height, index=index, extra=f"video\x00{extra}"
    )
    pattern = Pattern(key, width, height)
    return encode_apng(width, height, [pattern.scanlines(k) for k in range(frames)], fps=fps)
