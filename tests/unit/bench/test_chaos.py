"""``bench.chaos``'s table: each scenario's runs added up against its recovery bound."""

from __future__ import annotations

from bench.chaos import LOCAL, per_scenario, table


def test_runs_add_up_per_scenario_with_the_figure_its_bound_applies_to() -> None:
    lines = [
        {"scenario": "sigkill-preprocessor", "recover_s": 1.5, "correct": True, "met": True},
        {"scenario": "sigkill-nats-server", "serving_again_s": 0.2, "correct": True, "met": True},
        {"scenario": "sigkill-preprocessor", "recover_s": 3.25, "correct": True, "met": False},
        {"scenario": "sigkill-preprocessor", "error": "jetserve up not up after 60s"},
    ]
    rows = per_scenario(lines)
    assert rows == [
        {
            "scenario": "sigkill-preprocessor",
            "runs": 3,
            "correct": 2,
            "met": 1,
            "figure": "recover_s",
            "p50_s": 2.375,
            "max_s": 3.25,
            "bound_s": 3.0,
        },
        {
            "scenario": "sigkill-nats-server",
            "runs": 1,
            "correct": 1,
            "met": 1,
            "figure": "serving_again_s",
            "p50_s": 0.2,
            "max_s": 0.2,
            "bound_s": 5.0,
        },
    ]
    first = table(rows).splitlines()[1].split()
    assert first == ["sigkill-preprocessor", "3", "2", "1", "recover_s", "2.38", "3.25", "<", "3"]


def test_it_runs_every_scenario_that_needs_no_docker() -> None:
    assert LOCAL
    assert all(not s.external and s.fault is not None for s in LOCAL)
