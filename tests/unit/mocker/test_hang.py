"""The mocker's test-only hang (``services.mocker.hang``) and the engine health settings as a
user types them (decision 029)."""

from __future__ import annotations

import asyncio

import pytest

from services.mocker.config import MockerConfig
from services.mocker.hang import Hang
from shared.worker.health import DEFAULT_PAYLOAD


def test_no_hang_unless_asked() -> None:
    hang = Hang(None)
    hang.count(10_000)
    assert not hang.is_due


def test_hang_is_due_once_enough_tokens_were_emitted() -> None:
    hang = Hang(30)
    hang.count(29)
    assert not hang.is_due
    hang.count(1)
    assert hang.is_due


def test_hang_after_zero_tokens_is_due_at_once() -> None:
    assert Hang(0).is_due


async def test_a_timed_hang_ends_and_does_not_come_back() -> None:
    hang = Hang(0, for_s=0.01)
    await asyncio.wait_for(hang.wait(), timeout=5)
    hang.count(100)
    assert not hang.is_due


async def test_an_untimed_hang_lasts_until_cancelled() -> None:
    task = asyncio.create_task(Hang(0).wait())
    done, _ = await asyncio.wait({task}, timeout=0.05)
    assert not done
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_health_settings_have_dynamos_defaults() -> None:
    config = MockerConfig.from_cli([])
    assert (config.health_check_idle_s, config.health_check_timeout_s) == (10.0, 3.0)
    assert config.engine_stall_s == 30.0
    assert config.health_check_payload == DEFAULT_PAYLOAD
    assert config.hang_after_tokens is None


def test_health_settings_from_the_command_line() -> None:
    config = MockerConfig.from_cli(
        [
            "--health-check-idle-s",
            "0.5",
            "--health-check-timeout-s",
            "1",
            "--engine-stall-s",
            "2",
            "--health-check-payload",
            '{"token_ids": [3, 4], "sampling": {"max_tokens": 2}}',
            "--hang-after-tokens",
            "30",
            "--hang-for-s",
            "4",
        ]
    )
    assert (config.health_check_idle_s, config.health_check_timeout_s) == (0.5, 1.0)
    assert config.engine_stall_s == 2.0
    assert config.health_check_payload == '{"token_ids": [3, 4], "sampling": {"max_tokens": 2}}'
    assert (config.hang_after_tokens, config.hang_for_s) == (30, 4.0)


def test_health_settings_from_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_MOCKER_HEALTH_CHECK_IDLE_S", "0")
    monkeypatch.setenv("JETSERVE_MOCKER_ENGINE_STALL_S", "60")
    config = MockerConfig.from_cli([])
    assert (config.health_check_idle_s, config.engine_stall_s) == (0.0, 60.0)


def test_a_bad_payload_is_a_usage_error_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        MockerConfig.from_cli(["--health-check-payload", '{"token_ids": []}'])
    assert "--health-check-payload" in capsys.readouterr().err


def test_a_zero_canary_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"health.check.timeout.s"):
        MockerConfig(health_check_timeout_s=0)
