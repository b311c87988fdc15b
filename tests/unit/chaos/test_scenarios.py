"""The chaos scenario table, and the line made of an external scenario test's own output."""

from __future__ import annotations

import json

from tests.chaos.scenarios import SCENARIOS, Scenario, external_line

CLUSTER = next(s for s in SCENARIOS if s.external)


def their_output(**fields: object) -> str:
    line = {"test": CLUSTER.name, "sent": 40, "completed": 40, "failed": {}, "recover_s": 0.4}
    return "collected 1 item\n" + json.dumps({**line, **fields}) + "\n1 passed\n"


def test_every_scenario_but_an_external_one_has_a_fault() -> None:
    assert all((s.fault is None) == bool(s.external) for s in SCENARIOS)


def test_an_external_line_keeps_the_numbers_and_names_the_scenario() -> None:
    line = external_line(CLUSTER, their_output(), 0)
    assert line is not None
    assert (line["scenario"], line["sent"], line["completed"], line["met"]) == (
        CLUSTER.name,
        40,
        40,
        True,
    )


def test_an_external_failure_is_not_met() -> None:
    line = external_line(CLUSTER, their_output(failed={"503 service_unavailable": 2}), 1)
    assert line is not None
    assert line["met"] is False


def test_the_external_tests_exit_code_is_kept_apart_from_the_target() -> None:
    line = external_line(CLUSTER, their_output(), 1)
    assert line is not None
    assert (line["met"], line["external_exit_code"]) == (True, 1)


def test_no_line_from_an_external_test_that_printed_none() -> None:
    other = Scenario("other", None, CLUSTER.target, external="x.py")
    assert external_line(other, their_output(), 0) is None


def test_one_line_per_victim_adds_up() -> None:
    output = their_output(victim="most-clients") + their_output(
        victim="meta-leader", failed={"sse worker_lost": 1}, recover_s=1.5
    )
    line = external_line(CLUSTER, output, 0)
    assert line is not None
    assert (line["sent"], line["failed"], line["recover_s"], line["met"]) == (
        80,
        {"sse worker_lost": 1},
        1.5,
        False,
    )
    assert "most-clients, meta-leader" in line["note"]
