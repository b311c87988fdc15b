"""Router configuration: CLI flags, each falling back to a ``JETSERVE_ROUTER_*`` env var."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from shared.config import CommonConfig, add_common_options, env, env_help
from shared.registry import DEFAULT_WORKER_TTL_S

ROUTER_MODES = ("round-robin", "random")
"""Implemented modes; ``kv`` arrives with KV-aware routing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig(CommonConfig):
    """One router replica."""

    router_mode: str = "round-robin"
    worker_ttl_s: float = DEFAULT_WORKER_TTL_S
    """A worker whose card is older than this is no longer routed to."""
    seed: int | None = None
    """Seed for ``random`` mode; ``None`` = from the OS."""

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.router_mode not in ROUTER_MODES:
            raise ValueError(f"--router-mode must be one of {', '.join(ROUTER_MODES)}")
        if self.worker_ttl_s <= 0:
            raise ValueError("--worker-ttl-s must be > 0")

    @classmethod
    def from_cli(cls, argv: list[str] | None = None) -> RouterConfig:
        parser = argparse.ArgumentParser(
            prog="python -m services.router", description="Route requests to workers."
        )
        add_common_options(parser, service="router")
        parser.add_argument(
            "--router-mode",
            choices=ROUTER_MODES,
            default=env("JETSERVE_ROUTER_MODE", "round-robin"),
            help=env_help("Worker selection policy", "JETSERVE_ROUTER_MODE"),
        )
        parser.add_argument(
            "--worker-ttl-s",
            type=float,
            default=env("JETSERVE_WORKER_TTL_S", DEFAULT_WORKER_TTL_S),
            help=env_help("Forget workers whose card is older than this", "JETSERVE_WORKER_TTL_S"),
        )
        seed = env("JETSERVE_ROUTER_SEED", "")
        parser.add_argument(
            "--seed",
            type=int,
            default=int(seed) if seed else None,
            help=env_help("Seed for random mode (unset = from the OS)", "JETSERVE_ROUTER_SEED"),
        )
        try:
            return cls(**vars(parser.parse_args(argv)))
        except ValueError as exc:
            parser.error(str(exc))
