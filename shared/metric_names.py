"""The prefix every Prometheus metric name starts with (``--metrics-prefix``), and the renaming
between names as the code writes them and as a scrape shows them. Pure; no prometheus_client.

Instruments are declared with the default prefix (``jetserve_router_decisions_total``); a
service started with ``--metrics-prefix acme_`` shows that metric as
``acme_router_decisions_total`` (``prefixed``). Readers of a scrape (``jetserve top``) turn the
names back (``canonical``), so they keep matching the names the code writes.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "jetserve_"
_PREFIX = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
"""What may start a Prometheus metric name (the whole name's pattern, so not empty)."""


def prefix_problem(prefix: str) -> str | None:
    """What makes ``prefix`` unusable as the start of every metric name, or ``None``."""
    if _PREFIX.fullmatch(prefix):
        return None
    return f"must be letters, digits, _ or : (not first a digit), got {prefix!r}"


def prefixed(name: str, prefix: str) -> str:
    """``name`` as the code writes it (``jetserve_x``) as a scrape shows it (``<prefix>x``)."""
    if prefix == DEFAULT_PREFIX:
        return name
    return prefix + name.removeprefix(DEFAULT_PREFIX)


def canonical(name: str, prefix: str) -> str:
    """A scraped ``name`` as the code writes it: ``<prefix>x`` is ``jetserve_x``. A name with the
    default prefix (from a service started without ``--metrics-prefix``) stays as it is; when
    both prefixes fit, the longer one wins."""
    if prefix == DEFAULT_PREFIX or not name.startswith(prefix):
        return name
    if name.startswith(DEFAULT_PREFIX) and len(DEFAULT_PREFIX) >= len(prefix):
        return name
    return DEFAULT_PREFIX + name[len(prefix) :]
