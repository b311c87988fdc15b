"""The gateway's HTTP options, typed on ``jetserve up``'s command line as a user types them:
endpoint paths (``--gateway-*-path``), the body limit, SSE keep-alive comments, and the drain
delay during which ``/live`` and ``/health`` answer 503 while requests are still served."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.test_launcher import _start_up, _up_line
from tests.support import eventually

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class Up:
    def __init__(self, proc: subprocess.Popen[str], base: str, run_dir: Path) -> None:
        self.proc, self.base, self.run_dir = proc, base, run_dir


@contextlib.contextmanager
def jetserve_up(run_dir: Path, model_dir: Path, *args: str) -> Iterator[Up]:
    """``jetserve up`` with one mocker and ``args``; SIGTERMed (then killed) at the end."""
    proc = _start_up(
        {}, *("--workers", "1", "--model-path", str(model_dir), "--run-dir", str(run_dir)), *args
    )
    try:
        line = _up_line(proc)
        origin = line.split()[3].removesuffix("/v1")
        yield Up(proc, origin, run_dir)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Up]:
    with jetserve_up(
        tmp_path_factory.mktemp("run"),
        model_dir,
        *("--mocker-speedup-ratio", "0.05"),  # tokens ~20x slower than real: idle gaps
        *("--gateway-chat-path", "/chat/completions", "--gateway-models-path", "/models"),
        *("--gateway-live-path", "/alive", "--gateway-max-body-bytes", "4096"),
        *("--gateway-sse-keep-alive-s", "0.05"),
    ) as started:
        yield started


def test_the_configured_paths_are_served_and_the_defaults_are_not(up: Up) -> None:
    client = openai.OpenAI(base_url=up.base, api_key="unused", max_retries=0)
    answer = client.chat.completions.create(model=MODEL, messages=CHAT["messages"], max_tokens=2)
    assert answer.choices[0].message.content
    assert MODEL in [m.id for m in client.models.list()]
    assert httpx.get(f"{up.base}/alive", timeout=10).json() == {"status": "ok"}
    assert httpx.post(f"{up.base}/v1/chat/completions", json=CHAT, timeout=10).status_code == 404
    assert httpx.get(f"{up.base}/live", timeout=10).status_code == 404
    document = httpx.get(f"{up.base}/openapi.json", timeout=10).json()
    assert {"/chat/completions", "/models", "/alive"} <= set(document["paths"])


def test_a_body_over_the_limit_is_a_413_in_openai_shape(up: Up) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    response = httpx.post(f"{up.base}/chat/completions", json=big, timeout=10)
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "Request Entity Too Large"
    small = httpx.post(f"{up.base}/chat/completions", json=CHAT, timeout=30)
    assert small.status_code == 200


def test_an_idle_stream_carries_keep_alive_comments_the_sdk_ignores(up: Up) -> None:
    body = {**CHAT, "stream": True, "max_tokens": 6}
    with httpx.stream("POST", f"{up.base}/chat/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert ": keep-alive" in lines
    data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert len(data) >= 2
    assert lines[-1] == "data: [DONE]"
    client = openai.OpenAI(base_url=up.base, api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT["messages"], max_tokens=6, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text  # the SDK read through the comments without an error


def test_the_metrics_label_requests_by_the_paths_served(up: Up) -> None:
    assert httpx.post(f"{up.base}/chat/completions", json=CHAT, timeout=30).status_code == 200
    text = httpx.get(f"{up.base}/metrics", timeout=10).text
    assert 'jetserve_http_requests_total{endpoint="/chat/completions",status="200"}' in text


def test_draining_answers_503_on_live_and_health_and_still_serves(
    tmp_path: Path, model_dir: Path
) -> None:
    with jetserve_up(tmp_path, model_dir, "--gateway-drain-delay-s", "30") as up:
        _drain(up)


def _drain(up: Up) -> None:
    pid = int((up.run_dir / "gateway.pid").read_text())
    subprocess.run(["kill", "-TERM", str(pid)], check=True)  # the gateway `up` started

    def draining() -> bool:
        return httpx.get(f"{up.base}/live", timeout=5).status_code == 503

    eventually(draining, timeout_s=10, message="/live never turned 503 after SIGTERM")
    live = httpx.get(f"{up.base}/live", timeout=5)
    assert live.json() == {"status": "draining"}
    health = httpx.get(f"{up.base}/health", timeout=5)
    assert (health.status_code, health.json()["status"]) == (503, "shutting_down")
    served = httpx.post(f"{up.base}/v1/chat/completions", json=CHAT, timeout=30)
    assert served.status_code == 200
