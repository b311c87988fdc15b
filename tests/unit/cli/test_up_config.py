"""``jetserve up``: its options and the pass-through flags generated from the service tables."""

from __future__ import annotations

import itertools
from dataclasses import fields
from pathlib import Path

import pytest

from services.cli.__main__ import banner, build_parser
from services.cli.config import (
    LAUNCHER_OWNED,
    NATS_AUTH,
    UpConfig,
    UpPlan,
    pass_through,
    service_configs,
    up_plan,
)
from services.cli.secure import TAP_USER
from services.cli.stack import (
    FROM_UP_RENAMED,
    UP_LINE,
    Child,
    Stack,
    StackConfig,
    _stop_rank,
    admission_env,
    replica_args,
)
from shared.vision_model import VISION_MODEL_NAME


def plan(*argv: str) -> UpPlan:
    return up_plan(build_parser().parse_args(["up", *argv]))


def test_defaults() -> None:
    result = plan()
    assert result.up == UpConfig()
    assert (result.up.http_port, result.up.workers, result.up.run_dir) == (8000, 2, None)
    assert result.common == {
        "namespace": "jetserve",
        "log_level": "INFO",
        "log_format": "auto",
        "metrics_prefix": "jetserve_",
        "admission_config": None,
        **dict.fromkeys(NATS_AUTH),
    }
    assert result.service_args == {}
    assert result.nats_env() == {}


EVERY_OPTION = (
    *("--http-host", "0.0.0.0", "--http-port", "9000", "--grpc-port", "9001"),
    *("--nats-port", "4333", "--workers", "3", "--engine", "vllm", "--worker-args", "--seed 3"),
    *("--prefill-workers", "2", "--decode-workers", "2", "--data-parallel-size", "2"),
    *("--routers", "2", "--formatters", "2", "--preprocessors", "2", "--tensor-workers", "1"),
    *("--embedders", "2", "--embedding-model-name", "emb", "--media-workers", "1"),
    *("--vision-workers", "2"),
    *("--model-name", "m", "--log-to-terminal", "--secure"),
    *("--namespace", "ns", "--log-level", "DEBUG", "--log-format", "json"),
    *("--metrics-prefix", "acme_"),
    *("--lora-modules", "sql=/a/sql", "chat=/a/chat"),
)
"""A value other than the default for every option of ``jetserve up`` (but ``--nats-url``, which
``--secure`` refuses, and ``--run-dir``, a path); a new option needs one here."""
UP_OWN = {"keep_run_dir", "model_path"}
"""Options ``_up`` uses itself: it keeps the run dir, and resolves the model dir it hands on."""


def test_every_up_option_reaches_the_stack(tmp_path: Path) -> None:
    """What ``jetserve up`` parses, its ``Stack`` gets (``--media-workers`` was parsed and then
    dropped: no media worker, ``/v1/images/generations`` a 404)."""
    given = StackConfig.from_up(plan(*EVERY_OPTION, "--run-dir", str(tmp_path)), tmp_path)
    default = StackConfig.from_up(plan(), tmp_path)
    changed = {
        f.name for f in fields(StackConfig) if getattr(given, f.name) != getattr(default, f.name)
    }
    options = {f.name for f in fields(UpConfig)} - UP_OWN - {"nats_url"}
    options |= {"namespace", "log_level", "log_format", "metrics_prefix"}
    assert {FROM_UP_RENAMED.get(name, name) for name in options} - changed == set()


def test_every_up_field_named_like_a_stack_field_is_carried(tmp_path: Path) -> None:
    """``from_up`` matches fields by name: each ``UpConfig`` field that ``StackConfig`` has (but
    those ``from_up`` sets itself) holds the value ``jetserve up`` parsed."""
    given = plan(*EVERY_OPTION, "--run-dir", str(tmp_path))
    config = StackConfig.from_up(given, tmp_path)
    names = {f.name for f in fields(StackConfig)}
    set_by_from_up = {"nats_url", "model_path"}
    carried = {
        FROM_UP_RENAMED.get(f.name, f.name): getattr(given.up, f.name)
        for f in fields(UpConfig)
        if FROM_UP_RENAMED.get(f.name, f.name) in names - set_by_from_up
    }
    assert len(carried) == len(fields(UpConfig)) - 3  # all but keep_run_dir and set_by_from_up
    assert {name: getattr(config, name) for name in carried} == carried


def test_the_shared_settings_and_the_resolved_model_reach_the_stack(tmp_path: Path) -> None:
    config = StackConfig.from_up(plan("--namespace", "ns", "--log-level", "DEBUG"), tmp_path)
    assert (config.namespace, config.log_level, config.log_format) == ("ns", "DEBUG", "auto")
    assert (config.model_path, config.nats_url) == (str(tmp_path), None)


def test_only_up_own_options_have_no_stack_field() -> None:
    """A new ``jetserve up`` option needs a ``StackConfig`` field of its name (or a rename)."""
    names = {f.name for f in fields(StackConfig)}
    missing = {f.name for f in fields(UpConfig)} - names - FROM_UP_RENAMED.keys()
    assert missing == {"keep_run_dir"}


def _started(config: StackConfig) -> Stack:
    """A stack as ``jetserve up`` sees it once started (nothing is run)."""
    stack = Stack(config)
    stack.nats_url = "nats://127.0.0.1:4333"
    stack.http_port, stack.grpc_port = 9000, 9001
    return stack


def test_the_banner_says_where_and_what_the_stack_serves(tmp_path: Path) -> None:
    given = plan(
        *("--workers", "3", "--tensor-workers", "1", "--embedders", "2"),
        *("--embedding-model-name", "emb", "--media-workers", "1", "--routers", "2"),
        *("--model-name", "m", "--run-dir", str(tmp_path)),
    )
    lines = banner(given.up, _started(StackConfig.from_up(given, tmp_path))).splitlines()
    assert lines == [
        f"{UP_LINE}http://127.0.0.1:9000/v1 and gRPC (KServe v2) 127.0.0.1:9001  (model m, "
        "3 mocker workers, tensor model echo on 1 workers, embedding model emb on 2 workers, "
        "image and video models on 1 media workers, 2 routers, NATS nats://127.0.0.1:4333)",
        f"logs and pids: {tmp_path}    stop: Ctrl-C",
        f"live view: jetserve top --run-dir {tmp_path}",
    ]


def test_the_banner_says_a_temp_run_dir_goes_and_where_the_tap_seed_is(tmp_path: Path) -> None:
    given = plan("--secure")
    stack = _started(StackConfig.from_up(given, tmp_path))
    stack.seeds = {TAP_USER: tmp_path / "tap.nk"}
    try:
        lines = banner(given.up, stack).splitlines()
    finally:
        stack.remove_run_dir()
    assert lines[1].endswith("(removed on a clean exit)    stop: Ctrl-C")
    assert lines[3] == (
        "NATS admits only this stack's keys; read-only tap: jetserve tap --nats-url "
        f"nats://127.0.0.1:4333 --nats-nkey-seed {tmp_path / 'tap.nk'} '>'"
    )


def test_a_nats_url_and_its_credentials_reach_the_stack(tmp_path: Path) -> None:
    creds = tmp_path / "svc.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----")
    given = plan("--nats-url", "nats://nats.internal:4222", "--nats-creds", str(creds))
    config = StackConfig.from_up(given, tmp_path)
    assert (config.nats_url, config.extra_env) == (
        "nats://nats.internal:4222",
        {"JETSERVE_NATS_CREDS": str(creds)},
    )


def test_nats_credentials_go_to_every_process(tmp_path: Path) -> None:
    creds = tmp_path / "svc.creds"
    creds.write_text("-----BEGIN NATS USER JWT-----")
    result = plan("--nats-url", "nats://nats.internal:4222", "--nats-creds", str(creds))
    assert result.nats_env() == {"JETSERVE_NATS_CREDS": str(creds)}


@pytest.mark.parametrize("other", [["--nats-url", "nats://x:4222"], ["--nats-tls-ca", "ca.pem"]])
def test_secure_runs_its_own_server_and_keys(other: list[str], tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not checked here")
    args = [str(tmp_path / a) if a == "ca.pem" else a for a in other]
    with pytest.raises(ValueError, match="--secure starts its own nats-server"):
        plan("--secure", *args)


def test_service_settings_pass_through_with_the_service_name_as_prefix() -> None:
    result = plan(
        "--router-kv-overlap-score-weight",
        "2",
        "--router-mode",
        "kv",
        "--no-router-kv-events",
        "--mocker-speedup-ratio",
        "0",
        "--router-seed",
        "",
        "--formatter-shutdown-grace-s",
        "5",
    )
    assert result.service_args == {
        # in table order
        "router": [
            *("--router-mode", "kv", "--seed", ""),
            *("--kv-overlap-score-weight", "2.0", "--no-kv-events"),
        ],
        "mocker": ["--speedup-ratio", "0.0"],
        "formatter": ["--shutdown-grace-s", "5.0"],
    }


def test_every_passed_setting_is_accepted_by_its_service() -> None:
    for item in pass_through():
        value = item.setting.default if item.setting.default is not None else ""
        argv = item.setting.to_argv(value)
        config = service_configs()[item.service].from_cli(argv, environ={})
        assert getattr(config, item.setting.name) == item.setting.default


def test_shared_ids_and_launcher_owned_settings_are_not_passed_through() -> None:
    flags = {p.flag for p in pass_through()}
    assert "--router-nats-url" not in flags
    assert "--router-router-id" not in flags
    assert "--router-id" not in flags
    assert "--mocker-worker-id" not in flags
    for service, names in LAUNCHER_OWNED.items():
        for item in pass_through():
            assert not (item.service == service and item.setting.name in names)
    assert {"--router-mode", "--router-temperature", "--gateway-request-timeout-s"} <= flags


def test_bad_values_are_usage_errors_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--router-busy-status", "500"])
    assert "--router-busy-status" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--workers", "-1"])
    assert "argument --workers: must be >= 0, got -1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--workers"):
        UpConfig(workers=0)


def test_up_reads_its_env_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_UP_WORKERS", "3")
    monkeypatch.setenv("JETSERVE_NAMESPACE", "ns1")
    monkeypatch.setenv("JETSERVE_UP_RUN_DIR", "/tmp/somewhere")
    result = plan("--workers", "4")
    assert (result.up.workers, result.common["namespace"], result.up.run_dir) == (
        4,
        "ns1",
        Path("/tmp/somewhere"),
    )


def test_a_bad_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        plan("--namespace", "a.b")


def test_only_a_temp_run_dir_is_removed(tmp_path: Path) -> None:
    given = Stack(StackConfig(run_dir=tmp_path))
    assert given.remove_run_dir() is False
    assert tmp_path.is_dir()
    temp = Stack(StackConfig())
    (temp.run_dir / "router.log").write_text("x")
    assert temp.remove_run_dir() is True
    assert not temp.run_dir.exists()


def test_one_process_per_stage_by_default() -> None:
    up = plan().up
    assert (up.routers, up.formatters, up.preprocessors) == (1, 1, 1)


def test_replica_counts_come_from_flags_then_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_UP_ROUTERS", "3")
    monkeypatch.setenv("JETSERVE_UP_PREPROCESSORS", "2")
    up = plan("--routers", "2", "--formatters", "4").up
    assert (up.routers, up.formatters, up.preprocessors) == (2, 4, 2)


def test_zero_replicas_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--formatters", "0"])
    assert "argument --formatters: must be >= 1, got 0" in capsys.readouterr().err


def test_a_single_process_of_a_stage_keeps_its_plain_name(tmp_path: Path) -> None:
    names = [name for name, _ in Stack(StackConfig(run_dir=tmp_path, workers=1)).plan()]
    assert names == ["preprocessor", "formatter", "router", "mocker-0", "gateway"]


def test_replicas_are_numbered_and_each_gets_the_stage_flags(tmp_path: Path) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        workers=1,
        routers=2,
        formatters=2,
        preprocessors=3,
        router_mode="kv",
        service_args={"router": ["--temperature", "0.5"]},
    )
    commands = dict(Stack(config).plan())
    assert list(commands) == [
        *("preprocessor-0", "preprocessor-1", "preprocessor-2"),
        *("formatter-0", "formatter-1", "router-0", "router-1", "mocker-0", "gateway"),
    ]
    for name in ("router-0", "router-1"):
        assert commands[name][-6:] == [
            *("-m", "services.router", "--router-mode", "kv", "--temperature", "0.5")
        ]


def test_replicas_serve_metrics_on_consecutive_ports(tmp_path: Path) -> None:
    config = StackConfig(
        run_dir=tmp_path, formatters=2, service_args={"formatter": ["--metrics-port", "9100"]}
    )
    commands = dict(Stack(config).plan())
    assert commands["formatter-0"][-2:] == ["--metrics-port", "9100"]
    assert commands["formatter-1"][-2:] == ["--metrics-port", "9101"]


def test_vision_workers_are_mockers_serving_the_vision_model(tmp_path: Path) -> None:
    config = StackConfig(
        run_dir=tmp_path,
        workers=1,
        vision_workers=2,
        vision_model_path="/vl",
        mocker_args="--seed 3",
    )
    commands = dict(Stack(config).plan())
    vision = commands["mocker-vision-1"]
    assert vision[2] == "services.mocker"
    assert vision[3:] == ["--seed", "3", "--model-path", "/vl", "--model-name", VISION_MODEL_NAME]
    assert "mocker-vision-0" in commands


def test_vision_workers_leave_other_engines_worker_args_out(tmp_path: Path) -> None:
    config = StackConfig(
        run_dir=tmp_path, engine="hf", vision_workers=1, vision_model_path="/vl", mocker_args="--x"
    )
    assert "--x" not in dict(Stack(config).plan())["mocker-vision-0"]


def test_replica_args_leave_an_unset_metrics_port_alone() -> None:
    assert replica_args(["--metrics-port", "0", "--seed", "7"], 2) == [
        *("--metrics-port", "0", "--seed", "7")
    ]


def test_replicas_stop_with_their_stage(tmp_path: Path) -> None:
    stack = Stack(StackConfig(run_dir=tmp_path, routers=2))
    ranks = {name: _stop_rank(Child(name, None, None)) for name, _ in stack.plan()}  # type: ignore[arg-type]
    assert ranks["router-0"] == ranks["router-1"] == ranks["preprocessor"] == 1
    assert ranks["gateway"] == 0


def test_a_single_worker_flag_is_given_with_an_equals_sign(tmp_path: Path) -> None:
    """README: ``--worker-args=--enforce-eager`` (argparse takes ``--worker-args --x`` for two
    options)."""
    given = StackConfig.from_up(plan("--worker-args=--enforce-eager"), tmp_path)
    assert given.mocker_args == "--enforce-eager"


# --- disaggregated serving: workers by role -----------------------------------------------------


def _workers(stack: Stack) -> dict[str, list[str]]:
    """The planned worker processes' commands, by name."""
    return {name: cmd for name, cmd in stack.plan() if cmd[2] == "services.mocker"}


def _flag(cmd: list[str], flag: str) -> str:
    """The last value ``cmd`` gives ``flag`` (the one the service takes)."""
    return [b for a, b in itertools.pairwise(cmd) if a == flag][-1]


def test_prefill_and_decode_workers_are_processes_of_their_own_with_their_role(
    tmp_path: Path,
) -> None:
    given = plan(
        *("--workers", "1", "--prefill-workers", "2", "--decode-workers", "1"),
        *("--data-parallel-size", "2", "--mocker-metrics-port", "9200"),
    )
    workers = _workers(Stack(StackConfig.from_up(given, tmp_path)))
    assert {name: _flag(cmd, "--role") for name, cmd in workers.items()} == {
        "mocker-0": "both",
        "mocker-prefill-0": "prefill",
        "mocker-prefill-1": "prefill",
        "mocker-decode-0": "decode",
    }
    assert {_flag(cmd, "--data-parallel-size") for cmd in workers.values()} == {"2"}
    ports = sorted(_flag(cmd, "--metrics-port") for cmd in workers.values())
    assert ports == ["9200", "9201", "9202", "9203"]  # one port each, whatever the role


def test_a_fully_disaggregated_stack_has_no_aggregated_worker(tmp_path: Path) -> None:
    given = plan("--workers", "0", "--prefill-workers", "2", "--decode-workers", "2")
    assert sorted(_workers(Stack(StackConfig.from_up(given, tmp_path)))) == [
        *("mocker-decode-0", "mocker-decode-1", "mocker-prefill-0", "mocker-prefill-1")
    ]


def test_aggregated_workers_say_their_role_and_the_worker_args_come_after_it(
    tmp_path: Path,
) -> None:
    """The role is the launcher's (``--mocker-role`` is no flag); a ``--worker-args`` flag, given
    later on the command line, still wins."""
    workers = _workers(Stack(StackConfig.from_up(plan("--worker-args", "--seed 3"), tmp_path)))
    for cmd in workers.values():
        i = cmd.index("--role")
        assert cmd[i : i + 4] == ["--role", "both", "--data-parallel-size", "1"]
        assert cmd.index("--seed") > i
    assert "--mocker-role" not in {p.flag for p in pass_through()}
    assert "--mocker-data-parallel-size" not in {p.flag for p in pass_through()}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers 0 leaves no worker to serve the model"),
        (["--workers", "0", "--prefill-workers", "2"], "--prefill-workers 2 needs workers that"),
        (["--engine", "hf", "--decode-workers", "1"], "--engine hf runs aggregated single-rank"),
        (["--engine", "hf", "--data-parallel-size", "2"], "need --engine mocker or vllm"),
    ],
)
def test_a_stack_that_cannot_serve_is_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(*argv)


def test_a_decode_only_stack_and_prefill_beside_aggregated_workers_are_valid() -> None:
    assert plan("--workers", "0", "--decode-workers", "1").up.worker_counts() == {"decode": 1}
    both = plan("--prefill-workers", "1").up.worker_counts()
    assert both == {"both": 2, "prefill": 1}


def test_worker_counts_come_from_env_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_UP_PREFILL_WORKERS", "3")
    monkeypatch.setenv("JETSERVE_UP_DECODE_WORKERS", "2")
    monkeypatch.setenv("JETSERVE_UP_DATA_PARALLEL_SIZE", "4")
    up = plan("--workers", "0").up
    assert (up.prefill_workers, up.decode_workers, up.data_parallel_size) == (3, 2, 4)


def test_the_routers_disaggregation_settings_pass_through() -> None:
    result = plan(
        *("--router-conditional-disagg", "--router-enforce-disagg"),
        *("--router-disagg-min-prefill-tokens", "64", "--router-disagg-local-overlap", "0.25"),
        *("--router-prefill-timeout-s", "5"),
    )
    assert result.service_args["router"] == [
        *("--router-conditional-disagg", "--disagg-min-prefill-tokens", "64"),
        *("--disagg-local-overlap", "0.25", "--enforce-disagg", "--prefill-timeout-s", "5.0"),
    ]


def test_the_vllm_engine_gets_the_role_too(tmp_path: Path) -> None:
    given = plan(
        *("--engine", "vllm", "--workers", "0", "--prefill-workers", "1", "--decode-workers", "1")
    )
    commands = dict(Stack(StackConfig.from_up(given, tmp_path)).plan())
    assert _flag(commands["vllm_worker-prefill-0"], "--role") == "prefill"
    assert _flag(commands["vllm_worker-decode-0"], "--role") == "decode"


def test_the_admission_config_reaches_every_service_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "admission.yaml").write_text("classes: {gold: {weight: 2}}\ndefault_class: gold\n")
    monkeypatch.chdir(tmp_path)
    config = StackConfig.from_up(plan("--admission-config", "admission.yaml"), tmp_path)
    assert config.admission_config == Path("admission.yaml")
    assert admission_env(config.admission_config) == {
        "JETSERVE_ADMISSION_CONFIG": str(tmp_path / "admission.yaml")
    }
    assert admission_env(None) == {}
