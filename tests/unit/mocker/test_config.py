"""Mocker flags fall back to JETSERVE_MOCKER_* env vars, then defaults; worker ids per worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.mocker.config import MockerConfig
from shared.model_dir import DEFAULT_MODEL_NAME


def test_defaults() -> None:
    config = MockerConfig.from_cli([])
    assert config.model_name == DEFAULT_MODEL_NAME
    assert config.model_path is None
    assert (config.speedup_ratio, config.max_num_seqs, config.block_size) == (1.0, 256, 16)


def test_env_vars_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_MOCKER_SPEEDUP_RATIO", "0")
    monkeypatch.setenv("JETSERVE_MOCKER_MODEL_PATH", "/tmp/model")
    monkeypatch.setenv("JETSERVE_MOCKER_WORKER_TTL_S", "3")
    config = MockerConfig.from_cli(["--seed", "5"])
    assert (config.speedup_ratio, config.model_path, config.worker_ttl_s, config.seed) == (
        0.0,
        Path("/tmp/model"),
        3.0,
        5,
    )


def test_one_worker_keeps_the_given_id() -> None:
    assert MockerConfig(worker_id="w").worker_ids() == ["w"]


def test_several_workers_get_numbered_ids() -> None:
    assert MockerConfig(worker_id="w", num_workers=3).worker_ids() == ["w-0", "w-1", "w-2"]


def test_random_ids_are_valid_subject_tokens() -> None:
    (worker_id,) = MockerConfig().worker_ids()
    assert worker_id.startswith("mocker-")


def test_invalid_worker_id_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        MockerConfig.from_cli(["--worker-id", "a.b"])


def test_negative_speedup_is_rejected() -> None:
    with pytest.raises(ValueError, match="speedup"):
        MockerConfig(speedup_ratio=-1)


def test_dynamo_step_timing_is_off_by_default_and_can_be_turned_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert MockerConfig.from_cli([]).dynamo_step_timing is False
    assert MockerConfig.from_cli(["--dynamo-step-timing"]).dynamo_step_timing is True
    monkeypatch.setenv("JETSERVE_MOCKER_DYNAMO_STEP_TIMING", "true")
    assert MockerConfig.from_cli([]).dynamo_step_timing is True
