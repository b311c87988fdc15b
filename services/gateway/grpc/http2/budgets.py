"""Flood budgets of one HTTP/2 connection, pure: how many frames of each kind that cost the
server work without asking for any (RFC 9113 §10.5) a client may send.

Each kind has a token bucket: ``burst`` frames at once, refilled at ``per_second``, and for
the kinds a client sends *because* it is answered (PING, WINDOW_UPDATE) also by ``credit``: each
response frame the server writes earns ``per_response`` of them. A grpc client sends a
WINDOW_UPDATE per stream it reads from and a BDP PING as data arrives, so their legitimate rate
follows the server's output (the stock client at c=64 sends over 10,000 WINDOW_UPDATEs a
second), while a flood of them over answers that cannot move earns nothing. A frame over its
budget is a connection error ``ENHANCE_YOUR_CALM`` (the connection's job). The Rapid Reset
figures are nghttp2's defaults (a burst of 1000 stream resets, then 33 a second).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Flood(Enum):
    """The kinds of frame that are budgeted."""

    RESET = "RST_STREAM"
    """A stream reset by the client (Rapid Reset: HEADERS then RST_STREAM, CVE-2023-44487)."""
    PING = "PING"
    SETTINGS = "SETTINGS"
    EMPTY_DATA = "empty DATA"
    """DATA with no payload that does not end the stream."""
    EMPTY_CONTINUATION = "empty CONTINUATION"
    """CONTINUATION with no payload that does not end the header block."""
    WINDOW_UPDATE = "WINDOW_UPDATE"
    PRIORITY = "PRIORITY"
    UNKNOWN = "unknown"
    """A frame of a type the server does not know (ignored, RFC 9113 §4.1, but counted)."""


@dataclass(frozen=True, slots=True)
class Rate:
    burst: int
    per_second: float
    per_response: float = 0.0
    """Frames earned by each response frame (HEADERS or DATA) the server writes."""


RATES: dict[Flood, Rate] = {
    Flood.RESET: Rate(1000, 33),
    Flood.PING: Rate(1000, 100, per_response=1),
    Flood.SETTINGS: Rate(100, 10),
    Flood.EMPTY_DATA: Rate(100, 10),
    Flood.EMPTY_CONTINUATION: Rate(100, 10),
    Flood.WINDOW_UPDATE: Rate(10_000, 1000, per_response=2),
    Flood.PRIORITY: Rate(1000, 100),
    Flood.UNKNOWN: Rate(1000, 100),
}
"""Every budget; ``docs/operations.md`` lists them in its limits table."""


class Budgets:
    """One connection's buckets, all full at first; ``take(kind, now)`` spends one frame."""

    __slots__ = ("_rates", "_stamps", "_tokens")

    def __init__(self, now: float, rates: dict[Flood, Rate] = RATES) -> None:
        self._rates = rates
        self._tokens = {kind: float(rate.burst) for kind, rate in rates.items()}
        self._stamps = dict.fromkeys(rates, now)

    def credit(self, responses: int) -> None:
        """``responses`` response frames were written: the kinds they earn get their share."""
        for kind, rate in self._rates.items():
            if rate.per_response:
                self._tokens[kind] = min(
                    float(rate.burst), self._tokens[kind] + responses * rate.per_response
                )

    def take(self, kind: Flood, now: float) -> bool:
        """Spend one frame of ``kind`` at ``now`` (seconds, monotonic): False when its budget
        is spent (the frame is one too many)."""
        rate = self._rates[kind]
        tokens = min(
            float(rate.burst), self._tokens[kind] + (now - self._stamps[kind]) * rate.per_second
        )
        self._stamps[kind] = now
        if tokens < 1.0:
            self._tokens[kind] = tokens
            return False
        self._tokens[kind] = tokens - 1.0
        return True
