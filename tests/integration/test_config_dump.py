"""``--dump-config-to`` and ``--metrics-prefix`` on the command line a user types: each service
writes its resolved settings (secrets redacted) and goes on serving, every metric name on its
``/metrics`` starting with the prefix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.config import REDACTED
from shared.subjects import Subjects
from tests.support import free_port, wait_for_port

HANG_S = 30.0
"""A process start (imports, a tokenizer, the first connection) takes seconds; only a hang
runs into this."""


@contextmanager
def _running(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m services.<...> args`` as its own process, stopped by SIGTERM (its exit
    status checked: a clean shutdown)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=os.environ
        )
    try:
        yield proc
        assert proc.poll() is None, log.read_text()  # it went on running after the dump
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=HANG_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _with_password(nats_url: str) -> str:
    """``nats_url`` with a user and password (a server without auth ignores them)."""
    return nats_url.replace("nats://", "nats://jet:s3cret@", 1)


def _scrape(port: int) -> str:
    wait_for_port(port, timeout_s=HANG_S)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


SERVICES = {
    "router": ("router_decisions", []),
    "formatter": ("formatter_migrations", []),
    "preprocessor": ("messages", []),
    "mocker": ("mocker_kv_blocks_used", ["--model-path"]),
}
"""Service → a family it always exposes (without the prefix), and extra flags (``--model-path``
takes the model dir)."""


@pytest.mark.parametrize("service", list(SERVICES))
def test_a_service_dumps_its_settings_and_serves_metrics_with_the_prefix(
    service: str, nats_url: str, subjects: Subjects, tmp_path: Path, model_dir: Path
) -> None:
    family, extra = SERVICES[service]
    dump, port = tmp_path / "out" / f"{service}.json", free_port()
    args = [f"services.{service}", *extra, *([str(model_dir)] if extra else [])]
    args += ["--nats-url", _with_password(nats_url), "--namespace", subjects.namespace]
    args += ["--metrics-port", str(port), "--metrics-prefix", "acme_"]
    args += ["--dump-config-to", str(dump)]
    with _running(args, tmp_path / "log") as proc:
        text = _scrape(port)
        settings = json.loads(dump.read_text())["settings"]
        assert proc.poll() is None
    assert settings["nats_url"] == nats_url.replace("nats://", f"nats://jet:{REDACTED}@", 1)
    assert "s3cret" not in dump.read_text()
    assert (settings["metrics_prefix"], settings["metrics_port"]) == ("acme_", port)
    assert settings["namespace"] == subjects.namespace
    names = {f.name for f in text_string_to_metric_families(text)}
    assert f"acme_{family}" in names
    assert [n for n in names if not n.startswith("acme_")] == []


def test_the_gateway_dumps_with_its_api_key_redacted(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> None:
    dump = tmp_path / "gateway.json"
    args = ["services.gateway", "--nats-url", nats_url, "--namespace", subjects.namespace]
    args += ["--http-port", "0", "--grpc-port", "0", "--api-key", "sesame,open-says-me"]
    args += ["--dump-config-to", str(dump)]
    log = tmp_path / "log"
    with _running(args, log):
        deadline = time.monotonic() + HANG_S  # serving: the dump did not stop it
        while b"gateway_started" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        settings = json.loads(dump.read_text())["settings"]
    assert settings["api_key"] == REDACTED
    assert "sesame" not in dump.read_text()
    assert settings["http_port"] == 0
