"""The settings table: names, precedence (flag > env > default), aliases, bad values, bounds."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from services.cli.config import service_configs
from services.formatter.config import FormatterConfig
from services.gateway.config import GatewayConfig
from services.mocker.config import MockerConfig
from services.router.config import RouterConfig
from shared.config import (
    REDACTED,
    CommonConfig,
    SettingError,
    computed_setting,
    setting,
    settings_of,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig(CommonConfig):
    SERVICE = "demo"

    demo_mode: str = setting("a", "Mode", choices=("a", "b"))
    count: int = setting(3, "How many", ge=1, aliases=("OLD_DEMO_COUNT",))
    ratio: float | None = setting(None, "A fraction", ge=0, le=1)
    fast: bool = setting(True, "Go fast")
    path: Path | None = setting(None, "Somewhere")
    ident: str = computed_setting(lambda: "generated", "Id", default_doc="random")


def parse(argv: list[str], **environ: str) -> DemoConfig:
    return DemoConfig.from_cli(argv, environ=environ)


def test_names_are_derived_from_the_field_and_the_service() -> None:
    table = DemoConfig.settings()
    assert [
        (s.flag, s.env) for s in table.select("demo_mode", "count", "namespace", "nats_url")
    ] == [
        ("--demo-mode", "JETSERVE_DEMO_MODE"),  # the service's name is not repeated
        ("--count", "JETSERVE_DEMO_COUNT"),
        ("--namespace", "JETSERVE_NAMESPACE"),  # common: no service prefix
        ("--nats-url", "JETSERVE_NATS_URL"),
    ]
    assert table["metrics_port"].env == "JETSERVE_DEMO_METRICS_PORT"
    assert table["shutdown_grace_s"].env == "JETSERVE_DEMO_SHUTDOWN_GRACE_S"


def test_the_dataclass_default_is_the_setting_default() -> None:
    config = parse([])
    assert (config.demo_mode, config.count, config.ratio, config.fast, config.path) == (
        "a",
        3,
        None,
        True,
        None,
    )
    assert DemoConfig.settings()["count"].default == 3 == DemoConfig().count


def test_flag_beats_env_beats_default() -> None:
    assert parse([]).count == 3
    assert parse([], JETSERVE_DEMO_COUNT="5").count == 5
    assert parse(["--count", "7"], JETSERVE_DEMO_COUNT="5").count == 7


def test_an_empty_env_var_counts_as_unset() -> None:
    assert parse([], JETSERVE_DEMO_COUNT="").count == 3


def test_a_deprecated_alias_is_read_with_a_warning_and_the_new_name_wins() -> None:
    with pytest.warns(FutureWarning, match="OLD_DEMO_COUNT is deprecated, set JETSERVE_DEMO_COUNT"):
        assert parse([], OLD_DEMO_COUNT="4").count == 4
    assert parse([], OLD_DEMO_COUNT="4", JETSERVE_DEMO_COUNT="6").count == 6


def test_nats_url_is_also_read_quietly(recwarn: pytest.WarningsRecorder) -> None:
    assert parse([], NATS_URL="nats://a:1").nats_url == "nats://a:1"
    assert parse([], NATS_URL="nats://a:1", JETSERVE_NATS_URL="nats://b:2").nats_url == (
        "nats://b:2"
    )
    assert [w for w in recwarn if issubclass(w.category, FutureWarning)] == []


def test_old_log_names_still_work_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="LOG_LEVEL"):
        assert parse([], LOG_LEVEL="debug").log_level == "DEBUG"


@pytest.mark.parametrize(
    ("argv", "environ", "names"),
    [
        (["--count", "x"], {}, ["--count"]),
        (["--count", "0"], {}, ["--count", ">= 1"]),
        (["--demo-mode", "c"], {}, ["--demo-mode"]),
        (["--ratio", "2"], {}, ["--ratio", "<= 1"]),
        ([], {"JETSERVE_DEMO_COUNT": "x"}, ["JETSERVE_DEMO_COUNT", "--count"]),
        ([], {"JETSERVE_DEMO_COUNT": "0"}, ["--count", "JETSERVE_DEMO_COUNT", ">= 1"]),
        ([], {"JETSERVE_DEMO_FAST": "maybe"}, ["JETSERVE_DEMO_FAST", "--fast"]),
        ([], {"JETSERVE_DEMO_MODE": "c"}, ["JETSERVE_DEMO_MODE", "--demo-mode"]),
        (["--namespace", "a.b"], {}, ["--namespace"]),
    ],
)
def test_a_bad_value_is_a_usage_error_naming_the_flag(
    argv: list[str],
    environ: dict[str, str],
    names: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv, **environ)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: python -m services.demo" in err
    assert [n for n in names if n not in err] == []


def test_bools_take_no_forms_and_words() -> None:
    assert parse(["--no-fast"]).fast is False
    assert parse([], JETSERVE_DEMO_FAST="off").fast is False
    assert parse(["--fast"], JETSERVE_DEMO_FAST="0").fast is True


def test_optional_values_take_empty_for_unset() -> None:
    assert parse(["--ratio", "0.5"]).ratio == 0.5
    assert parse(["--ratio", ""], JETSERVE_DEMO_RATIO="0.5").ratio is None
    assert parse(["--path", "/tmp/x"]).path == Path("/tmp/x")


def test_a_computed_default_is_computed_unless_given() -> None:
    assert parse([]).ident == "generated"
    assert parse(["--ident", ""]).ident == "generated"
    assert parse(["--ident", "x"]).ident == "x"
    assert DemoConfig.settings()["ident"].default_text() == "random"


def test_direct_construction_checks_bounds_and_choices() -> None:
    with pytest.raises(SettingError, match="--count"):
        DemoConfig(count=0)
    with pytest.raises(SettingError, match="--demo-mode"):
        DemoConfig(demo_mode="z")
    with pytest.raises(ValueError, match="JETSERVE_NAMESPACE"):
        CommonConfig(namespace="a.b")


def test_help_names_the_env_var_and_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "How many [env JETSERVE_DEMO_COUNT; default 3; must be >= 1]" in out


def test_a_settings_table_adds_to_any_parser() -> None:
    parser = argparse.ArgumentParser()
    CommonConfig.settings().select("namespace").add_to(parser)
    table = CommonConfig.settings().select("namespace")
    assert table.resolved(parser.parse_args([]), {}) == {"namespace": "jetserve"}
    assert table.resolved(parser.parse_args([]), {"JETSERVE_NAMESPACE": "e"}) == {"namespace": "e"}
    assert table.resolved(parser.parse_args(["--namespace", "f"]), {}) == {"namespace": "f"}


def test_an_unsupported_field_type_is_refused() -> None:
    @dataclass(frozen=True)
    class Bad:
        SERVICE: ClassVar[str] = "bad"
        items: tuple[str, ...] = setting((), "no")

    with pytest.raises(TypeError, match=r"Bad\.items"):
        settings_of(Bad)


@pytest.mark.parametrize("service", ["gateway", "preprocessor", "router", "formatter", "mocker"])
def test_every_field_of_a_service_config_is_a_setting(service: str) -> None:
    cls = service_configs()[service]
    fields = [f.name for f in dataclasses.fields(cls)]
    assert [s.name for s in cls.settings()] == fields
    assert service == cls.SERVICE


@pytest.mark.parametrize("cls", [GatewayConfig, RouterConfig, MockerConfig])
def test_worker_ttl_is_per_service_and_reads_the_old_shared_name(cls: type[CommonConfig]) -> None:
    item = cls.settings()["worker_ttl_s"]
    assert item.env == f"JETSERVE_{cls.SERVICE.upper()}_WORKER_TTL_S"
    assert item.aliases == ("JETSERVE_WORKER_TTL_S",)


def test_one_shutdown_grace_setting_in_every_service() -> None:
    for cls in service_configs().values():
        assert cls.settings()["shutdown_grace_s"].flag == "--shutdown-grace-s"
    assert FormatterConfig().shutdown_grace_s == 30.0
    assert MockerConfig().shutdown_grace_s == 10.0


def test_env_var_names_are_unique_per_service_and_carry_the_prefix() -> None:
    common = {
        "JETSERVE_NATS_URL",
        "JETSERVE_NAMESPACE",
        "JETSERVE_LOG_LEVEL",
        "JETSERVE_LOG_FORMAT",
        "JETSERVE_JS_REPLICAS",
        "JETSERVE_METRICS_PREFIX",
        "JETSERVE_ADMISSION_CONFIG",
        "JETSERVE_NATS_CREDS",
        "JETSERVE_NATS_NKEY_SEED",
        "JETSERVE_NATS_TLS_CA",
        "JETSERVE_NATS_TLS_CERT",
        "JETSERVE_NATS_TLS_KEY",
    }
    for service, cls in service_configs().items():
        names = cls.settings().env_vars()
        assert len(names) == len(set(names))
        odd = [
            n for n in names if n not in common and not n.startswith(f"JETSERVE_{service.upper()}_")
        ]
        assert odd == []
        flags = [s.flag for s in cls.settings()]
        assert [f for f in flags if f.endswith("-secs")] == []


class TestDump:
    """``--dump-config-to``: every resolved value as JSON, secrets redacted."""

    def test_from_cli_writes_the_resolved_values_and_returns_the_config(
        self, tmp_path: Path
    ) -> None:
        out = tmp_path / "deep" / "demo.json"
        config = parse(["--count", "7", "--dump-config-to", str(out)], JETSERVE_DEMO_FAST="off")
        dumped = json.loads(out.read_text())
        assert dumped["service"] == "demo"
        assert dumped["settings"]["count"] == 7  # flag
        assert dumped["settings"]["fast"] is False  # env var
        assert dumped["settings"]["demo_mode"] == "a"  # default
        assert dumped["settings"]["ident"] == "generated"  # computed
        assert dumped["settings"]["path"] is None
        assert list(dumped["settings"]) == [s.name for s in DemoConfig.settings()]
        assert config.count == 7

    def test_a_dump_that_cannot_be_written_is_a_usage_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        (tmp_path / "file").write_text("")
        with pytest.raises(SystemExit) as exc:
            parse(["--dump-config-to", str(tmp_path / "file" / "x.json")])
        assert exc.value.code == 2
        assert "--dump-config-to" in capsys.readouterr().err

    def test_secrets_are_redacted(self) -> None:
        settings = SecretConfig.settings()
        assert [s.name for s in settings if s.secret] == ["token", "api_key", "db_password"]
        shown = SecretConfig(token="t0k", api_key="k3y", db_password="pw").dump()["settings"]
        assert (shown["token"], shown["api_key"], shown["db_password"]) == (REDACTED,) * 3
        assert shown["api_key_file"] == "/keys.txt"  # a path to a secret is not one
        assert SecretConfig().dump()["settings"]["api_key"] == ""  # unset says so

    @pytest.mark.parametrize(
        ("url", "shown"),
        [
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://jet:s3cret@h:4222", f"nats://jet:{REDACTED}@h:4222"),
            ("nats://t0ken@h:4222", f"nats://{REDACTED}@h:4222"),
            ("nats://a:1,nats://u:p@b:2", f"nats://a:1,nats://u:{REDACTED}@b:2"),
        ],
    )
    def test_a_password_or_token_in_a_url_is_redacted(self, url: str, shown: str) -> None:
        assert CommonConfig(nats_url=url).dump()["settings"]["nats_url"] == shown

    def test_the_gateway_api_key_is_a_secret(self) -> None:
        assert GatewayConfig.settings()["api_key"].secret


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretConfig(CommonConfig):
    SERVICE = "sec"

    token: str = setting("", "Marked", secret=True)
    api_key: str = setting("", "Named like a secret")
    db_password: str = setting("", "Named like a secret")
    api_key_file: Path = setting(Path("/keys.txt"), "A path")
    tokens: int = setting(3, "Not a secret")


class TestMetricsPrefix:
    def test_defaults_to_jetserve(self) -> None:
        assert parse([]).metrics_prefix == "jetserve_"
        assert DemoConfig.settings()["metrics_prefix"].env == "JETSERVE_METRICS_PREFIX"

    def test_flag_and_env(self) -> None:
        assert parse(["--metrics-prefix", "acme_"]).metrics_prefix == "acme_"
        assert parse([], JETSERVE_METRICS_PREFIX="env_").metrics_prefix == "env_"

    def test_a_prefix_no_metric_name_can_start_with_is_a_usage_error(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit):
            parse(["--metrics-prefix", "9-lives"])
        assert "--metrics-prefix (JETSERVE_METRICS_PREFIX) must be" in capsys.readouterr().err
