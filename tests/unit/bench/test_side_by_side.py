"""The side-by-side c=1 bench: its pure report (parse, CPU split, medians, checks) and the
command lines it builds (the kit's workload (a), ``jetserve up`` as a user types it)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench.side_by_side import (
    LOADGEN_SAMPLES,
    WORKLOAD_A,
    Client,
    Kit,
    Running,
    choose_client,
    client_argv,
    emit,
    jetserve_argv,
)
from bench.side_by_side_report import (
    DYNAMO,
    JETSERVE,
    checks,
    parse_summary,
    run_line,
    schedule,
    split_cpu,
    summarize,
)

SHA = "f6b339d5"


def loadgen_summary(
    ttft_p50: float, cpu: Mapping[str, float | None], **extra: Any
) -> dict[str, Any]:
    return {
        "ok": 200,
        "errors": 0,
        "ttft_ms_p50": ttft_p50,
        "ttft_ms_p99": ttft_p50 * 2,
        "itl_ms_p50": 0.03,
        "e2e_ms_p50": ttft_p50 + 1,
        "req_per_s": 1000 / (ttft_p50 + 1),
        "cpu_ms_per_req": cpu,
        "machine_busy_pct": 75.0,
        "prompt_tokens_mean": 45.5,
        "out_tokens_mean": 32.0,
        "prompts_sha256": SHA,
        "client": "raw",
        **extra,
    }


def test_schedule_alternates_systems_within_each_round() -> None:
    assert schedule(2, [DYNAMO, JETSERVE]) == [
        (1, DYNAMO),
        (1, JETSERVE),
        (2, DYNAMO),
        (2, JETSERVE),
    ]
    assert schedule(0, [JETSERVE]) == []


def test_parse_summary_takes_the_last_json_line() -> None:
    out = 'warming up\n{"a": 1}\nnoise\n{"ttft_ms_p50": 2.0}\n\n'
    assert parse_summary(out) == {"ttft_ms_p50": 2.0}


def test_parse_summary_without_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no JSON summary"):
        parse_summary("Traceback ...\nConnectionRefusedError\n")


def test_split_cpu_sums_dynamo_processes_into_server() -> None:
    cpu = split_cpu({"frontend": 1.5, "mocker": 2.0, "nats": 0.5, "loadgen": 0.7, "machine": 5.0})
    assert cpu["server"] == 4.0
    assert cpu["unattributed"] == 0.3
    assert "launcher" not in cpu


def test_split_cpu_charges_the_jetserve_tree_beyond_its_services_to_the_launcher() -> None:
    cpu = split_cpu(
        {"gateway": 1.0, "nats": 1.0, "mocker-0": 0.5, "server": 2.75, "loadgen": 0.6, "machine": 4}
    )
    assert cpu["server"] == 2.75
    assert cpu["launcher"] == 0.25
    assert cpu["unattributed"] == 0.65


def test_split_cpu_drops_unmeasured_and_client_total() -> None:
    cpu = split_cpu({"gateway": None, "nats": 1.0, "loadgen": 0.5, "total": 1.5})
    assert cpu == {"nats": 1.0, "loadgen": 0.5, "server": 1.0}


def test_split_cpu_launcher_is_never_negative() -> None:
    assert split_cpu({"gateway": 1.0, "server": 0.95})["launcher"] == 0.0


def test_run_line_carries_latency_cpu_and_load() -> None:
    line = run_line(DYNAMO, 2, loadgen_summary(2.0, {"frontend": 1.0, "machine": 3.0}), 0.4567)
    assert line["system"] == DYNAMO
    assert line["round"] == 2
    assert (line["ttft_ms_p50"], line["ttft_ms_p99"], line["itl_ms_p50"]) == (2.0, 4.0, 0.03)
    assert line["cpu_ms_per_req"] == {
        "frontend": 1.0,
        "machine": 3.0,
        "server": 1.0,
        "unattributed": 2.0,
    }
    assert line["loadavg_1m_start"] == 0.46
    json.dumps(line)


def test_run_line_from_bench_serving_output() -> None:
    summary = {"ttft_ms_p50": 3.0, "cpu_ms_per_req": {"gateway": 1.0, "loadgen": 1, "total": 2}}
    line = run_line(JETSERVE, 1, summary, 0.0)
    assert line["client"] == "bench.serving"
    assert line["cpu_ms_per_req"] == {"gateway": 1.0, "loadgen": 1.0, "server": 1.0}
    assert line["ttft_ms_p99"] is None


def rounds(dyn: list[float], jet: list[float]) -> list[dict[str, Any]]:
    lines = []
    for i, (d, j) in enumerate(zip(dyn, jet, strict=True), start=1):
        dyn_cpu = {"frontend": d, "mocker": 1.0, "machine": d + 2}
        lines.append(run_line(DYNAMO, i, loadgen_summary(d, dyn_cpu), 0.1 * i))
        jet_cpu = {"gateway": j, "server": j + 0.5, "machine": j + 0.7}
        lines.append(run_line(JETSERVE, i, loadgen_summary(j, jet_cpu), 0.2 * i))
    return lines


def test_summarize_takes_medians_per_system_and_the_ttft_ratio() -> None:
    summary = summarize(rounds([2.0, 2.4, 1.9], [5.0, 4.0, 6.0]), max_tokens=32)
    dyn, jet = summary["medians"][DYNAMO], summary["medians"][JETSERVE]
    assert summary["rounds"] == 3
    assert (dyn["runs"], jet["runs"]) == (3, 3)
    assert dyn["ttft_ms_p50"] == 2.0
    assert jet["ttft_ms_p50"] == 5.0
    assert jet["ttft_ms_p99"] == 10.0
    assert dyn["cpu_ms_per_req"] == {
        "frontend": 2.0,
        "machine": 4.0,
        "mocker": 1.0,
        "server": 3.0,
        "unattributed": 1.0,
    }
    assert jet["cpu_ms_per_req"]["launcher"] == 0.5
    assert dyn["loadavg_1m_start"] == 0.2
    assert summary["ttft_p50_ratio_jetserve_over_dynamo"] == 2.5
    assert summary["checks"] == []
    assert summary["failed_runs"] == 0


def test_summarize_skips_failed_runs_and_has_no_ratio_for_one_system() -> None:
    lines = [
        {"system": DYNAMO, "round": 1, "error": "dynamo_up.sh failed"},
        run_line(JETSERVE, 1, loadgen_summary(4.0, {"gateway": 1.0}), 0.0),
    ]
    summary = summarize(lines, max_tokens=32)
    assert summary["failed_runs"] == 1
    assert summary["medians"][DYNAMO]["runs"] == 0
    assert summary["medians"][DYNAMO]["ttft_ms_p50"] is None
    assert summary["ttft_p50_ratio_jetserve_over_dynamo"] is None


def test_checks_flag_errors_short_outputs_different_prompts_and_disturbed_runs() -> None:
    lines = [
        run_line(DYNAMO, 1, loadgen_summary(2.0, {}, errors=3), 0.0),
        run_line(DYNAMO, 2, loadgen_summary(2.0, {"frontend": 2.0, "machine": 4.5}), 0.0),
        run_line(DYNAMO, 3, loadgen_summary(2.0, {"frontend": 2.0, "machine": 2.9}), 0.0),
        run_line(
            JETSERVE, 1, loadgen_summary(2.0, {}, out_tokens_mean=12.0, prompts_sha256="x"), 0
        ),
    ]
    problems = checks(lines, max_tokens=32)
    assert problems == [
        "dynamo round 1: 3 errors",
        "dynamo round 2: disturbed, 2.5 CPU ms/request not from server or client",
        "jetserve round 1: out_tokens_mean 12.0 != 32",
        "prompts differ across runs: 2 prompts_sha256 values",
    ]


def test_jetserve_is_started_as_a_user_types_it() -> None:
    argv = jetserve_argv(Path("/m"), "Qwen/Qwen3-0.6B", Path("/run"))
    up = argv.index("up")
    assert argv[up - 1].endswith("jetserve") or argv[up - 1] == "services.cli"
    flags = dict(zip(argv[up + 1 :: 2], argv[up + 2 :: 2], strict=True))
    assert flags["--mocker-speedup-ratio"] == "0"
    assert flags["--workers"] == "2"
    assert flags["--router-mode"] == "round-robin"
    assert flags["--model-path"] == "/m"
    assert flags["--model-name"] == "Qwen/Qwen3-0.6B"
    assert flags["--run-dir"] == "/run"


def test_client_is_the_kits_loadgen_with_workload_a(tmp_path: Path) -> None:
    running = Running(url="http://127.0.0.1:9", pid_dir=tmp_path, pids={"server": 42})
    argv = client_argv(running, Client("py", Path("/kit/loadgen.py")), "M", "jetserve-rr/a#1")
    assert argv[:3] == ["py", str(LOADGEN_SAMPLES), "/kit/loadgen.py"]  # it adds samples
    joined = " ".join(argv)
    assert " ".join(WORKLOAD_A) == "-c 1 -n 200 --max-tokens 32 --prompt-words 32"
    assert " ".join(WORKLOAD_A) in joined
    assert "--client raw --endpoint chat" in joined
    assert f"--cpu-pid-dir {tmp_path}" in joined
    assert "--cpu-pid server=42" in joined


def test_client_without_loadgen_is_bench_serving(tmp_path: Path) -> None:
    (tmp_path / "gateway.pid").write_text("7\n")
    running = Running(url="http://127.0.0.1:9", pid_dir=tmp_path, pids={"server": 42})
    argv = client_argv(running, Client("py", None), "M", "x")
    assert argv[:3] == ["py", "-m", "bench.serving"]
    assert argv[argv.index("--pids") + 1 :] == ["gateway=7", "server=42"]
    assert argv[argv.index("--dynamo") + 1] == "off"


def test_choose_client(tmp_path: Path) -> None:
    kit = Kit(dir=tmp_path, venv=tmp_path / "venv", model_dir=tmp_path / "model")
    assert choose_client(kit, installed=False).loadgen is None
    (tmp_path / "loadgen.py").write_text("")
    assert choose_client(kit, installed=False).loadgen == tmp_path / "loadgen.py"
    installed = choose_client(kit, installed=True)
    assert installed.python == str(tmp_path / "venv" / "bin" / "python")
    assert len(kit.missing()) == 6


def test_emit_prints_without_samples_and_writes_them_to_the_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = {"system": "jetserve", "ttft_ms_p50": 3.0, "samples": {"ttft_ms": [1.0, 2.0]}}
    out = io.StringIO()
    emit(line, out)
    assert json.loads(capsys.readouterr().out) == {"system": "jetserve", "ttft_ms_p50": 3.0}
    assert json.loads(out.getvalue()) == line
