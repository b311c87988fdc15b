"""``jetserve up``: one command starts everything, SIGTERM stops everything it started and
removes its temp run dir; every option of README's table, typed on the command line as a user
types it, takes effect."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import nats
import nats.errors
import openai
import pytest

from services.cli.secure import TAP_USER
from services.cli.stack import free_ports
from services.media.config import DEFAULT_IMAGE_MODEL, DEFAULT_VIDEO_MODEL
from shared.bus_permissions import inbox_prefix
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from shared.messages import WorkerCard
from tests.e2e.conftest import MODEL, TENSOR_MODEL
from tests.support import eventually, eventually_awaited, nats_server, registered_cards
from tests.unit.test_media_png import decode

API_KEY = "sesame"
"""``--gateway-api-key`` of the stack that tries every option."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone: it has exited
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def _up(*args: str) -> list[str]:
    """The command line as a user types it: the venv's ``jetserve`` script."""
    script = Path(sys.executable).parent / "jetserve"
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "services.cli"]
    return [*launcher, "up", *args]


def _start_up(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """``jetserve up`` on free ports with an undelayed mocker, output piped (``args`` come last:
    a flag given again there wins)."""
    return subprocess.Popen(
        _up("--http-port", "0", "--grpc-port", "0", "--mocker-speedup-ratio", "0", *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _up_line(proc: subprocess.Popen[str]) -> str:
    """The launcher's first line, checked to say it is up."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    line = proc.stdout.readline()
    assert line.startswith("JetServe is up: http://127.0.0.1:"), line or proc.stderr.read()
    return line


def test_up_refuses_a_taken_http_port(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            _up("--http-port", str(port), "--run-dir", str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode != 0
    assert f"HTTP port {port} is already in use" in result.stderr
    assert f"logs kept in {tmp_path}" in result.stderr


def test_up_rejects_a_bad_pass_through_value_naming_the_flag() -> None:
    result = subprocess.run(
        _up("--router-kv-overlap-score-weight", "-1"), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--router-kv-overlap-score-weight" in result.stderr


def test_up_serves_and_sigterm_stops_every_process_and_removes_its_run_dir(
    tmp_path: Path, model_dir: Path
) -> None:
    # the temp run dir goes under tmp_path, so the test can see it is removed
    env = {"JETSERVE_NAMESPACE": "launchertest", "TMPDIR": str(tmp_path)}
    proc = _start_up(env, "--workers", "1", "--model-path", str(model_dir), "--router-mode", "kv")
    try:
        line = _up_line(proc)
        base = line.split()[3]
        logs_line = proc.stdout.readline()
        assert logs_line.startswith("logs and pids: "), logs_line
        run_dir = Path(logs_line.split()[3])
        assert run_dir.parent == tmp_path
        resp = httpx.post(
            f"{base}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=30,
        )
        assert resp.status_code == 200
        pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
        assert len(pids) == 7  # nats, preprocessor, formatter, router, mocker, embedder, gateway
        router_cmdline = Path(f"/proc/{int((run_dir / 'router.pid').read_text())}/cmdline")
        assert b"--router-mode\0kv" in router_cmdline.read_bytes()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        eventually(
            lambda: not any(_alive(p) for p in pids),
            timeout_s=5,
            interval_s=0.05,
            message=lambda: f"still alive after SIGTERM: {[p for p in pids if _alive(p)]}",
        )
        assert not run_dir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_restarts_a_killed_mocker_and_goes_on_serving(tmp_path: Path, model_dir: Path) -> None:
    """SIGKILL of one mocker: the launcher starts it again (a line on its stderr and in the
    mocker's log, and another once it is ready), every service stays up, and requests are
    served."""
    run_dir = tmp_path / "run"
    proc = _start_up(
        {"JETSERVE_NAMESPACE": "restarttest"},
        *("--workers", "2", "--model-path", str(model_dir), "--run-dir", str(run_dir)),
    )
    try:
        line = _up_line(proc)
        base = line.split()[3]
        pid_file = run_dir / "mocker-0.pid"
        killed = int(pid_file.read_text())
        others = {p.name: int(p.read_text()) for p in run_dir.glob("*.pid") if p != pid_file}
        os.kill(killed, signal.SIGKILL)

        def restarted() -> int | None:
            pid = int(pid_file.read_text())
            return pid if pid != killed and _alive(pid) else None

        fresh = eventually(
            restarted, timeout_s=15, interval_s=0.1, message="mocker-0 was not started again"
        )
        assert all(_alive(pid) for pid in others.values()), others
        log = (run_dir / "mocker-0.log").read_text()
        assert "jetserve up: mocker-0 exited with code -9; restart 1 in" in log
        assert f"jetserve up: mocker-0 restarted (pid {fresh})" in log

        def said_ready() -> str | None:
            text = (run_dir / "mocker-0.log").read_text()
            return text if "mocker-0 ready again after" in text else None

        log = eventually(  # it says so once the new mocker has started
            said_ready, timeout_s=15, interval_s=0.1, message="mocker-0 never said ready again"
        )
        assert re.search(r"jetserve up: mocker-0 ready again after \d+\.\ds", log), log[-2000:]
        for _ in range(6):
            resp = httpx.post(
                f"{base}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                },
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "mocker-0 exited with code -9; restart 1" in stderr
        assert "stopping (stopped by signal)" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_up_runs_replicas_of_each_stage_under_numbered_names(
    tmp_path: Path, model_dir: Path
) -> None:
    """``--routers 2 --formatters 2 --preprocessors 2``: six stage processes, each with its own
    pid file and log, serving; SIGTERM stops them all. With ``--nats-url`` and ``--namespace``:
    no nats-server of its own, the workers register on the server given, in that namespace."""
    run_dir = tmp_path / "run"
    with nats_server(tmp_path / "nats") as (nats_url, _):
        proc = _start_up(
            {},
            *("--workers", "1", "--routers", "2", "--formatters", "2", "--preprocessors", "2"),
            *("--model-path", str(model_dir), "--run-dir", str(run_dir)),
            *("--nats-url", nats_url, "--namespace", "replicatest"),
        )
        try:
            _serve_replicas(proc, run_dir, nats_url)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _serve_replicas(proc: subprocess.Popen[str], run_dir: Path, nats_url: str) -> None:
    line = _up_line(proc)
    assert "2 preprocessors, 2 routers, 2 formatters" in line
    assert f"NATS {nats_url})" in line, line
    base = line.split()[3]
    pids = {p.stem: int(p.read_text()) for p in run_dir.glob("*.pid")}
    stages = ("preprocessor", "router", "formatter")
    assert sorted(pids) == sorted(
        ["gateway", "mocker-0", "embedder-0"] + [f"{s}-{i}" for s in stages for i in (0, 1)]
    )
    cards = asyncio.run(_worker_cards(nats_url, "replicatest", at_least=2))
    assert sorted(c.model for c in cards) == sorted([MODEL, "Qwen/Qwen3-Embedding-0.6B"])
    assert all((run_dir / f"{name}.log").is_file() for name in pids)
    for _ in range(4):
        resp = httpx.post(
            f"{base}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    eventually(
        lambda: not any(_alive(p) for p in pids.values()),
        timeout_s=5,
        interval_s=0.05,
        message=lambda: f"still alive after SIGTERM: {[n for n, p in pids.items() if _alive(p)]}",
    )


async def _worker_cards(
    nats_url: str, namespace: str, seed: str | None = None, *, at_least: int = 1
) -> list[WorkerCard]:
    """The worker cards in ``namespace``'s registry on ``nats_url`` (``seed``: tap's NKey), once
    there are ``at_least`` (a worker may say it started a moment before its card is read)."""
    keys = {"nkeys_seed": seed, "inbox_prefix": inbox_prefix("tap")} if seed else {}
    nc = await nats.connect(nats_url, allow_reconnect=False, **keys)
    try:

        async def listed() -> list[WorkerCard] | None:
            cards = await registered_cards(nc.jetstream(), namespace)
            return cards if len(cards) >= at_least else None

        return await eventually_awaited(
            listed,
            timeout_s=15,
            interval_s=0.1,
            message=f"fewer than {at_least} worker cards in {namespace}",
        )
    finally:
        await nc.close()


async def _anonymous_connect(nats_url: str) -> None:
    nc = await nats.connect(nats_url, allow_reconnect=False, max_reconnect_attempts=0)
    await nc.close()


def _router_modes(log: Path) -> list[str]:
    """The mode each ``router_started`` line of a router's JSON log names."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line["mode"] for line in lines if line.get("event") == "router_started"]


def test_up_options_each_take_effect(tmp_path: Path, model_dir: Path) -> None:
    """One start with most of README's options, each checked where it shows: ``--grpc-port`` and
    ``--nats-port`` (the ports given serve), ``--workers 3`` (three cards registered),
    ``--model-name`` (served under it), ``--worker-args`` and a ``--mocker-*`` setting (every
    card carries them), ``--router-mode kv`` (the router says so), ``--gateway-api-key`` (a
    request without the key is refused), ``--media-workers 1`` (images are served),
    ``--tensor-workers 1`` and ``--embedders 0`` (their cards, or none), ``--secure`` (NATS
    refuses a client without a key) and ``--keep-run-dir`` (the temp run dir outlives a clean
    exit)."""
    grpc_port, nats_port = free_ports(2)
    env = {"JETSERVE_NAMESPACE": "optionstest", "TMPDIR": str(tmp_path)}
    proc = _start_up(
        env,
        *("--grpc-port", str(grpc_port), "--nats-port", str(nats_port)),
        *("--workers", "3", "--model-path", str(model_dir), "--model-name", "my-model"),
        *("--worker-args", "--max-num-seqs 7", "--mocker-num-gpu-blocks-override", "4096"),
        *("--router-mode", "kv", "--gateway-api-key", API_KEY),
        *("--media-workers", "1", "--tensor-workers", "1", "--embedders", "0"),
        *("--secure", "--keep-run-dir"),
    )
    try:
        line = _up_line(proc)
        assert f"gRPC (KServe v2) 127.0.0.1:{grpc_port} " in line, line
        assert f"NATS nats://127.0.0.1:{nats_port})" in line, line
        assert "(model my-model, 3 mocker workers, " in line, line
        assert proc.stdout is not None
        run_dir = Path(proc.stdout.readline().split()[3])
        assert run_dir.parent == tmp_path
        proc.stdout.readline()  # live view: jetserve top …
        secure_line = proc.stdout.readline()
        assert secure_line.startswith("NATS admits only this stack's keys"), secure_line
        seed = shlex.split(secure_line.split("read-only tap: ")[1])[-2]
        assert Path(seed) == run_dir / "nats-auth" / f"{TAP_USER}.nk"

        _check_http(base=line.split()[3])
        assert "image and video models on 1 media workers" in line, line
        _check_grpc(grpc_port)
        _check_bus(f"nats://127.0.0.1:{nats_port}", seed)
        assert _router_modes(run_dir / "router.log") == ["kv"]

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        assert f"logs kept in {run_dir}" in proc.stderr.read()
        assert (run_dir / "media-0.log").is_file()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _check_http(base: str) -> None:
    """The model under its ``--model-name``, an image (``--media-workers``), the API key."""
    client = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0, timeout=30)
    assert "my-model" in {m.id for m in client.models.list()}
    chat = client.chat.completions.create(
        model="my-model", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.choices[0].finish_reason == "length"
    image = client.images.generate(
        model=DEFAULT_IMAGE_MODEL, prompt="a fox", size="256x256", response_format="b64_json"
    )
    assert image.data is not None
    assert decode(base64.b64decode(image.data[0].b64_json or "")).width == 256
    stranger = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()


def _check_grpc(port: int) -> None:
    """KServe v2 on the ``--grpc-port`` given, the model ready there."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        ready = pb_grpc.GRPCInferenceServiceStub(channel).ModelReady(
            pb.ModelReadyRequest(name="my-model"),
            metadata=[("authorization", f"Bearer {API_KEY}")],
            timeout=10,
        )
    assert ready.ready


def _check_bus(nats_url: str, tap_seed: str) -> None:
    """``--secure``: no key, no connection. The cards: three LLM workers with the worker args
    and the mocker setting, the media and tensor workers' models, no embedder."""
    with pytest.raises((nats.errors.Error, OSError)):
        asyncio.run(_anonymous_connect(nats_url))
    cards = asyncio.run(_worker_cards(nats_url, "optionstest", tap_seed, at_least=6))
    llm = [c for c in cards if c.model == "my-model"]
    assert len(llm) == 3
    assert {(c.max_num_seqs, c.kv_blocks) for c in llm} == {(7, 4096)}
    others = sorted(c.model for c in cards if c.model != "my-model")
    assert others == sorted([DEFAULT_IMAGE_MODEL, DEFAULT_VIDEO_MODEL, TENSOR_MODEL])


def test_up_runs_the_engine_it_is_given_with_the_worker_args(
    tmp_path: Path, model_dir: Path
) -> None:
    """``--engine hf``: the workers are ``services.hf_worker`` processes, and ``--worker-args``
    reach them (an unknown flag: each exits at once with a usage error, torch or not, and the
    launcher names the process that failed)."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        _up(
            *("--http-port", "0", "--grpc-port", "0", "--engine", "hf", "--workers", "1"),
            *("--worker-args", "--no-such-flag --seed 3", "--model-path", str(model_dir)),
            *("--embedders", "0", "--run-dir", str(run_dir)),
        ),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JETSERVE_NAMESPACE": "enginetest"},
    )
    assert result.returncode == 1, result.stderr
    assert "hf_worker-0 exited with code 2 during start-up" in result.stderr
    assert "unrecognized arguments: --no-such-flag" in (run_dir / "hf_worker-0.log").read_text()
    assert not (run_dir / "mocker-0.log").exists()
