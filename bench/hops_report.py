"""The per-hop latency budget of c=1 requests. Pure: the bus messages an observer saw and the
client's send / first-byte times → messages per request, hop deltas, CPU per request, medians.
No I/O, no clock; ``bench.hops`` runs the stack, the client and the observer.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.hops_subjects import PATH, PERIODIC, SIDE_EFFECT, category, relative, templates

SEND = "client send"
FIRST_BYTE = "client first byte"
HOPS: tuple[tuple[str, str, str], ...] = (
    ("gateway: parse, validate, publish", "gateway", "preprocess"),
    ("preprocessor: template, tokenize, open stream", "preprocessor", "router.generate"),
    ("router: pick a worker", "router", "worker.<worker>.generate"),
    ("worker: first step", "mocker-*", "stream.<formatter>.<request>"),
    ("formatter: first chunk", "formatter", "gateway.<gateway>.<request>"),
    ("gateway write + client read", "gateway, client", FIRST_BYTE),
)
"""The critical path as (hop, its processes, the first message it sends) after the client's
send; templates are relative to ``<namespace>.v1.``."""


@dataclass(frozen=True, slots=True)
class Seen:
    """One message as the observer read it."""

    t: float
    """``time.time()`` in the observer when its callback ran (publish + server + wake-up)."""
    subject: str
    reply: str
    size: int


@dataclass(frozen=True, slots=True)
class Sent:
    """One request as the client saw it (``time.time()`` seconds)."""

    send: float
    first_byte: float | None
    end: float


def windows(sent: Sequence[Sent]) -> list[tuple[float, float]]:
    """Each request's window at c=1: from its send to the next send; the last one lasts the
    median of the others (its own duration when it is alone)."""
    sends = [s.send for s in sent]
    spans = [b - a for a, b in itertools.pairwise(sends)]
    last = statistics.median(spans) if spans else sent[-1].end - sent[-1].send
    return [(a, b) for a, b in zip(sends, [*sends[1:], sends[-1] + last], strict=True)]


def attribute(times: Sequence[float], spans: Sequence[tuple[float, float]]) -> list[int]:
    """The window index of each time (``-1``: outside every window); ``spans`` sorted, adjacent."""
    starts = [a for a, _ in spans]
    out = []
    for t in times:
        i = bisect.bisect_right(starts, t) - 1
        out.append(i if i >= 0 and t < spans[i][1] else -1)
    return out


def pct(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (as ``bench.serving.pct``); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


@dataclass(frozen=True, slots=True)
class Attributed:
    """Observed messages grouped by request window: ``per[i]`` holds (template, offset_s,
    size) of window ``i`` in arrival order."""

    per: list[list[tuple[str, float, int]]]
    outside: int
    window_s: float


def request_windows(
    seen: Sequence[Seen], names: Sequence[str], index: Sequence[int], namespace: str
) -> dict[str, int]:
    """Request id → window: the gateway's ``Preprocess`` names its request in its reply subject
    (``<ns>.v1.gateway.<gateway>.<request>``); its window is the one it was seen in."""
    preprocess = f"{namespace}.v1.preprocess"
    return {
        msg.reply.rpartition(".")[2]: i
        for msg, name, i in zip(seen, names, index, strict=True)
        if name == preprocess and msg.reply and i >= 0
    }


def group(seen: Sequence[Seen], sent: Sequence[Sent], namespace: str) -> Attributed:
    """Templates and request of every message: by request id where its subject or reply ends
    in one (stream, gateway and bounce subjects: a late observer may read them after the next
    send), else by time window; messages outside every window are counted."""
    spans = windows(sent)
    names = templates(((m.subject, m.reply) for m in seen), namespace)
    index = attribute([m.t for m in seen], spans)
    owner = request_windows(seen, names, index, namespace)
    per: list[list[tuple[str, float, int]]] = [[] for _ in spans]
    outside = 0
    for msg, name, by_time in zip(seen, names, index, strict=True):
        rid = msg.subject.rpartition(".")[2]
        i = owner.get(rid, owner.get(msg.reply.rpartition(".")[2], by_time))
        if i < 0:
            outside += 1
        else:
            per[i].append((name, msg.t - spans[i][0], msg.size))
    for window in per:
        window.sort(key=lambda entry: entry[1])
    return Attributed(per=per, outside=outside, window_s=sum(b - a for a, b in spans))


def subject_table(grouped: Attributed, namespace: str) -> dict[str, dict[str, Any]]:
    """Per template: category, messages per request (median, mean), bytes per request, and the
    median offset (ms) of its first message in a window from that window's send."""
    n = len(grouped.per)
    counts: dict[str, list[int]] = defaultdict(lambda: [0] * n)
    sizes: dict[str, int] = defaultdict(int)
    firsts: dict[str, list[float]] = defaultdict(list)
    for i, window in enumerate(grouped.per):
        for name, offset_s, size in window:
            if counts[name][i] == 0:
                firsts[name].append(offset_s)
            counts[name][i] += 1
            sizes[name] += size
    table = {
        name: {
            "category": category(name, namespace),
            "per_request_median": statistics.median(c),
            "per_request_mean": round(sum(c) / n, 3),
            "bytes_per_request": round(sizes[name] / n, 1),
            "first_at_ms_median": _ms(statistics.median(firsts[name])),
        }
        for name, c in counts.items()
    }
    return dict(sorted(table.items(), key=lambda kv: (kv[1]["first_at_ms_median"], kv[0])))


def message_totals(grouped: Attributed, namespace: str) -> dict[str, float]:
    """Messages per request: all, and per category (means), plus the median of all."""
    n = len(grouped.per)
    totals = [len(w) for w in grouped.per]
    out: dict[str, float] = {
        "total_mean": round(sum(totals) / n, 3),
        "total_median": statistics.median(totals),
    }
    for cat in (PATH, SIDE_EFFECT, PERIODIC):
        k = sum(1 for w in grouped.per for name, _, _ in w if category(name, namespace) == cat)
        out[f"{cat}_mean"] = round(k / n, 3)
    periodic = out[f"{PERIODIC}_mean"] * n
    out["periodic_per_s"] = round(periodic / grouped.window_s, 2) if grouped.window_s else 0.0
    return out


def hop_budget(grouped: Attributed, sent: Sequence[Sent], namespace: str) -> list[dict[str, Any]]:
    """The critical path: each hop's median delta (ms) from the previous hop's first message
    (the first hop: from the client's send), and where it lands from the send (median)."""
    marks: list[dict[str, float]] = []
    for window, req in zip(grouped.per, sent, strict=True):
        first: dict[str, float] = {}
        for name, offset_s, _ in window:
            first.setdefault(relative(name, namespace), offset_s)
        if req.first_byte is not None:
            first[FIRST_BYTE] = req.first_byte - req.send
        marks.append(first)
    out = []
    previous = SEND
    for who, process, to in HOPS:
        deltas = [m[to] - m.get(previous, 0.0) for m in marks if to in m and _has(m, previous)]
        at = [m[to] for m in marks if to in m]
        out.append(
            {
                "hop": who,
                "process": process,
                "from": previous,
                "to": to,
                "delta_ms_median": _ms(statistics.median(deltas)) if deltas else None,
                "delta_ms_p90": _ms(pct(deltas, 90)),
                "at_ms_median": _ms(statistics.median(at)) if at else None,
                "requests": len(deltas),
            }
        )
        previous = to
    return out


def _has(marks: Mapping[str, float], name: str) -> bool:
    return name == SEND or name in marks


def latency(sent: Sequence[Sent]) -> dict[str, float | None]:
    """TTFT p50/p99 and end-to-end p50 (ms) of the requests that produced text."""
    ttft = [s.first_byte - s.send for s in sent if s.first_byte is not None]
    e2e = [s.end - s.send for s in sent]
    return {
        "ttft_ms_p50": _ms(pct(ttft, 50)),
        "ttft_ms_p99": _ms(pct(ttft, 99)),
        "e2e_ms_p50": _ms(pct(e2e, 50)),
    }


def per_request(
    before: Mapping[str, float], after: Mapping[str, float], n: int, scale: float = 1.0
) -> dict[str, float]:
    """(after - before) * scale / n for every key in both (CPU s → ms with ``scale=1000``)."""
    return {k: round((after[k] - before[k]) * scale / n, 3) for k in after if k in before}


def split_cpu(per_req: Mapping[str, float], stack: Iterable[str]) -> dict[str, float]:
    """CPU ms per request with ``launcher`` (the ``server`` tree beyond the named ``stack``
    processes) and ``unattributed`` (the ``machine`` beyond server, client and observer: kernel
    work and whatever else ran)."""
    out = dict(per_req)
    named = sum(out.get(k, 0.0) for k in stack)
    if "server" in out:
        out["launcher"] = round(max(0.0, out["server"] - named), 3)
    if "machine" in out:
        used = out.get("server", named) + out.get("client", 0.0) + out.get("observer", 0.0)
        out["unattributed"] = round(max(0.0, out["machine"] - used), 3)
    return out


def background(table: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Messages per request (mean) of every template off the request path."""
    return {name: row["per_request_mean"] for name, row in table.items() if row["category"] != PATH}


def render(result: Mapping[str, Any]) -> str:
    """A small human-readable budget table (for stderr)."""
    return "\n\n".join((_hop_lines(result), _subject_lines(result), _process_lines(result)))


def _hop_lines(result: Mapping[str, Any]) -> str:
    lines = [f"{'hop':<48}{'delta ms':>10}{'p90':>8}{'at ms':>9}"]
    lines += [
        f"{hop['hop']:<48}{_num(hop['delta_ms_median']):>10}"
        f"{_num(hop['delta_ms_p90']):>8}{_num(hop['at_ms_median']):>9}"
        for hop in result["hops"]
    ]
    lines.append(
        "TTFT p50/p99 ms: "
        + ", ".join(
            f"{phase} {_num(row['ttft_ms_p50'])}/{_num(row['ttft_ms_p99'])}"
            for phase, row in result["ttft"].items()
        )
    )
    return "\n".join(lines)


def _subject_lines(result: Mapping[str, Any]) -> str:
    lines = [f"{'subject':<62}{'category':>12}{'msg/req':>9}{'first ms':>10}"]
    lines += [
        f"{name[:62]:<62}{row['category']:>12}{row['per_request_mean']:>9}"
        f"{_num(row['first_at_ms_median']):>10}"
        for name, row in result["subjects"].items()
    ]
    totals = result["messages_per_request"]
    lines.append(
        f"messages/request: {totals['total_mean']} (path {totals['path_mean']}, side effects "
        f"{totals['side_effect_mean']}, periodic {totals['periodic_mean']}; "
        f"periodic {totals['periodic_per_s']}/s)"
    )
    return "\n".join(lines)


def _process_lines(result: Mapping[str, Any]) -> str:
    cpu, ctx = result["cpu_ms_per_request"], result["ctx_switches_per_request"]
    phases = list(cpu)
    head = "".join(f"{p[:14]:>15}" for p in phases)
    width = 15 * len(phases)
    lines = [f"{'':<16}{'cpu ms/request':^{width}}{'context switches/request':^{width}}"]
    lines.append(f"{'process':<16}{head}{head}")
    names = list(dict.fromkeys(name for p in phases for name in cpu[p]))
    lines += [
        f"{name:<16}"
        + "".join(f"{_num(cpu[p].get(name)):>15}" for p in phases)
        + "".join(f"{_num(ctx[p].get(name)):>15}" for p in phases)
        for name in names
    ]
    lines.append(f"load1: {result['load1']}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def budget(seen: Sequence[Seen], sent: Sequence[Sent], namespace: str) -> dict[str, Any]:
    """The bus half of the report: hops, subjects, messages per request, background."""
    grouped = group(seen, sent, namespace)
    table = subject_table(grouped, namespace)
    return {
        "hops": hop_budget(grouped, sent, namespace),
        "subjects": table,
        "messages_per_request": message_totals(grouped, namespace),
        "background_per_request": background(table),
        "observed_messages": len(seen),
        "outside_windows": grouped.outside,
    }
