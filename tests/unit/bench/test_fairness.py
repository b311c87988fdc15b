"""The fairness bench's ``sites`` scenario: its NATS nodes' configuration, the routing decisions
counted per router and class, the figures around a killed router, the Dynamo run it does not
make, and the command lines of each site's services."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.fairness import parse_args, settings_of
from bench.fairness_report import (
    CLUSTER,
    GATEWAY,
    HUNG_S,
    PREMIUM,
    REGULAR,
    SCENARIO,
    SITES,
    Decision,
    Done,
    decision_counts,
    kill_figures,
    premium_fraction,
    site_nodes,
    skipped_line,
    summarize,
)
from bench.fairness_settings import DEFAULTS
from bench.fairness_stacks import nats_node_argv, site_service_argv

PORTS = list(range(5001, 5010))


def test_the_gateway_topology_is_two_one_node_clusters_that_know_each_other() -> None:
    a, b = site_nodes(GATEWAY, PORTS)
    assert (a.name, a.port, a.monitor_port) == ("a", 5001, 5002)
    assert (b.name, b.port, b.monitor_port) == ("b", 5004, 5005)
    assert a.jetstream
    assert b.jetstream
    # each its own cluster, whose one route is itself (JetStream needs a configured route)
    assert (
        'cluster { name: site_a, listen: "127.0.0.1:5007", routes: ["nats://127.0.0.1:5007"]'
        in (a.conf)
    )
    assert 'cluster { name: site_b, listen: "127.0.0.1:5008"' in b.conf
    for node, link in ((a, 5003), (b, 5006)):
        assert f"server_name: {node.name}\n" in node.conf
        assert f'gateway {{ name: site_{node.name}, listen: "127.0.0.1:{link}"' in node.conf
        assert '{ name: site_a, url: "nats://127.0.0.1:5003" }' in node.conf
        assert '{ name: site_b, url: "nats://127.0.0.1:5006" }' in node.conf


def test_the_cluster_topology_routes_each_node_to_the_other() -> None:
    a, b = site_nodes(CLUSTER, PORTS)
    assert 'listen: "127.0.0.1:5003", routes: ["nats://127.0.0.1:5006"]' in a.conf
    assert 'listen: "127.0.0.1:5006", routes: ["nats://127.0.0.1:5003"]' in b.conf
    assert "name: fairness" in a.conf
    assert "name: fairness" in b.conf
    assert "gateway" not in a.conf


def test_an_unknown_topology_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown topology 'mesh'"):
        site_nodes("mesh", PORTS)


def test_a_node_runs_its_file_with_jetstream_in_its_own_store(tmp_path: Path) -> None:
    node = site_nodes(GATEWAY, PORTS)[0]
    argv = nats_node_argv("/bin/nats-server", node, tmp_path)
    assert argv == [
        "/bin/nats-server", "-c", str(tmp_path / "nats-a.conf"), "-a", "127.0.0.1", "-p", "5001",
        "-js", "-sd", str(tmp_path / "nats-a-js"), "-m", "5002",
    ]  # fmt: skip
    assert (tmp_path / "nats-a.conf").read_text() == node.conf


def test_decisions_count_per_router_and_class_inside_the_window() -> None:
    decisions = [
        Decision(0.5, "router-a", PREMIUM, 4000, 0.0),  # before the window
        Decision(1.0, "router-a", PREMIUM, 4000, 100.0),
        Decision(2.0, "router-a", PREMIUM, 4000, 300.0),
        Decision(3.0, "router-a", "", 4000, 50.0),  # the default class
        Decision(4.0, "router-b", REGULAR, 3000, 0.0),
        Decision(9.0, "router-b", PREMIUM, 1000, 0.0),  # at the end: outside
    ]
    counts = decision_counts(decisions, 1.0, 9.0)
    assert counts == {
        "router-a": {
            "requests": {PREMIUM: 2, REGULAR: 1},
            "prefill_tokens": {PREMIUM: 8000, REGULAR: 4000},
            "queued_ms_mean": {PREMIUM: 200.0, REGULAR: 50.0},
        },
        "router-b": {
            "requests": {REGULAR: 1},
            "prefill_tokens": {REGULAR: 3000},
            "queued_ms_mean": {REGULAR: 0.0},
        },
    }
    assert premium_fraction(counts) == {"router-a": 0.667, "router-b": 0.0}


def _ok(cls: str, end_s: float, tokens: int = 100) -> Done:
    return Done(cls, 0, 200, end_s, ttft_s=0.1, prompt_tokens=tokens, start_s=end_s - 1)


def test_a_router_kill_reads_the_ratio_either_side_and_counts_failed_and_hung() -> None:
    done = [
        _ok(PREMIUM, 101.0),
        _ok(PREMIUM, 102.0),
        _ok(REGULAR, 103.0),  # before: 200:100
        _ok(PREMIUM, 111.0, 300),
        _ok(REGULAR, 112.0),  # after: 300:100
        _ok(PREMIUM, 125.0),  # past the after-window
        Done(REGULAR, 1, 0, 99.0, error="before the window"),
        Done(REGULAR, 1, 0, 111.5, error="ConnectionError"),
        Done(PREMIUM, 1, -1, 120.5, start_s=120.5 - HUNG_S),  # unanswered for HUNG_S: hung
        Done(PREMIUM, 0, -1, 120.5, start_s=119.0),  # merely in flight
    ]
    figures = kill_figures(done, 100.0, 110.0, 120.0)
    assert figures == {
        "kill_at_s": 10.0,
        "share_ratio_before": 2.0,
        "share_ratio_after": 3.0,
        "failed": 1,
        "failed_after_kill": 1,
        "hung": 1,
        "in_flight_at_end": 2,
    }


def test_dynamo_sites_is_a_skipped_line_the_summary_leaves_out() -> None:
    sites = SCENARIO[SITES]
    assert (sites.gateways, sites.routers) == (2, 2)
    line = skipped_line("dynamo", sites, 0, "read its skewed line")
    assert line["skipped"] == "read its skewed line"
    run = {"bench": "fairness", "system": "jetserve", "scenario": SITES, "share_ratio": 3.8}
    single = run | {"scenario": "single", "share_ratio": 4.0}
    summary = summarize([line, run, single])
    assert "dynamo" not in summary
    assert summary["jetserve"][SITES]["share_ratio"] == 3.8
    assert summary["jetserve"]["sites_over_single_ratio"] == 0.95
    assert summary["errors"] == []


def test_each_site_service_gets_the_flags_jetserve_up_gives_it() -> None:
    ports = {"http": 8001, "grpc": 8002, "metrics": 8003}
    model = Path("/models/qwen3")
    router = site_service_argv(DEFAULTS, "router", "b", model, ports)
    assert router[1:] == [
        "-m", "services.router", "--router-mode", "kv", "--router-id", "router-b",
        "--active-prefill-tokens-threshold", "8192", "--metrics-port", "8003",
    ]  # fmt: skip
    gateway = site_service_argv(DEFAULTS, "gateway", "a", model, ports)
    assert gateway[3:] == ["--http-host", "127.0.0.1", "--http-port", "8001", "--grpc-port", "8002"]
    mocker = site_service_argv(DEFAULTS, "mocker", "a", model, ports)
    assert mocker[3:] == [
        "--model-path", "/models/qwen3", "--model-name", DEFAULTS.model_name,
        "--speedup-ratio", "1", "--block-size", "16",
    ]  # fmt: skip
    assert site_service_argv(DEFAULTS, "formatter", "a", model, ports)[1:] == [
        "-m",
        "services.formatter",
    ]


def test_the_sites_flags_reach_the_settings() -> None:
    args = parse_args(["--scenarios", "sites", "--kill-router-at-s", "10", "--quick"])
    settings = settings_of(args)
    assert (settings.sites_topology, settings.kill_router_at_s) == (GATEWAY, 10.0)
    assert settings.duration_s == 20.0
    with pytest.raises(SystemExit):
        parse_args(["--sites-topology", "mesh"])
