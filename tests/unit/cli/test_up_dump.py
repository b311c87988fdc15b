"""``jetserve up --dump-config-to``: what ``up`` resolved, for itself and for every service."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.__main__ import build_parser
from services.cli.config import up_dump, up_plan, write_up_dump
from shared.config import REDACTED


def _dump(*argv: str, **environ: str) -> dict[str, object]:
    args = build_parser().parse_args(["up", *argv])
    return up_dump(args, up_plan(args), environ)


def test_up_own_and_shared_settings_are_resolved() -> None:
    dumped = _dump("--workers", "3", "--metrics-prefix", "acme_")
    assert dumped["command"] == "up"
    assert dumped["up"]["workers"] == 3  # type: ignore[index]
    assert dumped["up"]["http_port"] == 8000  # type: ignore[index]
    assert dumped["common"]["metrics_prefix"] == "acme_"  # type: ignore[index]


def test_a_service_setting_is_the_flag_else_its_env_var_else_its_default() -> None:
    services = _dump("--router-mode", "kv", JETSERVE_ROUTER_TEMPERATURE="0.5")["services"]
    router = services["router"]  # type: ignore[index]
    assert router["router_mode"] == "kv"
    assert router["router_temperature"] == 0.5
    assert router["kv_overlap_score_weight"] == 1.0


def test_secrets_are_redacted() -> None:
    dumped = _dump("--gateway-api-key", "sesame", JETSERVE_GATEWAY_API_KEY="ignored")
    assert dumped["services"]["gateway"]["api_key"] == REDACTED  # type: ignore[index]
    assert "sesame" not in json.dumps(dumped)


def test_written_only_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "up.json"
    args = build_parser().parse_args(["up", "--dump-config-to", str(out)])
    write_up_dump(args, up_plan(args))
    assert json.loads(out.read_text())["command"] == "up"
    bare = build_parser().parse_args(["up"])
    write_up_dump(bare, up_plan(bare))  # no file named, nothing to do


def test_a_dump_that_cannot_be_written_says_where(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    args = build_parser().parse_args(["up", "--dump-config-to", str(tmp_path / "file" / "x")])
    with pytest.raises(ValueError, match="--dump-config-to"):
        write_up_dump(args, up_plan(args))
