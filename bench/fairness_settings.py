"""``make bench-fairness``: the workload and server settings, the same for both systems."""

from __future__ import annotations

from dataclasses import dataclass

from bench.fairness_report import (
    GATEWAY,
)
from bench.side_by_side_report import DYNAMO, JETSERVE
from shared.model_dir import DEFAULT_MODEL_NAME

SYSTEMS = (JETSERVE, DYNAMO)
WORDS = (  # the words of every prompt, about one Qwen3 token each
    "the of and to in is was that for on with as by at from his her they this have had not are "
    "but were which one all been their has would there what when will more if no out so said can "
    "who about them time than into only some could new other then two these may any like first "
    "over such our even most made after also did many before must through back years where much"
)
REQUEST_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 90.0
DYNAMO_QUEUE_METRIC = "dynamo_frontend_router_queue_pending_requests"
JETSERVE_QUEUE_METRIC = "jetserve_router_queue_depth"
DYNAMO_SITES = (
    "not run: a Dynamo frontend embeds its router, so the gateway skew of its skewed run is "
    "already each router's ingress skew; read its skewed line"
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The workload and server set-up, the same for both systems."""

    workers: int = 2
    speedup: float = 1.0
    block_size: int = 16
    prompt_words: int = 4000
    max_tokens: int = 4
    concurrency: int = 16
    """Closed-loop clients per class."""
    premium_skew: float = 0.9
    regular_skew: float = 0.5
    busy_prefill_tokens: int = 8192
    """A worker is busy (requests queue) above this many active prefill tokens: the mocker's
    step budget (``max_num_batched_tokens`` 8192), about two prompts."""
    busy_decode_blocks: float | None = None
    """JetServe only: ``--router-active-decode-blocks-threshold`` (Dynamo's counterpart rejects
    instead of queueing)."""
    duration_s: float = 60.0
    warmup_s: float = 10.0
    pause_s: float = 2.0
    error_backoff_s: float = 0.2
    model_name: str = DEFAULT_MODEL_NAME
    jetserve_args: tuple[str, ...] = ()
    dynamo_frontend_args: tuple[str, ...] = ()
    sites_topology: str = GATEWAY
    """``sites``: how the two sites' NATS nodes are joined (``fairness_report.site_nodes``)."""
    kill_router_at_s: float | None = None
    """``sites``: SIGKILL site b's router this many seconds into the window."""


DEFAULTS = Settings()
