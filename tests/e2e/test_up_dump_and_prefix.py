"""``jetserve up --dump-config-to FILE --metrics-prefix P``, typed as a user types it: the file
holds what ``up`` resolved (secrets redacted) and the stack goes on serving; every process's
metric names start with the prefix, and ``jetserve top --run-dir`` still reads them."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.cli.stack import free_port
from shared.config import REDACTED
from tests.e2e.conftest import MODEL
from tests.e2e.top_tables import top_tables

API_KEY = "sesame"
HANG_S = 60.0


def _jetserve(*args: str) -> list[str]:
    """The command line as a user types it: the venv's ``jetserve`` script."""
    script = Path(sys.executable).parent / "jetserve"
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "services.cli"]
    return [*launcher, *args]


def test_up_dumps_its_config_and_serves_metrics_under_the_prefix(
    tmp_path: Path, model_dir: Path
) -> None:
    dump, run_dir, router_port = tmp_path / "up.json", tmp_path / "run", free_port()
    proc = subprocess.Popen(
        _jetserve(
            "up",
            *("--http-port", "0", "--grpc-port", "0", "--workers", "1", "--embedders", "0"),
            *("--model-path", str(model_dir), "--run-dir", str(run_dir)),
            *("--mocker-speedup-ratio", "0", "--router-mode", "kv"),
            *("--router-metrics-port", str(router_port), "--gateway-api-key", API_KEY),
            *("--metrics-prefix", "acme_", "--dump-config-to", str(dump)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JETSERVE_NAMESPACE": f"dump{uuid.uuid4().hex[:8]}"},
    )
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        line = proc.stdout.readline()
        assert line.startswith("JetServe is up: "), line or proc.stderr.read()
        base = line.split()[3]
        dumped = json.loads(dump.read_text())
        resp = httpx.post(
            f"{base}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text
        with urllib.request.urlopen(f"http://127.0.0.1:{router_port}/metrics", timeout=5) as r:
            router_text = r.read().decode()
        top, unprefixed = (
            subprocess.run(
                _jetserve("top", "--once", "--window", "1", "--run-dir", str(run_dir), *flags),
                capture_output=True,
                text=True,
                timeout=HANG_S,
            )
            for flags in ((), ("--metrics-prefix", "jetserve_"))
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert dumped["command"] == "up"
    assert dumped["common"]["metrics_prefix"] == "acme_"
    assert dumped["up"]["workers"] == 1
    assert dumped["services"]["router"]["router_mode"] == "kv"
    assert dumped["services"]["router"]["metrics_port"] == router_port
    assert dumped["services"]["gateway"]["api_key"] == REDACTED
    assert API_KEY not in dump.read_text()

    families = {f.name for f in text_string_to_metric_families(router_text)}
    assert "acme_router_decisions" in families
    assert [name for name in families if not name.startswith("acme_")] == []
    assert re.search(r'^acme_router_decisions_total\{mode="kv"\} 1\.0$', router_text, re.M)

    assert top.returncode == unprefixed.returncode == 0, top.stderr + unprefixed.stderr
    (router,) = _routers(top.stdout)
    assert router["router"].startswith("router-")  # its id, from its prefixed router_info
    assert router["index blocks"].isdigit()  # read from its prefixed /metrics
    assert _routers(unprefixed.stdout) == []  # read with the wrong prefix: nothing found


def _routers(top_once: str) -> list[dict[str, str]]:
    """The rows of ``top --once``'s Routers table, as cells by column name."""
    return top_tables(top_once).get("Routers", [])
