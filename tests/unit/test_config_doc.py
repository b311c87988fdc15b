"""``docs/configuration.md`` is generated from the services' parsers and must not drift."""

from __future__ import annotations

import os
from unittest import mock

from tools import config_doc


def test_committed_configuration_reference_is_up_to_date() -> None:
    committed = config_doc.OUTPUT.read_text(encoding="utf-8")
    assert committed == config_doc.render(), (
        "docs/configuration.md is stale: run `python -m tools.config_doc --write`"
    )


def test_every_service_with_a_config_is_documented() -> None:
    text = config_doc.render()
    for name in ("gateway", "preprocessor", "router", "formatter", "mocker"):
        assert f"\n## {name}\n" in text
    assert "\n## jetserve tap\n" in text


def test_environment_overrides_do_not_leak_into_the_defaults() -> None:
    with mock.patch.dict(os.environ, {"JETSERVE_GATEWAY_HTTP_PORT": "9999", "NATS_URL": "x"}):
        text = config_doc.render()
    assert "9999" not in text
    assert "| `--nats-url` | `NATS_URL` | `nats://127.0.0.1:4222` |" in text


def test_random_defaults_are_shown_as_random() -> None:
    assert "| `--formatter-id` | `JETSERVE_FORMATTER_ID` | `random` |" in config_doc.render()
