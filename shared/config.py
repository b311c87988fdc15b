"""Config helpers: every CLI flag falls back to an environment variable, then a default."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

from shared.subjects import check_token

T = TypeVar("T", str, int, float, bool, Path)
_PARSERS: dict[type, Callable[[str], object]] = {str: str, int: int, float: float, Path: Path}
_TRUE = {"1", "true", "yes", "on"}

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"


def env(name: str, default: T) -> T:
    """Return env var ``name`` parsed as the type of ``default``, or ``default``."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if isinstance(default, bool):
        return raw.strip().lower() in _TRUE
    if isinstance(default, Path):
        return Path(raw)
    return cast(T, _PARSERS[type(default)](raw))


def env_help(text: str, var: str) -> str:
    """Help text that names the env var and shows the default, as Dynamo's flags do."""
    return f"{text} [env {var}; default %(default)s]"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommonConfig:
    """Keys every service shares."""

    nats_url: str = DEFAULT_NATS_URL
    namespace: str = "jetserve"
    log_level: str = "INFO"
    log_format: str = "auto"
    metrics_port: int = 0
    """HTTP port for Prometheus ``/metrics``; 0 = off."""

    def __post_init__(self) -> None:
        check_token(self.namespace, "--namespace / JETSERVE_NAMESPACE")


def add_common_options(parser: argparse.ArgumentParser, *, service: str) -> None:
    """Add the options every service shares (NATS URL, namespace, logging, metrics port)."""
    parser.add_argument(
        "--nats-url",
        default=env("NATS_URL", DEFAULT_NATS_URL),
        help=env_help("NATS server URL(s), comma-separated", "NATS_URL"),
    )
    parser.add_argument(
        "--namespace",
        default=env("JETSERVE_NAMESPACE", "jetserve"),
        help=env_help("Namespace prefixed to every subject", "JETSERVE_NAMESPACE"),
    )
    parser.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning", "error"],
        help=env_help("Log level", "LOG_LEVEL"),
    )
    parser.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", "auto"),
        choices=["auto", "json", "console"],
        help=env_help("json, console, or auto (json unless a terminal)", "LOG_FORMAT"),
    )
    var = f"JETSERVE_{service.upper()}_METRICS_PORT"
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=env(var, 0),
        help=env_help("Port for Prometheus /metrics (0 = off)", var),
    )
