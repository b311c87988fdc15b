"""The Grafana dashboard asks only for metrics the running services really export.

Every service the compose file runs starts as a process with ``--metrics-port``; their
``/metrics`` (the gateway's on its HTTP port) are scraped after one streamed chat request, and
every metric name in the dashboard's PromQL must be a sample name one of them can produce.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from services.cli.stack import Stack, free_port
from tests.e2e.conftest import MODEL, running_stack
from tests.observability import PROMETHEUS_OWN, dashboard_exprs, exported_names, metric_names

BUS_SERVICES = ("preprocessor", "router", "formatter", "mocker", "embedder", "echo_tensor", "media")


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text: str = resp.read().decode()
    return text


@pytest.fixture(scope="module")
def expositions(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> Iterator[dict[str, str]]:
    """Service -> its ``/metrics`` text, after one streamed chat request through the stack."""
    ports = {name: free_port() for name in BUS_SERVICES}
    with running_stack(
        tmp_path_factory.mktemp("dashboard"),
        model_dir,
        workers=1,
        embedders=1,
        tensor_workers=1,
        media_workers=1,
        service_args={name: ["--metrics-port", str(port)] for name, port in ports.items()},
    ) as stack:
        _chat(stack)
        texts = {name: scrape(f"http://127.0.0.1:{port}/metrics") for name, port in ports.items()}
        yield {"gateway": scrape(f"{stack.base_url}/metrics"), **texts}


def _chat(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
    )
    assert sum(1 for _ in stream) > 1


def test_every_dashboard_metric_is_exported(expositions: dict[str, str]) -> None:
    exported = set(PROMETHEUS_OWN).union(*map(exported_names, expositions.values()))
    missing = {
        (title, name)
        for title, expr in dashboard_exprs()
        for name in metric_names(expr)
        if name not in exported
    }
    assert sorted(missing) == []


def test_a_streamed_request_is_timed_in_ttft_and_itl(expositions: dict[str, str]) -> None:
    samples = {
        row.rpartition(" ")[0]: float(row.rpartition(" ")[2])
        for row in expositions["gateway"].splitlines()
        if row and not row.startswith("#")
    }
    chat = '{endpoint="/v1/chat/completions"}'
    assert samples[f"jetserve_gateway_ttft_seconds_count{chat}"] == 1
    assert samples[f"jetserve_gateway_itl_seconds_count{chat}"] == 1
