"""The chaos scenarios: a stack shape, one fault, the issue's target for it; and the run of one
scenario (start, warm up, fault, keep the load on, stop, summarize, one JSON line). The tests
(``test_chaos.py``) assert each target's correctness rules; ``bench.chaos`` reports its times.

Faults are sent only to pids the launcher wrote in its run dir and only while they are its
children (``stack.UpStack.send``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.cluster import LocalCluster
from tests.chaos.load import LoadConfig, run_load
from tests.chaos.report import Counted, Goal, Summary, Target, broken_rules, missed_times, summarize
from tests.chaos.stack import CounterWatch, Deadlines, Shape, UpStack

WARMUP_S = 3.0
AFTER_FAULT_S = 10.0
"""How long the load goes on once the fault's action is done (a pause: after SIGCONT)."""
NATS_PAUSE_S = 8.0
BACK_TIMEOUT_S = 15.0
"""Longest wait for the launcher to start a killed process again."""
MIGRATIONS_METRIC = "migrations_total"
GATEWAY_CONNECTION = "gateway-"
"""How the gateway names its NATS connection (``gateway-<id>``)."""
CLUSTER = Shape(workers=2, routers=2, nats_nodes=3)
"""The compose cluster test's shape, on a local 3-node cluster."""

ZERO_FAILED = Target(Goal.ZERO_FAILED, "0 failed requests")
INSIDE_ONLY = Target(
    Goal.AWAITING_FIRST_TOKEN_ONLY,
    "failures only for requests inside the process when it was killed (in flight, no token "
    "yet); recovery < 3 s",
    recover_within_s=3.0,
)
STREAMS_ONLY = Target(
    Goal.IN_FLIGHT_ONLY,
    "failures only for requests inside the process when it was killed (every stream in "
    "flight); recovery < 3 s",
    recover_within_s=3.0,
)
TYPED = Target(
    Goal.TYPED_WITHIN_DEADLINE,
    "every request completes or fails with a typed error within its deadline; "
    "serving again < 5 s after NATS is back",
    recover_within_s=5.0,
)


@dataclass(frozen=True, slots=True)
class FaultResult:
    """When the fault hit, and when the faulted process was back (where that is known)."""

    at_s: float
    back_at_s: float | None = None
    note: str = ""


Fault = Callable[[UpStack], Awaitable[FaultResult]]


def sigkill(name: str) -> Fault:
    """SIGKILL child ``name``: no chance to drain or deregister."""

    async def fault(stack: UpStack) -> FaultResult:
        at = time.monotonic()
        stack.send(name, signal.SIGKILL)
        return FaultResult(at)

    return fault


def sigterm(name: str) -> Fault:
    """SIGTERM child ``name``: it drains (finishes what it holds) and exits."""

    async def fault(stack: UpStack) -> FaultResult:
        at = time.monotonic()
        stack.send(name, signal.SIGTERM)
        return FaultResult(at)

    return fault


async def kill_nats(stack: UpStack) -> FaultResult:
    """SIGKILL nats-server; the launcher starts it again on the same port and store."""
    at = time.monotonic()
    old = stack.send("nats", signal.SIGKILL)
    if not await asyncio.to_thread(stack.wait_nats_back, old, BACK_TIMEOUT_S):
        return FaultResult(at, note=f"nats-server not back after {BACK_TIMEOUT_S:.0f}s")
    return FaultResult(at, back_at_s=time.monotonic())


async def pause_nats(stack: UpStack) -> FaultResult:
    """SIGSTOP nats-server for ``NATS_PAUSE_S``, then SIGCONT (back at SIGCONT)."""
    at = time.monotonic()
    stack.send("nats", signal.SIGSTOP)
    try:
        await asyncio.sleep(NATS_PAUSE_S)
    finally:
        stack.send("nats", signal.SIGCONT)
    return FaultResult(at, back_at_s=time.monotonic())


def stop_cluster_node(which: str) -> Fault:
    """SIGTERM one node of the stack's local NATS cluster: the gateway's (``which="gateway"``)
    or the busiest other one. Its clients move to the other two nodes."""

    async def fault(stack: UpStack) -> FaultResult:
        cluster = stack.cluster
        assert cluster is not None, "a cluster scenario needs Shape(nats_nodes=3)"
        gateway = GATEWAY_CONNECTION
        find = cluster.node_with if which == "gateway" else cluster.node_without
        node = await asyncio.to_thread(find, gateway)
        at = time.monotonic()
        await asyncio.to_thread(cluster.stop_node, node)
        return FaultResult(at, note=f"stopped node {node.name} ({which})")

    return fault


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fault: Fault | None
    target: Target
    shape: Shape = field(default_factory=Shape)
    counted: Counted = Counted.ALL
    note: str = ""
    external: str = ""
    """A test file that runs this scenario itself (where it needs more than ``jetserve up``);
    its JSON line ``{"test": <name>, ...}`` is turned into this suite's."""


DISAGG = Shape(workers=0, prefill_workers=2, decode_workers=2)
"""Disaggregated serving (issue 24)."""

SINGLE_KILL_NOTE = (
    "the issue sets no formatter target: the single-process rule, and a formatter holds every "
    "stream in flight"
)
GATEWAY_NOTE = (
    "counts only requests started before the SIGTERM: a stopped gateway refuses new connections"
)
DRAIN_NOTE = "a rolling restart: one of the replicas is SIGTERMed and drains"

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("sigkill-mocker-1-of-3", sigkill("mocker-1"), ZERO_FAILED),
    Scenario("sigkill-router-1-of-2", sigkill("router-1"), ZERO_FAILED, Shape(routers=2)),
    Scenario("sigkill-single-router", sigkill("router"), INSIDE_ONLY),
    Scenario("sigkill-preprocessor", sigkill("preprocessor"), INSIDE_ONLY),
    Scenario("sigkill-formatter", sigkill("formatter"), STREAMS_ONLY, note=SINGLE_KILL_NOTE),
    Scenario(
        "sigterm-gateway",
        sigterm("gateway"),
        ZERO_FAILED,
        counted=Counted.STARTED_BEFORE_FAULT,
        note=GATEWAY_NOTE,
    ),
    Scenario(
        "sigterm-preprocessor-1-of-2",
        sigterm("preprocessor-0"),
        ZERO_FAILED,
        Shape(preprocessors=2),
        note=DRAIN_NOTE,
    ),
    Scenario(
        "sigterm-router-1-of-2", sigterm("router-0"), ZERO_FAILED, Shape(routers=2), note=DRAIN_NOTE
    ),
    Scenario(
        "sigterm-formatter-1-of-2",
        sigterm("formatter-0"),
        ZERO_FAILED,
        Shape(formatters=2),
        note=DRAIN_NOTE,
    ),
    Scenario("sigterm-mocker-1-of-3", sigterm("mocker-0"), ZERO_FAILED, note=DRAIN_NOTE),
    Scenario(
        "sigkill-prefill-1-of-2",
        sigkill("mocker-prefill-1"),
        ZERO_FAILED,
        DISAGG,
        note="2 prefill + 2 decode workers: the prefill is done again on the other prefill worker",
    ),
    Scenario(
        "sigkill-decode-1-of-2",
        sigkill("mocker-decode-1"),
        ZERO_FAILED,
        DISAGG,
        note="2 prefill + 2 decode workers: streams on the killed decode worker migrate",
    ),
    Scenario("sigkill-nats-server", kill_nats, TYPED),
    Scenario("sigstop-nats-server-8s", pause_nats, TYPED),
    Scenario(
        "nats-cluster-gateway-node-stopped", stop_cluster_node("gateway"), ZERO_FAILED, CLUSTER
    ),
    Scenario("nats-cluster-other-node-stopped", stop_cluster_node("other"), ZERO_FAILED, CLUSTER),
    Scenario(
        "nats-cluster-node-loss",
        None,
        ZERO_FAILED,
        note="one node of the 3-node NATS cluster stopped under docker compose",
        external="tests/compose/test_cluster.py",
    ),
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One scenario's result: the JSON line's fields, what the run broke of the target's rules
    (a test fails on any) and which of its times it missed (a benchmark figure)."""

    line: dict[str, Any]
    broken: tuple[str, ...] = ()
    missed: tuple[str, ...] = ()


async def run_on_fresh_stack(
    scenario: Scenario, workdir: Path, model_dir: Path, deadlines: Deadlines
) -> tuple[Outcome, UpStack]:
    """Start ``jetserve up`` in the scenario's shape under ``workdir`` (on a local NATS cluster
    of its own where the shape says so), run the scenario, stop everything; the outcome and the
    stopped stack (its launcher output and logs stay under ``workdir``)."""
    cluster = None
    if scenario.shape.nats_nodes > 1:
        cluster = LocalCluster(workdir / "nats", scenario.shape.nats_nodes)
    stack = UpStack(workdir, scenario.shape, model_dir, cluster, deadlines)
    try:
        if cluster is not None:
            cluster.start()
        stack.start()
        load = LoadConfig(base_url=stack.base_url, timeout_s=deadlines.client_timeout_s)
        outcome = await run_scenario(scenario, stack, load)
    finally:
        stack.stop()
        if cluster is not None:
            cluster.stop()
    return outcome, stack


async def run_scenario(scenario: Scenario, stack: UpStack, load: LoadConfig) -> Outcome:
    """Warm up, apply the fault, keep the load on, stop; summarize (the stack is running)."""
    assert scenario.fault is not None, f"{scenario.name} runs in {scenario.external}"
    stop = asyncio.Event()
    watch = CounterWatch(stack.metrics_urls(), MIGRATIONS_METRIC)
    load_task = asyncio.create_task(run_load(load, stop))
    watch_task = asyncio.create_task(watch.run(stop))
    try:
        await asyncio.sleep(WARMUP_S)
        fault = await scenario.fault(stack)
        await asyncio.sleep(AFTER_FAULT_S)
    finally:
        stop.set()
        records = await asyncio.wait_for(load_task, load.timeout_s + 10)
        await asyncio.wait_for(watch_task, 10)
    summary = summarize(
        records,
        fault.at_s,
        deadline_s=load.timeout_s,
        back_at=fault.back_at_s,
        counted=scenario.counted,
    )
    broken = tuple(broken_rules(scenario.target, summary))
    missed = tuple(missed_times(scenario.target, summary))
    line = _line(scenario, summary, fault, watch.total(), stack)
    line.update(correct=not broken, met=not broken and not missed)
    if broken or missed:
        line["not_met"] = [*broken, *missed]
    return Outcome(line, broken, missed)


def _line(
    scenario: Scenario, summary: Summary, fault: FaultResult, migrated: int | None, stack: UpStack
) -> dict[str, Any]:
    line: dict[str, Any] = {
        "scenario": scenario.name,
        "sent": summary.sent,
        "completed": summary.completed,
        "migrated": migrated,
        "failed": summary.failed,
        "max_latency_s": summary.max_latency_s,
        "recover_s": summary.recover_s,
        "steady_s": summary.steady_s,
        "failed_in_flight": summary.failed_in_flight,
        "failed_awaiting_first_token": summary.failed_awaiting_first_token,
        "failed_untyped": summary.failed_untyped,
        "over_deadline": summary.over_deadline,
        "counted": str(summary.counted),
        "shape": scenario.shape.describe(),
        "restarts": stack.restarts(),
        "up_s": stack.up_s,
        "request_timeout_s": stack.deadlines.request_timeout_s,
        "retry_budget_s": stack.deadlines.retry_budget_s,
        "target": scenario.target.text,
    }
    if fault.back_at_s is not None:
        line["back_s"] = round(fault.back_at_s - fault.at_s, 3)
        line["serving_again_s"] = summary.serving_again_s
    if scenario.note or fault.note:
        line["note"] = "; ".join(n for n in (scenario.note, fault.note) if n)
    return line


def external_line(scenario: Scenario, output: str, exit_code: int) -> dict[str, Any] | None:
    """This suite's JSON line for ``scenario`` from its external test's output: every line
    ``{"test": <name>, ...}`` it printed (one per victim) added up; ``None`` if it printed none.
    Met = nothing failed and every run was served after its fault (the external test's own
    further checks show in ``external_exit_code``)."""
    runs: list[dict[str, Any]] = []
    for text in output.splitlines():
        with contextlib.suppress(ValueError):
            found = json.loads(text) if text.startswith("{") else None
            if isinstance(found, dict) and found.get("test") == scenario.name:
                runs.append(found)
    if not runs:
        return None
    failed: Counter[str] = Counter()
    for run in runs:
        failed.update(run.get("failed") or {})
    victims = ", ".join(str(run.get("victim", "one node")) for run in runs)
    return {
        "scenario": scenario.name,
        "sent": sum(int(run.get("sent") or 0) for run in runs),
        "completed": sum(int(run.get("completed") or 0) for run in runs),
        "migrated": None,
        "failed": dict(sorted(failed.items())),
        **{key: _worst(runs, key) for key in ("max_latency_s", "recover_s", "steady_s")},
        "failed_in_flight": sum(int(run.get("failed_in_flight") or 0) for run in runs),
        "target": scenario.target.text,
        "met": not failed and all(run.get("recover_s") is not None for run in runs),
        "external_exit_code": exit_code,
        "note": f"{scenario.note} ({victims}); run by {scenario.external}",
    }


def _worst(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [float(run[key]) for run in runs if run.get(key) is not None]
    return max(values) if len(values) == len(runs) else None


def emit(line: dict[str, Any]) -> str:
    """Print ``line`` as one JSON line, and append it to ``$JETSERVE_CHAOS_OUT`` when set."""
    text = json.dumps(line, separators=(",", ":"))
    print(text, flush=True)
    if out := os.environ.get("JETSERVE_CHAOS_OUT"):
        with contextlib.suppress(OSError), Path(out).open("a") as f:
            f.write(text + "\n")
    return text
