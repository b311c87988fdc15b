"""``docs/configuration.md`` and ``.env`` are generated from the settings tables: no drift."""

from __future__ import annotations

import pytest

from services.cli.config import pass_through, service_configs, up_settings
from tools import config_doc, env_file


def test_committed_configuration_reference_is_up_to_date() -> None:
    committed = config_doc.OUTPUT.read_text(encoding="utf-8")
    assert committed == config_doc.render(), "docs/configuration.md is stale: run `make config-doc`"


def test_committed_env_file_is_up_to_date() -> None:
    committed = config_doc.ENV_OUTPUT.read_text(encoding="utf-8")
    assert committed == env_file.render(), ".env is stale: run `make config-doc`"


def test_check_mode_passes_on_the_committed_files() -> None:
    assert config_doc.main(["--check"]) == 0


def test_every_setting_of_every_service_is_documented() -> None:
    text = config_doc.render()
    for name, cls in service_configs().items():
        section = text.split(f"\n## {name}\n", 1)[1].split("\n## ", 1)[0]
        for item in cls.settings():
            assert f"| `{item.flags_text()}` | `{item.env}` | `{item.default_text()}` |" in section
    for item in up_settings():
        assert f"| `{item.flags_text()}` | `{item.env}` |" in text
    for passed in pass_through():
        assert f"`{passed.flag}`" in text
    assert "\n## jetserve tap\n" in text


def test_environment_overrides_do_not_leak_into_the_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JETSERVE_GATEWAY_HTTP_PORT", "9999")
    monkeypatch.setenv("JETSERVE_NATS_URL", "nats://elsewhere:1")
    text = config_doc.render()
    assert "9999" not in text
    assert "| `--nats-url` | `JETSERVE_NATS_URL` | `nats://127.0.0.1:4222` |" in text


def test_computed_defaults_are_shown_as_random() -> None:
    assert "| `--formatter-id` | `JETSERVE_FORMATTER_ID` | `random` |" in config_doc.render()
