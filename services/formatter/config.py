"""Formatter configuration: common options plus instance id, idle and shutdown timeouts."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.config import CommonConfig, add_common_options, env, env_help
from shared.subjects import check_token


def _random_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatterConfig(CommonConfig):
    """Everything one formatter instance needs."""

    formatter_id: str = field(default_factory=_random_id)
    """This instance's subject token: workers send token batches to ``stream.<formatter_id>.*``."""
    idle_timeout_s: float = 60.0
    """A request with no token batch for this long fails with 504 (and is cancelled)."""
    shutdown_timeout_s: float = 30.0
    """On SIGTERM, how long in-flight streams may take to finish before they are failed."""

    def __post_init__(self) -> None:
        # Not super(): slotted dataclasses are rebuilt, which breaks zero-argument super().
        CommonConfig.__post_init__(self)
        check_token(self.formatter_id, "--formatter-id / JETSERVE_FORMATTER_ID")
        if self.idle_timeout_s <= 0:
            raise ValueError("--idle-timeout-s must be > 0")

    @classmethod
    def from_cli(cls, argv: Sequence[str] | None = None) -> FormatterConfig:
        """Parse ``argv`` (default ``sys.argv[1:]``); each flag falls back to its env var."""
        parser = argparse.ArgumentParser(
            prog="python -m services.formatter",
            description="Detokenize worker output into OpenAI responses.",
        )
        add_common_options(parser, service="formatter")
        parser.add_argument(
            "--formatter-id",
            default=env("JETSERVE_FORMATTER_ID", "") or _random_id(),
            help=env_help("Instance id (subject token)", "JETSERVE_FORMATTER_ID"),
        )
        parser.add_argument(
            "--idle-timeout-s",
            type=float,
            default=env("JETSERVE_FORMATTER_IDLE_TIMEOUT_S", 60.0),
            help=env_help(
                "Fail a request with 504 after this long without a token batch",
                "JETSERVE_FORMATTER_IDLE_TIMEOUT_S",
            ),
        )
        parser.add_argument(
            "--shutdown-timeout-s",
            type=float,
            default=env("JETSERVE_FORMATTER_SHUTDOWN_TIMEOUT_S", 30.0),
            help=env_help(
                "On SIGTERM, wait this long for in-flight streams",
                "JETSERVE_FORMATTER_SHUTDOWN_TIMEOUT_S",
            ),
        )
        args = parser.parse_args(argv)
        return cls(
            nats_url=args.nats_url,
            namespace=args.namespace,
            log_level=args.log_level,
            log_format=args.log_format,
            metrics_port=args.metrics_port,
            formatter_id=args.formatter_id,
            idle_timeout_s=args.idle_timeout_s,
            shutdown_timeout_s=args.shutdown_timeout_s,
        )
