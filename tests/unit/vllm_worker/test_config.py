"""The vLLM worker's settings: modes, one server per worker, and what does not go together."""

from __future__ import annotations

import pytest

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.engine import VllmEngine
from services.vllm_worker.remote import RemoteVllmEngine
from services.vllm_worker.service import engine_factory
from shared.config import SettingError


def test_in_process_is_the_default() -> None:
    config = VllmWorkerConfig.from_cli([])
    assert not config.remote
    assert config.SERVICE == "vllm_worker"
    assert config.worker_ids()[0].startswith("vllm-")
    assert isinstance(engine_factory(config)(config.worker_ids()[0]), VllmEngine)


def test_remote_workers_get_one_server_each() -> None:
    config = VllmWorkerConfig.from_cli(
        [
            "--engine-url",
            "http://a:1, http://b:2",
            "--kv-events-endpoint",
            "tcp://a:5557,tcp://b:5557",
            "--num-workers",
            "2",
            "--worker-id",
            "w",
        ]
    )
    assert config.engine_urls() == ["http://a:1", "http://b:2"]
    assert config.remote_endpoints(1) == ("tcp://b:5557", None)
    make = engine_factory(config)
    second = make("w-1")
    assert isinstance(second, RemoteVllmEngine)
    assert second.options.engine_url == "http://b:2"
    assert second.options.kv_events_endpoint == "tcp://b:5557"


@pytest.mark.parametrize(
    "argv",
    [
        ["--engine-url", "http://a:1", "--num-workers", "2"],
        ["--engine-url", "http://a:1,http://b:1,http://c:1", "--num-workers", "2"],
        ["--engine-url", "http://a:1", "--kv-events-endpoint", "tcp://a:1,tcp://b:1"],
        ["--kv-events-endpoint", "tcp://a:1"],
        ["--num-workers", "2"],
        ["--gpu-memory-utilization", "1.5"],
    ],
)
def test_settings_that_do_not_go_together(argv: list[str]) -> None:
    with pytest.raises((SettingError, SystemExit)):
        VllmWorkerConfig.from_cli(argv)
