"""The chaos suite (issue 9): one test per scenario, each on its own ``jetserve up`` under
streaming load; each prints one JSON line (``make test-chaos`` shows them) and asserts the
issue's target for its fault."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.stack import nats_server_binary
from tests.chaos.cluster import LocalCluster
from tests.chaos.load import LoadConfig
from tests.chaos.scenarios import SCENARIOS, Scenario, emit, external_line, run_scenario
from tests.chaos.stack import UpStack
from tests.support_containers import ROOT, docker_unavailable_reason

pytestmark = [pytest.mark.chaos, pytest.mark.e2e, pytest.mark.timeout(150)]

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
async def test_scenario_meets_its_target(
    scenario: Scenario, tmp_path: Path, model_dir: Path, request: pytest.FixtureRequest
) -> None:
    if scenario.external:
        _run_external(scenario, request)
        return
    if nats_server_binary() is None:
        pytest.fail("nats-server not found; install the test extras")
    cluster = None
    if scenario.shape.nats_nodes > 1:
        cluster = LocalCluster(tmp_path / "nats", scenario.shape.nats_nodes)
    stack = UpStack(tmp_path, scenario.shape, model_dir, cluster)
    try:
        if cluster is not None:
            cluster.start()
        stack.start()
        outcome = await run_scenario(scenario, stack, LoadConfig(base_url=stack.base_url))
    finally:
        stack.stop()
        if cluster is not None:
            cluster.stop()
    line = emit(outcome.line)
    assert outcome.is_met, (
        f"{scenario.name}: target not met ({scenario.target.text})\n{line}\n"
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
