"""Preprocessor configuration: CLI flags falling back to ``JETSERVE_PREPROCESSOR_*`` env vars."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import CommonConfig, add_common_options, env, env_help

_PREFIX = "JETSERVE_PREPROCESSOR_"


@dataclass(frozen=True, slots=True, kw_only=True)
class PreprocessorConfig(CommonConfig):
    """Everything the preprocessor needs to run."""

    formatter_timeout_s: float = 2.0
    """How long to wait for a formatter to answer ``StreamOpen`` before failing with 504."""
    max_model_len: int = 0
    """Context length to enforce for every model; 0 = each model card's ``context_length``."""
    max_cached_models: int = 8
    """How many models' tokenizers and templates stay loaded (least recently used go first)."""
    direct_open: bool = True
    """Send ``StreamOpen`` straight to a known formatter without waiting for its answer
    (decision 013); off = always the queue-group request/reply handshake."""

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.formatter_timeout_s <= 0:
            raise ValueError("--formatter-timeout-s must be > 0")
        if self.max_model_len < 0:
            raise ValueError("--max-model-len must be >= 0")
        if self.max_cached_models < 1:
            raise ValueError("--max-cached-models must be >= 1")

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> PreprocessorConfig:
        """Parse ``argv`` (default ``sys.argv``); invalid values exit with a usage error."""
        parser = argparse.ArgumentParser(prog="python -m services.preprocessor")
        add_common_options(parser, service="preprocessor")
        var = f"{_PREFIX}FORMATTER_TIMEOUT_S"
        parser.add_argument(
            "--formatter-timeout-s",
            type=float,
            default=env(var, 2.0),
            help=env_help("Seconds to wait for a formatter to open a stream", var),
        )
        var = f"{_PREFIX}MAX_MODEL_LEN"
        parser.add_argument(
            "--max-model-len",
            type=int,
            default=env(var, 0),
            help=env_help("Context length override; 0 = the model card's", var),
        )
        var = f"{_PREFIX}MAX_CACHED_MODELS"
        parser.add_argument(
            "--max-cached-models",
            type=int,
            default=env(var, 8),
            help=env_help("Models whose tokenizer stays loaded", var),
        )
        var = f"{_PREFIX}DIRECT_OPEN"
        parser.add_argument(
            "--direct-open",
            action=argparse.BooleanOptionalAction,
            default=env(var, True),
            help=env_help("Open streams on a known formatter without a round trip", var),
        )
        args = parser.parse_args(argv)
        try:
            return cls(**vars(args))
        except ValueError as exc:
            parser.error(str(exc))
