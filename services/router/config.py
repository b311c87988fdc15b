"""Router configuration: CLI flags, each falling back to a ``JETSERVE_ROUTER_*`` env var."""

from __future__ import annotations

import argparse
import uuid
from dataclasses import dataclass, field

from shared import kv_stream
from shared.config import CommonConfig, add_common_options, env, env_help
from shared.registry import DEFAULT_WORKER_TTL_S

ROUTER_MODES = ("round-robin", "random", "kv", "direct")
DEFAULT_KV_STREAM_MAX_AGE_S = kv_stream.DEFAULT_MAX_AGE_S
DEFAULT_KV_STREAM_MAX_BYTES = kv_stream.DEFAULT_MAX_BYTES


def _new_router_id() -> str:
    return f"router-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig(CommonConfig):
    """One router replica."""

    router_mode: str = "round-robin"
    worker_ttl_s: float = DEFAULT_WORKER_TTL_S
    """A worker whose card is older than this is no longer routed to."""
    seed: int | None = None
    """Seed for ``random`` mode and tie-breaking; ``None`` = from the OS."""
    router_id: str = field(default_factory=_new_router_id)
    kv_overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    kv_events: bool = True
    """False = ``--no-kv-events``: assume the chosen worker caches the prompt (approximate)."""
    inflight_overlap: bool = True
    """kv mode: a prefix that requests routed to a worker are computing counts as cached there
    (False = ``--no-inflight-overlap``: only the KV index counts, as Dynamo 1.6.1)."""
    router_ttl_secs: float = 120.0
    """Approximate mode: forget an assumed cached prompt this long after it was routed."""
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    busy_status: int = 503
    busy_retry_after_s: float = 1.0
    load_stale_s: float = 5.0
    """A worker's load report older than this no longer marks it busy."""
    request_ttl_s: float = 600.0
    """Forget an active request after this long if its end was never heard."""
    snapshot_interval_s: float = 30.0
    """How often the lease holder snapshots the KV index (0 = never)."""
    lease_ttl_s: float = 10.0
    kv_stream_max_age_s: float = DEFAULT_KV_STREAM_MAX_AGE_S
    kv_stream_max_bytes: int = DEFAULT_KV_STREAM_MAX_BYTES
    dump_timeout_s: float = 2.0
    catchup_timeout_s: float = 10.0
    """At start, wait at most this long to replay the KV event stream before routing."""

    def __post_init__(self) -> None:
        CommonConfig.__post_init__(self)
        if self.router_mode not in ROUTER_MODES:
            raise ValueError(f"--router-mode must be one of {', '.join(ROUTER_MODES)}")
        if self.worker_ttl_s <= 0:
            raise ValueError("--worker-ttl-s must be > 0")
        if self.kv_overlap_score_weight < 0:
            raise ValueError("--kv-overlap-score-weight must be >= 0")
        if self.router_temperature < 0:
            raise ValueError("--router-temperature must be >= 0")
        frac = self.active_decode_blocks_threshold
        if frac is not None and not 0.0 <= frac <= 1.0:
            raise ValueError("--active-decode-blocks-threshold must be between 0.0 and 1.0")
        tokens = self.active_prefill_tokens_threshold
        if tokens is not None and tokens < 0:
            raise ValueError("--active-prefill-tokens-threshold must be >= 0")
        if self.busy_status not in (503, 529):
            raise ValueError("--busy-status must be 503 or 529")
        if self.router_ttl_secs <= 0 or self.request_ttl_s <= 0 or self.lease_ttl_s <= 0:
            raise ValueError("--router-ttl-secs, --request-ttl-s and --lease-ttl-s must be > 0")

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
            "--no-kv-events",
            action="store_false",
            dest="kv_events",
            default=env("JETSERVE_ROUTER_KV_EVENTS", True),
            help=env_help(
                "Approximate kv mode: assume the chosen worker caches the prompt",
                "JETSERVE_ROUTER_KV_EVENTS",
            ),
        )
        parser.add_argument(
            "--no-inflight-overlap",
            action="store_false",
            dest="inflight_overlap",
            default=env("JETSERVE_ROUTER_INFLIGHT_OVERLAP", True),
            help=env_help(
                "kv mode: count only cached blocks as overlap, not a prefix that requests "
                "already routed to the worker are computing",
                "JETSERVE_ROUTER_INFLIGHT_OVERLAP",
            ),
        )
        parser.add_argument(
            "--busy-status",
            type=int,
            choices=(503, 529),
            default=env("JETSERVE_ROUTER_BUSY_STATUS", 503),
            help=env_help("HTTP status when all workers are busy", "JETSERVE_ROUTER_BUSY_STATUS"),
        )
        parser.add_argument(
            "--router-id",
            default=env("JETSERVE_ROUTER_ID", "") or _new_router_id(),
            help=env_help("This replica's id (unset = random)", "JETSERVE_ROUTER_ID"),
        )
        for flag, var, default, kind, text in _FLAGS:
            raw = env(var, "")
            value = kind(raw) if raw else default
            parser.add_argument(flag, type=kind, default=value, help=env_help(text, var))
        try:
            return cls(**vars(parser.parse_args(argv)))
        except ValueError as exc:
            parser.error(str(exc))


_FLAGS: tuple[tuple[str, str, float | int | None, type[float] | type[int], str], ...] = (
    ("--worker-ttl-s", "JETSERVE_WORKER_TTL_S", DEFAULT_WORKER_TTL_S, float,
     "Forget workers whose card is older than this"),
    ("--seed", "JETSERVE_ROUTER_SEED", None, int,
     "Seed for random mode and tie-breaks (unset = from the OS)"),
    ("--kv-overlap-score-weight", "JETSERVE_ROUTER_KV_OVERLAP_SCORE_WEIGHT", 1.0, float,
     "Weight of prefill blocks against decode blocks in the kv cost"),
    ("--router-temperature", "JETSERVE_ROUTER_TEMPERATURE", 0.0, float,
     "0 = lowest cost (random tie-break); > 0 = softmax sampling"),
    ("--router-ttl-secs", "JETSERVE_ROUTER_TTL_SECS", 120.0, float,
     "Approximate mode: forget an assumed cached prompt after this long"),
    ("--active-decode-blocks-threshold", "JETSERVE_ACTIVE_DECODE_BLOCKS_THRESHOLD", None, float,
     "Busy when used KV blocks / total exceeds this fraction (unset = off)"),
    ("--active-prefill-tokens-threshold", "JETSERVE_ACTIVE_PREFILL_TOKENS_THRESHOLD", None, int,
     "Busy when active prefill tokens exceed this count (unset = off)"),
    ("--busy-retry-after-s", "JETSERVE_ROUTER_BUSY_RETRY_AFTER_S", 1.0, float,
     "Retry-After when all workers are busy"),
    ("--load-stale-s", "JETSERVE_ROUTER_LOAD_STALE_S", 5.0, float,
     "Ignore a worker's load report (and its busy mark) after this long"),
    ("--request-ttl-s", "JETSERVE_ROUTER_REQUEST_TTL_S", 600.0, float,
     "Forget an active request whose end was never heard after this long"),
    ("--snapshot-interval-s", "JETSERVE_ROUTER_SNAPSHOT_INTERVAL_S", 30.0, float,
     "The lease holder snapshots the KV index this often (0 = never)"),
    ("--lease-ttl-s", "JETSERVE_ROUTER_LEASE_TTL_S", 10.0, float,
     "Snapshot-writer lease lifetime"),
    ("--kv-stream-max-age-s", "JETSERVE_KV_STREAM_MAX_AGE_S", DEFAULT_KV_STREAM_MAX_AGE_S, float,
     "KV event stream retention by age"),
    ("--kv-stream-max-bytes", "JETSERVE_KV_STREAM_MAX_BYTES", DEFAULT_KV_STREAM_MAX_BYTES, int,
     "KV event stream retention by size"),
    ("--dump-timeout-s", "JETSERVE_ROUTER_DUMP_TIMEOUT_S", 2.0, float,
     "Wait this long for a worker's KV dump"),
    ("--catchup-timeout-s", "JETSERVE_ROUTER_CATCHUP_TIMEOUT_S", 10.0, float,
     "At start, replay the KV stream at most this long before routing"),
)  # fmt: skip
"""Numeric flags: (flag, env var, default, type, help)."""
