"""The fairness bench's report (``make bench-fairness``, issue 26). Pure: the two systems' policy
files, which gateway a request enters by, the client's finished requests → one JSON line per run,
the lines → the summary. No I/O, no clock; ``bench.fairness`` runs things.

The measure is the one issue 26 names: uncached prompt tokens served per policy class over a
window, counted by the client for the requests that *completed* inside the window (by their
completion time), the same way for both systems. ``share_ratio`` = premium / regular.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BENCH = "fairness"
"""Every line's ``bench``: what tells these lines from other benches' in a shared file."""
PREMIUM = "premium"
REGULAR = "regular"
CLASSES = (PREMIUM, REGULAR)
WEIGHTS = {PREMIUM: 4, REGULAR: 1}
TARGET_RATIO = WEIGHTS[PREMIUM] / WEIGHTS[REGULAR]
CLASS_HEADER = "x-dynamo-meta-policy-class"
DYNAMO_QUANTUM_PER_WEIGHT = 128
"""Dynamo's DRR quantum per weight unit, in uncached tokens: premium 512, regular 128 — the pair
Dynamo's own CPU-mocker regression uses for "about 4:1"."""
JETSERVE_QUANTUM_TOKENS = 512
"""JetServe's ``quantum_tokens`` (its default): uncached prompt tokens per weight unit."""
SINGLE = "single"
SKEWED = "skewed"
SITES = "sites"
SCENARIOS = (SINGLE, SKEWED, SITES)
GATEWAY = "gateway"
CLUSTER = "cluster"
TOPOLOGIES = (GATEWAY, CLUSTER)
"""``sites``' NATS: two one-node clusters joined by gateways, a supercluster (the default), or
one two-node cluster."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """How many gateways (Dynamo: frontends, each with its router) and routers a run has."""

    name: str
    gateways: int
    routers: int


SCENARIO = {
    SINGLE: Scenario(SINGLE, 1, 1),
    SKEWED: Scenario(SKEWED, 2, 2),
    SITES: Scenario(SITES, 2, 2),
}
"""``single``: one gateway, one router, balanced ingress (the baseline: ≈ 4:1 where the policy
queues); ``skewed``: two gateways and two routers, premium traffic mostly through gateway 0;
``sites``: the same two of each, as two sites on their own NATS nodes, so the routers' ingress is
skewed too (JetServe only: a Dynamo frontend embeds its router, so its ``skewed`` is this)."""
SITE_NAMES = ("a", "b")
HUNG_S = 30.0
"""A request still unanswered this long at the end is counted as hung (the router queue's own
``--queue-max-wait-s`` is 30 s)."""


def dynamo_policy_yaml(busy_tokens: int) -> str:
    """Dynamo 1.6.1's ``--router-policy-config``: one cache bucket, a policy family per class
    (the ``x-dynamo-meta-policy-class`` header names the family; unknown or absent → regular),
    DRR quanta 512:128, and a per-worker prefill-busy threshold of ``busy_tokens`` active
    prefill tokens, which turns the router queue on (a request waits while every worker is over
    it). The schema, from the 1.6.1 binary's field names and validation messages:
    ``default_policy_family``, ``uncached_isl_buckets`` (``min_tokens``, ``bucket``; the first
    at 0) and ``policy_classes`` (``name``, ``policy_family`` + ``cache_bucket`` or neither,
    ``quantum`` > 0, ``queue_policy`` fcfs|wspt, ``prefill_busy_threshold[_frac]``, per-worker
    queue limits) must all be present together."""
    classes = "".join(
        f"  - name: {cls}\n"
        f"    policy_family: {cls}\n"
        f"    cache_bucket: all\n"
        f"    queue_policy: fcfs\n"
        f"    quantum: {WEIGHTS[cls] * DYNAMO_QUANTUM_PER_WEIGHT}\n"
        f"    prefill_busy_threshold: {busy_tokens}\n"
        for cls in CLASSES
    )
    return (
        f"default_policy_family: {REGULAR}\n"
        "uncached_isl_buckets:\n"
        "  - min_tokens: 0\n"
        "    bucket: all\n"
        f"policy_classes:\n{classes}"
    )


def jetserve_admission_yaml() -> str:
    """JetServe's ``--admission-config`` (``shared.admission``): the same two classes and
    weights; ``class_header: true`` lets the header pick the class."""
    classes = "".join(f"  {cls}: {{weight: {WEIGHTS[cls]}}}\n" for cls in CLASSES)
    return (
        f"default_class: {REGULAR}\n"
        f"quantum_tokens: {JETSERVE_QUANTUM_TOKENS}\n"
        "class_header: true\n"
        f"classes:\n{classes}"
    )


def gateway_for(draw: float, skew: float, gateways: int) -> int:
    """The gateway a request enters by: 0 with probability ``skew`` (``draw`` is uniform in
    [0, 1)), else 1; always 0 with one gateway."""
    return 0 if gateways == 1 or draw < skew else 1


@dataclass(frozen=True, slots=True)
class Done:
    """One request as the client saw it end (``status`` 0: no HTTP answer)."""

    cls: str
    gateway: int
    status: int
    end_s: float
    """When it ended, on the client's monotonic clock."""
    ttft_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""
    start_s: float = 0.0
    """When it was sent (status -1: still unanswered when the load stopped at ``end_s``)."""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.ttft_s is not None and self.prompt_tokens > 0

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.cached_tokens)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile (0-1) by nearest rank; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def share_ratio(served: Mapping[str, int]) -> float | None:
    """Premium's served tokens over regular's (``None`` when regular got none)."""
    regular = served.get(REGULAR, 0)
    return round(served.get(PREMIUM, 0) / regular, 3) if regular else None


def tally(done: Iterable[Done], start_s: float, end_s: float) -> dict[str, Any]:
    """What the requests that ended in [``start_s``, ``end_s``) add up to, per class: served
    uncached prompt tokens and requests (successful ones), TTFT p50, errors by status, and the
    requests per gateway."""
    window = [d for d in done if start_s <= d.end_s < end_s]
    ok = [d for d in window if d.ok]
    served = {cls: sum(d.uncached_tokens for d in ok if d.cls == cls) for cls in CLASSES}
    requests = {cls: sum(1 for d in ok if d.cls == cls) for cls in CLASSES}
    ttft = {
        cls: _ms(percentile([d.ttft_s for d in ok if d.cls == cls and d.ttft_s is not None], 0.5))
        for cls in CLASSES
    }
    errors = Counter(str(d.status) for d in window if not d.ok)
    by_gateway = Counter(f"{d.cls}@{d.gateway}" for d in ok)
    first_errors: dict[str, str] = {}
    for d in window:
        if not d.ok:
            first_errors.setdefault(str(d.status), d.error[:300])
    prompt = [d.prompt_tokens for d in ok]
    cached = sum(d.cached_tokens for d in ok)
    return {
        "served_uncached_tokens": served,
        "requests": requests,
        "ttft_ms_p50": ttft,
        "errors": dict(sorted(errors.items())),
        "first_errors": dict(sorted(first_errors.items())),
        "requests_by_gateway": dict(sorted(by_gateway.items())),
        "prompt_tokens_mean": round(statistics.fmean(prompt), 1) if prompt else None,
        "cached_tokens": cached,
        "ok": len(ok),
    }


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000, 1) if seconds is not None else None


def cpu_us_per_request(
    before: Mapping[str, int], after: Mapping[str, int], requests: int, ticks_per_s: int
) -> dict[str, float | None]:
    """CPU microseconds per request of each named process between two readings of its
    utime + stime (clock ticks); a process missing from either reading is left out."""
    out: dict[str, float | None] = {}
    for name in sorted(before.keys() & after.keys()):
        used_us = (after[name] - before[name]) * 1_000_000 / ticks_per_s
        out[name] = round(used_us / requests, 1) if requests else None
    return out


def group_sum(per_process: Mapping[str, float | None], prefix: str) -> float | None:
    """The sum over the processes whose name starts with ``prefix`` (``None``: none, or one
    unknown)."""
    values = [v for k, v in per_process.items() if k.startswith(prefix)]
    if not values or any(v is None for v in values):
        return None
    return round(sum(v for v in values if v is not None), 1)


def per_request(before: Mapping[str, int], after: Mapping[str, int], requests: int) -> float | None:
    """NATS messages (in + out, as nats-server counts them) per request between two readings of
    ``/varz`` (``None`` without both readings or requests)."""
    if not before or not after or not requests:
        return None
    keys = ("in_msgs", "out_msgs")
    return round(sum(after[k] - before[k] for k in keys) / requests, 2)


@dataclass(frozen=True, slots=True)
class Run:
    """One measured run's identity and set-up, copied into its line."""

    system: str
    scenario: Scenario
    round: int
    duration_s: float
    settings: Mapping[str, Any]


def run_line(
    run: Run,
    counts: Mapping[str, Any],
    cpu_us: Mapping[str, float | None],
    nats_msgs_per_req: float | None,
    load: tuple[tuple[float, float, float], tuple[float, float, float]],
    queue_depth: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One run → its JSON line (issue 26's keys first)."""
    served = counts["served_uncached_tokens"]
    total = sum(served.values())
    return {
        "bench": BENCH,
        "system": run.system,
        "scenario": run.scenario.name,
        "routers": run.scenario.routers,
        "gateways": run.scenario.gateways,
        "share_ratio": share_ratio(served),
        "target_ratio": TARGET_RATIO,
        "round": run.round,
        **counts,
        "served_tokens_per_s": round(total / run.duration_s) if run.duration_s else None,
        "duration_s": run.duration_s,
        "router_cpu_us_per_req": group_sum(cpu_us, "router"),
        "gateway_cpu_us_per_req": group_sum(cpu_us, "gateway"),
        "frontend_cpu_us_per_req": group_sum(cpu_us, "frontend"),
        "cpu_us_per_req": dict(cpu_us),
        "nats_msgs_per_req": nats_msgs_per_req,
        "router_queue_depth_mean": dict(queue_depth) if queue_depth is not None else None,
        "loadavg_start": [round(v, 2) for v in load[0]],
        "loadavg_end": [round(v, 2) for v in load[1]],
        "settings": dict(run.settings),
    }


@dataclass(frozen=True, slots=True)
class NatsNode:
    """One nats-server of a ``sites`` run: its name, client and monitoring ports, configuration
    file text, and whether it runs JetStream (``-js``)."""

    name: str
    port: int
    monitor_port: int
    conf: str
    jetstream: bool


def site_nodes(topology: str, ports: Sequence[int]) -> list[NatsNode]:
    """The two nats-servers of a ``sites`` run, named as ``SITE_NAMES``, both with JetStream;
    ``ports``: 9 free ports (client, monitoring and link port of each, then the one-node
    clusters' route ports).

    ``gateway``: each node its own one-node cluster (JetStream in a supercluster needs a
    configured route: its own), the two joined by gateways; a gateway hands a queue-group
    message to a subscriber in its own cluster when there is one, so each site's router gets
    its own site's requests. ``cluster``: one two-node cluster; nats-server 2.15 spreads a queue
    group's messages over the whole cluster (checked: 1,000 published on one node, ~50 % went
    to the other's member), so the routers' ingress is not skewed (kept to show that)."""

    def trio(i: int) -> tuple[int, int, int]:
        return ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]

    if topology == CLUSTER:
        links = [trio(i)[2] for i in range(len(SITE_NAMES))]
        nodes = []
        for i, name in enumerate(SITE_NAMES):
            port, monitor, link = trio(i)
            routes = ", ".join(f'"nats://127.0.0.1:{p}"' for p in links if p != link)
            conf = (
                f"server_name: {name}\n"
                f'cluster {{ name: fairness, listen: "127.0.0.1:{link}", routes: [{routes}] }}\n'
            )
            nodes.append(NatsNode(name, port, monitor, conf, jetstream=True))
        return nodes
    if topology == GATEWAY:
        gateways = ", ".join(
            f'{{ name: site_{name}, url: "nats://127.0.0.1:{trio(i)[2]}" }}'
            for i, name in enumerate(SITE_NAMES)
        )
        nodes = []
        for i, name in enumerate(SITE_NAMES):
            port, monitor, link = trio(i)
            route = trio(len(SITE_NAMES))[i]  # the third trio: the one-node clusters
            conf = (
                f"server_name: {name}\n"
                f'cluster {{ name: site_{name}, listen: "127.0.0.1:{route}", '
                f'routes: ["nats://127.0.0.1:{route}"] }}\n'
                f'gateway {{ name: site_{name}, listen: "127.0.0.1:{link}", '
                f"gateways: [{gateways}] }}\n"
            )
            nodes.append(NatsNode(name, port, monitor, conf, jetstream=True))
        return nodes
    raise ValueError(f"unknown topology {topology!r} (one of {', '.join(TOPOLOGIES)})")


@dataclass(frozen=True, slots=True)
class Decision:
    """A ``RouteDecision`` as the bench's tap saw it, stamped with its clock."""

    at_s: float
    router_id: str
    policy_class: str
    prefill_tokens: int
    queued_ms: float


def decision_counts(
    decisions: Iterable[Decision], start_s: float, end_s: float
) -> dict[str, dict[str, Any]]:
    """Per router, of the decisions seen in [``start_s``, ``end_s``): requests and uncached
    (prefill) tokens per class, and the mean router-queue wait (ms) per class. An empty
    ``policy_class`` is the default class, ``regular``."""
    out: dict[str, dict[str, Any]] = {}
    waits: dict[tuple[str, str], list[float]] = {}
    for d in decisions:
        if not start_s <= d.at_s < end_s:
            continue
        cls = d.policy_class or REGULAR
        mine = out.setdefault(d.router_id, {"requests": {}, "prefill_tokens": {}})
        mine["requests"][cls] = mine["requests"].get(cls, 0) + 1
        mine["prefill_tokens"][cls] = mine["prefill_tokens"].get(cls, 0) + d.prefill_tokens
        waits.setdefault((d.router_id, cls), []).append(d.queued_ms)
    for (router, cls), values in waits.items():
        out[router].setdefault("queued_ms_mean", {})[cls] = round(statistics.fmean(values), 1)
    return dict(sorted(out.items()))


def premium_fraction(counts: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Per router, the fraction of its decisions that were premium (the ingress skew it saw)."""
    out: dict[str, float | None] = {}
    for router, mine in counts.items():
        total = sum(mine["requests"].values())
        out[router] = round(mine["requests"].get(PREMIUM, 0) / total, 3) if total else None
    return out


def kill_figures(
    done: Iterable[Done], start_s: float, kill_s: float, end_s: float, width_s: float = 10.0
) -> dict[str, Any]:
    """A router SIGKILLed at ``kill_s`` inside the window [``start_s``, ``end_s``): the share
    ratio over the ``width_s`` before and after it, the requests that failed (an answer that
    was not a success) from the window's start on, and those still unanswered at the end after
    ``HUNG_S`` or more (hung)."""
    done = list(done)

    def ratio(lo: float, hi: float) -> float | None:
        ok = [d for d in done if lo <= d.end_s < hi and d.ok]
        return share_ratio({c: sum(d.uncached_tokens for d in ok if d.cls == c) for c in CLASSES})

    answered = [d for d in done if d.status != -1 and d.end_s >= start_s]
    failed = [d for d in answered if not d.ok]
    hung = [d for d in done if d.status == -1 and d.end_s - d.start_s >= HUNG_S]
    return {
        "kill_at_s": round(kill_s - start_s, 1),
        "share_ratio_before": ratio(max(start_s, kill_s - width_s), kill_s),
        "share_ratio_after": ratio(kill_s, min(end_s, kill_s + width_s)),
        "failed": len(failed),
        "failed_after_kill": sum(1 for d in failed if d.end_s >= kill_s),
        "hung": len(hung),
        "in_flight_at_end": sum(1 for d in done if d.status == -1),
    }


def _unmade_line(system: str, scenario: Scenario, round_no: int) -> dict[str, Any]:
    """The keys naming a run that gave no figures."""
    return {
        "bench": BENCH,
        "system": system,
        "scenario": scenario.name,
        "routers": scenario.routers,
        "round": round_no,
    }


def skipped_line(system: str, scenario: Scenario, round_no: int, why: str) -> dict[str, Any]:
    """A run not made, and why (it says which other line stands for it)."""
    return {**_unmade_line(system, scenario, round_no), "skipped": why}


def error_line(system: str, scenario: Scenario, round_no: int, error: str) -> dict[str, Any]:
    """A run that failed, and the end of its error."""
    return {**_unmade_line(system, scenario, round_no), "error": error[-1500:]}


def schedule(
    rounds: int, systems: Sequence[str], scenarios: Sequence[str]
) -> list[tuple[int, str, str]]:
    """``(round, scenario, system)`` in run order: every scenario in each round, the systems
    alternating within it, their order reversed in odd rounds."""
    order = []
    for r in range(rounds):
        turn = list(systems) if r % 2 == 0 else list(reversed(systems))
        order += [(r, scenario, system) for scenario in scenarios for system in turn]
    return order


def summarize(lines: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians per (system, scenario) of the share ratio, served tokens/s and the shared
    state's cost; whether each system's ratio moved from one router to two; every error."""
    runs = [
        ln for ln in lines if ln.get("bench") == BENCH and "error" not in ln and "skipped" not in ln
    ]
    out: dict[str, Any] = {"bench": BENCH, "summary": True, "target_ratio": TARGET_RATIO}
    for system in sorted({ln["system"] for ln in runs}):
        per: dict[str, Any] = {}
        for scenario in SCENARIOS:
            mine = [ln for ln in runs if ln["system"] == system and ln["scenario"] == scenario]
            if mine:
                per[scenario] = {
                    key: _median(ln.get(key) for ln in mine)
                    for key in (
                        "share_ratio",
                        "served_tokens_per_s",
                        "router_cpu_us_per_req",
                        "frontend_cpu_us_per_req",
                        "nats_msgs_per_req",
                    )
                } | {"runs": len(mine)}
        if SINGLE in per and SKEWED in per:
            one, two = per[SINGLE]["share_ratio"], per[SKEWED]["share_ratio"]
            per["skewed_over_single_ratio"] = round(two / one, 3) if one and two else None
        if SINGLE in per and SITES in per:
            one, two = per[SINGLE]["share_ratio"], per[SITES]["share_ratio"]
            per["sites_over_single_ratio"] = round(two / one, 3) if one and two else None
        out[system] = per
    out["errors"] = [
        {k: ln.get(k) for k in ("system", "scenario", "round", "error")}
        for ln in lines
        if "error" in ln
    ]
    return out


def _median(values: Iterable[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, int | float)]
    return round(statistics.median(numbers), 3) if numbers else None
