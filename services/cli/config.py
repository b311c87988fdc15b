"""``jetserve up``'s settings, and its pass-through flags generated from the services' tables.

Pass-through scheme: every setting ``--x`` of service ``S`` is ``jetserve up --S-x`` (a leading
``S-`` is not repeated: the router's ``--router-mode`` stays ``--router-mode``) and reaches every
process of ``S`` as ``--x``. Bools keep their ``--no-`` form (``--no-router-kv-events``). Not
passed through: the settings every service shares (``up`` sets NATS URL, namespace and logging
itself), per-instance ids (each process picks its own) and what ``up`` owns (the gateway's
listen address and ports, the mocker's model path and name: ``up`` has its own flags for them).
A service's env vars reach it too: ``up`` passes its environment on to every process.

The launcher reads each service's settings table, so it imports the services' ``config``
modules (by name, from ``SERVICES``); it never imports service code.

``--dump-config-to FILE`` writes what ``up`` resolved (``up_dump``): its own settings, the shared
ones it hands every process, and each service's pass-through settings as its processes resolve
them (flag, else the env var ``up`` passes on, else the default), secrets redacted.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from shared.config import (
    CommonConfig,
    Setting,
    Settings,
    add_dump_option,
    setting,
    settings_of,
    write_dump,
)
from shared.lora import parse_lora_modules
from shared.model_dir import DEFAULT_MODEL_NAME

SERVICES = ("gateway", "preprocessor", "router", "formatter", "mocker", "embedder")
"""Every service ``jetserve up`` runs, in request-path order."""
LAUNCHER_OWNED: dict[str, frozenset[str]] = {
    "gateway": frozenset({"http_host", "http_port", "grpc_port"}),
    "mocker": frozenset({"model_path", "model_name", "role", "data_parallel_size", "lora_modules"}),
    "embedder": frozenset({"model_name"}),
}
"""Service settings that ``jetserve up`` sets from its own flags (not passed through)."""
WORKER_ENGINES = {"mocker": "mocker", "hf": "hf_worker", "vllm": "vllm_worker"}
"""``jetserve up --engine`` → the worker service (``python -m services.<name>``)."""
DISAGG_ENGINES = frozenset({"mocker", "vllm"})
"""Engines whose workers run as prefill or decode workers and with data-parallel ranks (the hf
worker moves no KV between workers and runs one rank)."""
NATS_AUTH = ("nats_creds", "nats_nkey_seed", "nats_tls_ca", "nats_tls_cert", "nats_tls_key")
"""How every process signs in to a NATS server of yours (``--nats-url``)."""
UP_COMMON = (
    "namespace",
    "log_level",
    "log_format",
    "metrics_prefix",
    "admission_config",
    *NATS_AUTH,
)
"""Settings shared by every service that ``jetserve up`` takes and hands to each of them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UpConfig:
    """The launcher's own settings (``JETSERVE_UP_*``)."""

    SERVICE: ClassVar[str] = "up"

    http_host: str = setting("127.0.0.1", "Gateway HTTP bind address")
    http_port: int = setting(8000, "Gateway HTTP port (0 = pick a free one)", ge=0, le=65535)
    grpc_port: int = setting(
        8001, "Gateway gRPC port, KServe v2 / Triton (0 = pick a free one)", ge=0, le=65535
    )
    nats_port: int = setting(
        0, "Port of the private nats-server (0 = pick a free one)", ge=0, le=65535
    )
    nats_url: str = setting("", "Use this NATS server instead of starting one (empty = start one)")
    secure: bool = setting(
        False,
        "Least privilege on the bus: the private nats-server admits only this stack's "
        "processes, each with its own NKey and only its role's subjects (seeds in "
        "<run dir>/nats-auth, tap.nk for jetserve tap)",
    )
    workers: int = setting(
        2,
        "Aggregated worker processes (of the engine --engine names; each prefills and decodes "
        "its own requests); 0 with --decode-workers: a fully disaggregated stack",
        ge=0,
    )
    prefill_workers: int = setting(
        0,
        "Prefill worker processes (--role prefill): they compute prompts' KV for decode "
        "workers; needs --decode-workers or --workers",
        ge=0,
    )
    decode_workers: int = setting(
        0,
        "Decode worker processes (--role decode): they decode requests whose KV a prefill "
        "worker computed (and prefill themselves when no prefill worker lives)",
        ge=0,
    )
    data_parallel_size: int = setting(
        1,
        "Data-parallel ranks per worker process (every role): each rank is a routing target "
        "with its own KV cache",
        ge=1,
    )
    engine: str = setting(
        "mocker",
        "The workers' engine: mocker (simulated GPU), hf (transformers: real forward passes; "
        "needs jetserve[hf]), vllm (vLLM in-process; needs jetserve[vllm] and a GPU)",
        choices=tuple(WORKER_ENGINES),
    )
    worker_args: str = setting(
        "",
        "Extra flags for every worker, one shell-quoted string (e.g. --engine hf "
        '--worker-args "--random-weights --device cuda")',
    )
    routers: int = setting(
        1,
        "Router processes; replicas share KV events and decisions (N > 1: router-0, router-1…)",
        ge=1,
    )
    formatters: int = setting(
        1, "Formatter processes, one queue group (N > 1: formatter-0, formatter-1…)", ge=1
    )
    preprocessors: int = setting(
        1, "Preprocessor processes, one queue group (N > 1: preprocessor-0, preprocessor-1…)", ge=1
    )
    tensor_workers: int = setting(
        0,
        "Echo tensor worker processes (python -m services.echo_tensor): a KServe v2 tensor "
        "model named `echo` that returns its inputs",
        ge=0,
    )
    embedders: int = setting(
        1,
        "Mock embedding worker processes (python -m services.embedder) serving "
        "`embedding_model_name` on /v1/embeddings (0 = none)",
        ge=0,
    )
    embedding_model_name: str = setting(
        "Qwen/Qwen3-Embedding-0.6B", "Served name of the mock embedding model"
    )
    media_workers: int = setting(
        0,
        "Mock media worker processes (python -m services.media), each serving an image and a "
        "video model on /v1/images/generations and /v1/videos/generations (0 = none)",
        ge=0,
    )
    vision_workers: int = setting(
        0,
        "Mocker workers serving a mock vision-language model (Qwen/Qwen2.5-VL-3B-Instruct: "
        "the bundled tokenizer, a VL chat template, Qwen2.5-VL's image rule) that reads "
        "image_url parts (0 = none)",
        ge=0,
    )
    model_path: Path | None = setting(
        None, "Local model directory (unset = the bundled Qwen3 tokenizer in the user cache)"
    )
    model_name: str = setting(DEFAULT_MODEL_NAME, "Served model name")
    lora_modules: str = setting(
        "",
        "LoRA adapters every worker holds from the start, vLLM's syntax: name=path or a JSON "
        '{"name": ..., "path": ..., "base_model_name": ...}, several after one flag',
        many=True,
    )
    log_to_terminal: bool = setting(
        False, "Let services log to this terminal instead of files in the run dir"
    )
    run_dir: Path | None = setting(
        None,
        "Folder for logs, pids and the NATS store (unset = a new temp dir, removed after a "
        "clean exit)",
    )
    keep_run_dir: bool = setting(
        False, "Keep the temp run dir after a clean exit (it is always kept after a failure)"
    )

    def __post_init__(self) -> None:
        settings_of(UpConfig).check(self)
        if self.workers == 0 and self.decode_workers == 0:
            if self.prefill_workers:
                raise ValueError(
                    f"--prefill-workers {self.prefill_workers} needs workers that decode: add "
                    "--decode-workers N, or --workers N (aggregated)"
                )
            raise ValueError(
                "--workers 0 leaves no worker to serve the model: give --workers N "
                "(aggregated) or --decode-workers N"
            )
        parse_lora_modules(self.lora_modules)  # a bad item stops `up` before anything starts
        disaggregated = self.prefill_workers or self.decode_workers
        if self.engine not in DISAGG_ENGINES and (disaggregated or self.data_parallel_size > 1):
            raise ValueError(
                f"--engine {self.engine} runs aggregated single-rank workers only: "
                "--prefill-workers, --decode-workers and --data-parallel-size need --engine "
                f"{' or '.join(sorted(DISAGG_ENGINES))}"
            )

    def worker_counts(self) -> dict[str, int]:
        """Worker processes by role (``both``: aggregated), those asked for only."""
        counts = {
            "both": self.workers,
            "prefill": self.prefill_workers,
            "decode": self.decode_workers,
        }
        return {role: n for role, n in counts.items() if n}


def up_settings() -> Settings:
    return settings_of(UpConfig)


def up_common_settings() -> Settings:
    return CommonConfig.settings().select(*UP_COMMON)


def config_class(name: str) -> type[CommonConfig]:
    """Service ``name``'s config class (the ``CommonConfig`` subclass in its ``config`` module)."""
    module = importlib.import_module(f"services.{name}.config")
    return next(
        cls
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, CommonConfig) and name == cls.SERVICE
    )


@functools.cache
def service_configs() -> dict[str, type[CommonConfig]]:
    """Each service's config class, in ``SERVICES`` order."""
    return {name: config_class(name) for name in SERVICES}


@dataclass(frozen=True, slots=True)
class PassThrough:
    """One service setting as a ``jetserve up`` flag."""

    service: str
    setting: Setting

    @property
    def flag(self) -> str:
        own = self.setting.flag.removeprefix("--").removeprefix(f"{self.service}-")
        return f"--{self.service}-{own}"

    @property
    def dest(self) -> str:
        return f"{self.service}:{self.setting.name}"

    def help(self) -> str:
        s = self.setting
        return f"{s.help} [{self.service} {s.flag}; default {s.default_text()}]"


def pass_through() -> Iterator[PassThrough]:
    """Every service setting that ``jetserve up`` passes through, service by service."""
    for service, cls in service_configs().items():
        owned = LAUNCHER_OWNED.get(service, frozenset())
        for item in cls.settings():
            if item.common or item.per_instance or item.name in owned:
                continue
            yield PassThrough(service, item)


def add_up_options(parser: argparse.ArgumentParser) -> None:
    """``jetserve up``'s own options, the shared ones, then one group per service."""
    up_settings().add_to(parser)
    up_common_settings().add_to(parser)
    add_dump_option(parser)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for item in pass_through():
        if item.service not in groups:
            groups[item.service] = parser.add_argument_group(
                f"{item.service} settings",
                f"Passed to every {item.service} process (python -m services.{item.service} "
                "--help); unset = its own env var, then its default.",
            )
        item.setting.add_to(groups[item.service], flag=item.flag, dest=item.dest, help=item.help())


@dataclass(frozen=True, slots=True)
class UpPlan:
    """What ``jetserve up`` was asked for, parsed and checked."""

    up: UpConfig
    common: dict[str, Any]
    service_args: dict[str, list[str]]

    def nats_env(self) -> dict[str, str]:
        """The NATS credential and TLS files given, as every process reads them
        (``JETSERVE_NATS_CREDS``…)."""
        settings = up_common_settings()
        return {
            settings[name].env: str(self.common[name])
            for name in NATS_AUTH
            if self.common[name] is not None
        }


def up_plan(args: argparse.Namespace) -> UpPlan:
    """Build the plan from parsed flags and the environment (``ValueError`` for a bad value)."""
    up = UpConfig(**up_settings().values(args))
    common = up_common_settings().resolved(args)
    CommonConfig(**common)  # checks the namespace token
    if up.secure and (up.nats_url or any(common[name] for name in NATS_AUTH)):
        raise ValueError(
            "--secure starts its own nats-server with its own keys: no --nats-url or "
            "--nats-* credentials with it (for a server of yours: jetserve nats-config)"
        )
    given = vars(args)
    service_args: dict[str, list[str]] = {}
    for item in pass_through():
        if item.dest in given:
            argv = item.setting.to_argv(given[item.dest])
            service_args.setdefault(item.service, []).extend(argv)
    return UpPlan(up=up, common=common, service_args=service_args)


def up_dump(
    args: argparse.Namespace, plan: UpPlan, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """What ``jetserve up --dump-config-to`` writes: ``up``'s settings, the shared ones, and
    every pass-through setting of each service as its processes resolve it (secrets redacted)."""
    environ = os.environ if environ is None else environ
    given = vars(args)
    services: dict[str, dict[str, Any]] = {}
    for item in pass_through():
        value = given.get(item.dest, dataclasses.MISSING)
        if value is dataclasses.MISSING:
            is_set, value = item.setting.env_value(environ)
            value = value if is_set else item.setting.default
        services.setdefault(item.service, {})[item.setting.name] = item.setting.shown(value)
    up_values = {item.name: getattr(plan.up, item.name) for item in up_settings()}
    return {
        "command": "up",
        "up": up_settings().dump(up_values),
        "common": up_common_settings().dump(plan.common),
        "services": services,
    }


def write_up_dump(args: argparse.Namespace, plan: UpPlan) -> None:
    """With ``--dump-config-to FILE``: write ``up_dump`` there (``ValueError`` saying why it
    could not be written)."""
    path: Path | None = args.dump_config_to
    if path is None:
        return
    try:
        write_dump(path, up_dump(args, plan))
    except OSError as exc:
        raise ValueError(f"--dump-config-to {path}: {exc.strerror or exc}") from exc
