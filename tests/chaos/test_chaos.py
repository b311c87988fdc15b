"""The chaos suite (issue 9): one test per scenario, each on its own ``jetserve up`` under
streaming load; each prints one JSON line (``make test-chaos`` shows them) and asserts the
correctness rules of the issue's target for its fault: which requests may fail, every failure
typed, served again after it. No wall-clock bound, and the stack runs with patient gateway
deadlines (a hop may take 25 s to restart), so a slow machine fails none of them; ``make
bench-chaos`` reports the recovery times against the issue's bounds (``bench/chaos.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.stack import nats_server_binary
from tests.chaos.scenarios import SCENARIOS, Scenario, emit, external_line, run_on_fresh_stack
from tests.chaos.stack import PATIENT_DEADLINES
from tests.support_containers import ROOT, docker_unavailable_reason

SCENARIO_TIMEOUT_S = 300
"""A scenario takes ~20 s on an idle 2-core machine; this bound is for a hung one only."""

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(SCENARIO_TIMEOUT_S)]

EXTERNAL_TIMEOUT_S = 460
"""The compose cluster test builds and starts a compose project: minutes, not seconds."""


def _params() -> list[object]:
    return [
        pytest.param(s, id=s.name, marks=[pytest.mark.timeout(EXTERNAL_TIMEOUT_S + 20)])
        if s.external
        else pytest.param(s, id=s.name)
        for s in SCENARIOS
    ]


@pytest.mark.parametrize("scenario", _params())
async def test_scenario_keeps_its_correctness_rules(
    scenario: Scenario, tmp_path: Path, model_dir: Path, request: pytest.FixtureRequest
) -> None:
    if scenario.external:
        _run_external(scenario, request)
        return
    if nats_server_binary() is None:
        pytest.fail("nats-server not found; install the test extras")
    outcome, stack = await run_on_fresh_stack(scenario, tmp_path, model_dir, PATIENT_DEADLINES)
    line = emit(outcome.line)
    assert not outcome.broken, (
        f"{scenario.name}: {'; '.join(outcome.broken)} ({scenario.target.text})\n{line}\n"
        f"launcher:\n{stack.stderr()}\n{stack.log_tails()}"
    )


def _run_external(scenario: Scenario, request: pytest.FixtureRequest) -> None:
    """Run the scenario's own test file in a child pytest; print and check its line."""
    if "chaos" not in str(request.config.getoption("markexpr") or ""):
        pytest.skip(f"{scenario.external} runs under make test-chaos only")
    if reason := docker_unavailable_reason():
        pytest.skip(f"needs the compose cluster, see {scenario.external}: {reason}")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", scenario.external, "-s", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXTERNAL_TIMEOUT_S,
    )
    line = external_line(scenario, done.stdout, done.returncode)
    assert line is not None, f"{scenario.external} printed no JSON line\n{done.stdout[-3000:]}"
    text = emit(line)
    assert line["met"], f"{scenario.name}: target not met\n{text}\n{done.stdout[-3000:]}"
    assert done.returncode == 0, f"{scenario.external} failed\n{done.stdout[-3000:]}"


def test_every_scenario_has_a_unique_name() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(set(names)) == len(names), json.dumps(names)
