"""The disaggregation bench: its run order and seeds, a client summary → one line with the keys
issue 24 asks for, the medians, disagg/agg ratios and checks, and the command lines it builds
(``jetserve up`` and the kit's knobs in both modes, the client with the prompt spread)."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from bench.disagg import Settings, client_argv, dynamo_env, jetserve_argv, parse_args, settings_of
from bench.disagg_plots import write_plots
from bench.disagg_report import (
    AGG,
    DISAGG,
    REQUIRED_KEYS,
    Stint,
    checks,
    error_line,
    requests_for,
    run_line,
    schedule,
    seed_for,
    summarize,
    worker_layout,
    worker_phases,
)
from bench.samples import latency_samples, without_samples
from bench.side_by_side import Client, Kit, Running
from bench.side_by_side_report import DYNAMO, JETSERVE, SERVER

SHA = "0f3c"


def client_summary(ttft_p50: float, gap_p99: float, **extra: Any) -> dict[str, Any]:
    """A summary shaped as ``bench/loadgen_spread.py`` prints it."""
    return {
        "num_requests": 128,
        "ok": 128,
        "errors": 0,
        "first_errors": [],
        "wall_s": 30.5,
        "req_per_s": 4.2,
        "out_tok_per_s": 1075.2,
        "out_tokens_mean": 256.0,
        "max_tokens": 256,
        "prompt_tokens_mean": 5987.8,
        "prompt_words": 4000,
        "prompt_words_max": 8000,
        "ttft_ms_p50": ttft_p50,
        "ttft_ms_p99": ttft_p50 * 3,
        "itl_ms_p50": 11.0,
        "itl_ms_p99": 13.0,
        "chunk_gap_ms_p50": 10.5,
        "chunk_gap_ms_p99": gap_p99,
        "chunk_gap_ms_p999": gap_p99 * 1.5,
        "chunk_gap_ms_max": gap_p99 * 2,
        "e2e_ms_p50": 3200.0,
        "e2e_ms_p99": 3600.0,
        "kv_hit_rate": 0.0,
        "machine_busy_pct": 30.0,
        "seed": 1016,
        "prompts_sha256": SHA,
        "client": "raw",
        "cpu_ms_per_req": {"frontend": 20.0, "mocker": 10.0, "loadgen": 9.0, "machine": 40.0},
        "samples": latency_samples([0.3, 0.4], [0.011, 0.012]),
        **extra,
    }


def line(system: str, mode: str, c: int, round_no: int, **figures: Any) -> dict[str, Any]:
    summary = client_summary(
        figures.pop("ttft", 300.0), figures.pop("gap", 15.0), seed=seed_for(round_no, c)
    )
    summary.update(figures)
    phases = {"prefill_worker_id": 1, "decode_worker_id": 2} if mode == DISAGG else None
    stint = Stint(round_no, system, mode, (c,))
    return run_line(stint, c, summary, (0.5, 0.4, 0.3), (0.9, 0.5, 0.3), phases=phases)


def test_rounds_alternate_systems_within_a_mode_and_run_backwards_every_other_round() -> None:
    stints = schedule(2, [JETSERVE, DYNAMO], [AGG, DISAGG], [16, 64])
    order = [(s.round, s.system, s.mode, s.concurrencies) for s in stints]
    assert order == [
        (1, JETSERVE, AGG, (16, 64)),
        (1, DYNAMO, AGG, (16, 64)),
        (1, JETSERVE, DISAGG, (16, 64)),
        (1, DYNAMO, DISAGG, (16, 64)),
        (2, DYNAMO, DISAGG, (64, 16)),
        (2, JETSERVE, DISAGG, (64, 16)),
        (2, DYNAMO, AGG, (64, 16)),
        (2, JETSERVE, AGG, (64, 16)),
    ]
    assert [s.system for s in schedule(1, [JETSERVE], [DISAGG], [16])] == [JETSERVE]


def test_a_seed_per_round_and_concurrency_whatever_the_system_or_mode() -> None:
    seeds = {seed_for(r, c) for r in (1, 2, 3) for c in (16, 64)}
    assert len(seeds) == 6
    assert seed_for(2, 16) == seed_for(2, 16)


def test_requests_per_run_scale_with_concurrency_above_a_floor() -> None:
    assert requests_for(16, 4.0, 128) == 128
    assert requests_for(64, 4.0, 128) == 256
    assert requests_for(64, 1.0, 16) == 64
    assert [worker_layout(m, 4) for m in (AGG, DISAGG)] == ["4 aggregated", "2 prefill + 2 decode"]


def test_the_probe_counts_as_disaggregated_only_when_it_names_another_prefill_worker() -> None:
    dynamo = {
        "nvext": {
            "worker_id": {
                "prefill_worker_id": 161,
                "prefill_dp_rank": 0,
                "decode_worker_id": 138,
                "decode_dp_rank": 0,
            }
        }
    }
    assert worker_phases(dynamo) == dynamo["nvext"]["worker_id"]
    dynamo_agg = {"nvext": {"worker_id": {"prefill_worker_id": 57, "decode_worker_id": 57}}}
    assert worker_phases(dynamo_agg) is None
    assert worker_phases({"nvext": {"worker_id": "mocker-daf1f5b8"}}) is None
    assert worker_phases({"nvext": {"worker_id": {"decode_worker_id": "m-1"}}}) is None
    assert worker_phases({"choices": []}) is None


def test_a_run_line_has_the_issues_keys_the_load_averages_and_the_samples() -> None:
    out = line(JETSERVE, DISAGG, 64, 1)
    assert all(out[k] is not None for k in REQUIRED_KEYS)
    assert (out["system"], out["mode"], out["concurrency"], out["round"]) == (
        JETSERVE,
        DISAGG,
        64,
        1,
    )
    assert out["output_tok_s"] == 1075.2
    assert (out["requests"], out["errors"], out["duration_s"]) == (128, 0, 30.5)
    assert out["loadavg_start"] == [0.5, 0.4, 0.3]
    assert out["loadavg_end"] == [0.9, 0.5, 0.3]
    assert out["cpu_ms_per_req"]["server"] == 30.0  # frontend + mocker
    assert out["phases"] == {"prefill_worker_id": 1, "decode_worker_id": 2}
    assert out["samples"]["requests"] == 2
    printed = json.loads(json.dumps(without_samples(out)))
    assert "samples" not in printed
    assert printed["bench"] == "disagg"


def test_the_summary_takes_medians_over_rounds_and_divides_disagg_by_agg() -> None:
    lines = [
        line(JETSERVE, AGG, 64, 1, gap=180.0),
        line(JETSERVE, AGG, 64, 2, gap=200.0),
        line(JETSERVE, DISAGG, 64, 1, gap=30.0),
        line(JETSERVE, DISAGG, 64, 2, gap=40.0),
        line(DYNAMO, AGG, 64, 1, gap=190.0),
        error_line(Stint(1, DYNAMO, DISAGG, (64,)), None, "dynamo_up.sh exited 1"),
    ]
    out = summarize(lines)
    assert out["failed_runs"] == 1
    assert out["rounds"] == 2
    assert out["medians"]["jetserve/agg"]["64"]["chunk_gap_ms_p99"] == 190.0
    assert out["medians"]["jetserve/agg"]["64"]["runs"] == 2
    assert out["medians"]["jetserve/disagg"]["64"]["chunk_gap_ms_p99"] == 35.0
    assert out["medians"]["jetserve/disagg"]["64"]["loadavg_1m_start"] == [0.5, 0.5]
    assert out["disagg_over_agg"]["jetserve"]["64"]["chunk_gap_ms_p99"] == round(35 / 190, 3)
    assert "dynamo" not in out["disagg_over_agg"]  # no measured disagg run
    assert out["checks"] == []


def test_checks_name_what_makes_runs_not_comparable() -> None:
    bad = line(DYNAMO, DISAGG, 16, 1, errors=2, out_tokens_mean=200.0, kv_hit_rate=0.4)
    bad["phases"] = None
    other_prompts = line(JETSERVE, AGG, 16, 1, prompts_sha256="beef")
    problems = checks([bad, other_prompts, line(DYNAMO, AGG, 16, 1)])
    assert problems == [
        "dynamo disagg c=16 round 1: 2 errors",
        "dynamo disagg c=16 round 1: out_tokens_mean 200.0 != max_tokens",
        "dynamo disagg c=16 round 1: kv_hit_rate 0.4 (prompts are unique)",
        "dynamo disagg c=16 round 1: no prefill worker named by the probe",
        "seed 1016: prompts differ across systems/modes (2 prompts_sha256)",
    ]


def test_jetserve_up_in_both_modes_as_a_user_types_it(tmp_path: Path) -> None:
    settings = Settings(jetserve_args=("--router-conditional-disagg",))
    agg = jetserve_argv(settings, AGG, tmp_path / "model", tmp_path / "run")
    dis = jetserve_argv(settings, DISAGG, tmp_path / "model", tmp_path / "run")

    def flag(argv: list[str], name: str) -> str:
        return argv[argv.index(name) + 1]

    assert "up" in agg
    assert flag(agg, "--workers") == "4"
    assert "--prefill-workers" not in agg
    assert [flag(dis, f) for f in ("--workers", "--prefill-workers", "--decode-workers")] == [
        "0",
        "2",
        "2",
    ]
    for argv in (agg, dis):
        assert flag(argv, "--router-mode") == "kv"
        assert flag(argv, "--mocker-speedup-ratio") == "1"
        assert flag(argv, "--mocker-block-size") == "16"
        assert flag(argv, "--mocker-num-gpu-blocks-override") == "16384"
        assert flag(argv, "--mocker-kv-transfer-bandwidth-gbps") == "25"
        assert flag(argv, "--http-port") == "0"
        assert flag(argv, "--model-name") == "Qwen/Qwen3-0.6B"
        assert argv[-1] == "--router-conditional-disagg"


def test_the_kits_knobs_in_both_modes(tmp_path: Path) -> None:
    kit = Kit(dir=tmp_path, venv=tmp_path / "venv", model_dir=tmp_path / "model")
    agg = dynamo_env(Settings(), AGG, kit, (18001, 14001), tmp_path / "run")
    dis = dynamo_env(Settings(), DISAGG, kit, (18001, 14001), tmp_path / "run")
    assert (agg["NUM_WORKERS"], agg["PREFILL_WORKERS"]) == ("4", "0")
    assert (dis["NUM_WORKERS"], dis["PREFILL_WORKERS"]) == ("2", "2")
    for env in (agg, dis):
        assert (env["ROUTER_MODE"], env["SPEEDUP"], env["BLOCK_SIZE"]) == ("kv", "1", "16")
        assert (env["HTTP_PORT"], env["NATS_PORT"]) == ("18001", "14001")
        assert env["EXTRA_MOCKER_ARGS"] == "--kv-transfer-bandwidth 25"


def test_the_client_is_the_kits_loadgen_through_the_spread(tmp_path: Path) -> None:
    client = Client(python="/kit/bin/python", loadgen=tmp_path / "loadgen.py")
    running = Running(url="http://127.0.0.1:9", pid_dir=tmp_path, pids={SERVER: 42})
    argv = client_argv(Settings(), client, running, 64, 1064, "jetserve-agg/c64#1")
    assert argv[:4] == ["/kit/bin/python", argv[1], str(tmp_path / "loadgen.py"), argv[3]]
    assert argv[1].endswith("bench/loadgen_spread.py")
    pairs = dict(itertools.pairwise(argv))
    assert pairs["--prompt-words-max"] == "8000"
    assert pairs["--prompt-words"] == "4000"
    assert pairs["-c"] == "64"
    assert pairs["-n"] == "256"
    assert pairs["--seed"] == "1064"
    assert pairs["--max-tokens"] == "256"
    assert pairs["--client"] == "raw"
    assert pairs["--cpu-pid"] == "server=42"
    assert "--ignore-eos" in argv


def test_quick_is_one_request_per_client_and_the_lists_parse() -> None:
    args = parse_args(["--quick", "--concurrency", "16", "--systems", "jetserve"])
    assert args.concurrency == [16]
    settings = settings_of(args)
    assert (settings.requests_per_client, settings.min_requests, settings.warmup) == (1.0, 16, 1)
    assert settings_of(parse_args([])).requests_per_client == 4.0
    with pytest.raises(SystemExit):
        parse_args(["--modes", "agg,split"])
    with pytest.raises(SystemExit):
        parse_args(["--prompt-words", "8000,4000"])


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib")
def test_plots_are_drawn_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run-disagg.jsonl"
    lines = [
        line(system, mode, c, r)
        for system in (JETSERVE, DYNAMO)
        for mode in (AGG, DISAGG)
        for c in (16, 64)
        for r in (1, 2)
    ]
    for record in lines:
        record["samples"]["gap_ms"] = [0.01, 9.0, 10.0, 11.0, 150.0]
    lines.append(summarize(lines))
    path.write_text("".join(json.dumps(record) + "\n" for record in lines))
    written = write_plots(path)
    assert sorted(p.name for p in written) == [
        "run-disagg-disagg.png",
        "run-disagg-gaps-c16.png",
        "run-disagg-gaps-c64.png",
        "run-disagg-latency-c16.png",
        "run-disagg-latency-c64.png",
    ]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
