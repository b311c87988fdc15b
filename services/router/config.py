"""Router configuration: the settings table of one router replica (``JETSERVE_ROUTER_*``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from services.router.load import DEFAULT_SETTLE_AFTER_S
from services.router.sessions import AFFINITY_MODES
from shared import kv_stream
from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S

ROUTER_MODES = ("round-robin", "random", "kv", "direct")
DEFAULT_KV_STREAM_MAX_AGE_S = kv_stream.DEFAULT_MAX_AGE_S
DEFAULT_KV_STREAM_MAX_BYTES = kv_stream.DEFAULT_MAX_BYTES


def _new_router_id() -> str:
    return f"router-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RouterConfig(CommonConfig):
    """One router replica."""

    SERVICE = "router"
    DESCRIPTION = "Route requests to workers."
    NO_ECHO = True  # its own decisions and worker-lost notices (it skips them anyway)

    router_mode: str = setting("round-robin", "Worker selection policy", choices=ROUTER_MODES)
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S,
        "Forget workers whose card is older than this (match the mocker's)",
        gt=0,
        aliases=("JETSERVE_WORKER_TTL_S",),
    )
    seed: int | None = setting(None, "Seed for random mode and tie-breaks (unset = from the OS)")
    router_id: str = computed_setting(
        _new_router_id,
        "This replica's id (empty = random)",
        default_doc="random",
        per_instance=True,
    )
    kv_overlap_score_weight: float = setting(
        1.0, "Weight of prefill blocks against decode blocks in the kv cost", ge=0
    )
    router_temperature: float = setting(
        0.0, "0 = lowest cost (random tie-break); > 0 = softmax sampling", ge=0
    )
    kv_events: bool = setting(
        True,
        "kv mode: index the workers' KV events (--no-kv-events = approximate: assume the "
        "chosen worker caches the prompt)",
    )
    inflight_overlap: bool = setting(
        True,
        "kv mode: a prefix that requests already routed to a worker are computing counts as "
        "cached there (--no-inflight-overlap = only the KV index counts, as Dynamo 1.6.1)",
    )
    router_ttl_s: float = setting(
        120.0,
        "Approximate mode: forget an assumed cached prompt this long after it was routed",
        gt=0,
        aliases=("JETSERVE_ROUTER_TTL_SECS",),
    )
    active_decode_blocks_threshold: float | None = setting(
        None,
        "Busy when used KV blocks / total exceeds this fraction (unset = off)",
        ge=0,
        le=1,
        aliases=("JETSERVE_ACTIVE_DECODE_BLOCKS_THRESHOLD",),
    )
    active_prefill_tokens_threshold: int | None = setting(
        None,
        "Busy when active prefill tokens exceed this count (unset = off)",
        ge=0,
        aliases=("JETSERVE_ACTIVE_PREFILL_TOKENS_THRESHOLD",),
    )
    active_prefill_tokens_threshold_frac: float | None = setting(
        None,
        "Busy when active prefill tokens exceed this fraction of the worker's KV capacity in "
        "tokens (its card's blocks x block size; unset = off)",
        ge=0,
        aliases=("JETSERVE_ACTIVE_PREFILL_TOKENS_THRESHOLD_FRAC",),
    )
    busy_status: int = setting(503, "HTTP status when all workers are busy", choices=(503, 529))
    busy_retry_after_s: float = setting(1.0, "Retry-After when all workers are busy", ge=0)
    load_stale_s: float = setting(
        5.0, "Ignore a worker's load report (and its busy mark) after this long"
    )
    request_ttl_s: float = setting(
        600.0, "Forget an active request whose end was never heard after this long", gt=0
    )
    queue_max_length: int = setting(
        1024,
        "Requests of one model that may wait in this router's queue when every worker is "
        "busy; one more is a 529 with Retry-After (0 = no queue: busy answers at once)",
        ge=0,
    )
    queue_max_wait_s: float = setting(
        30.0, "A queued request not routed after this long is a 529 with Retry-After", gt=0
    )
    fairness_window_s: float = setting(
        60.0,
        "Classes' served tokens (fair shares) and tenants' spent tokens count over this window "
        "(budgets are per minute: keep it at 60 with budgets)",
        gt=0,
    )
    ledger_interval_s: float = setting(
        0.2,
        "How often the router stores what it admitted in the admission stream (what a "
        "restarted or new router replays)",
        gt=0,
    )
    session_affinity_ttl_s: float = setting(
        0.0,
        "Keep a session's turns (X-Dynamo-Session-ID) on one worker, the binding shared by "
        "every router replica and forgotten this long after its last use (0 = off)",
        ge=0,
    )
    session_affinity_mode: str = setting(
        "soft",
        "hard = a session's turns go to its bound worker while it lives (a constraint); soft = "
        "while it lives and is under the busy thresholds, else the binding moves (a preference)",
        choices=AFFINITY_MODES,
    )
    load_settle_after_s: float = setting(
        DEFAULT_SETTLE_AFTER_S,
        "A worker's load report ends the requests counted on it beyond what it holds, once "
        "they are this old: ends lost in a bus outage stop weighing on it (0 = off)",
        ge=0,
    )
    snapshot_interval_s: float = setting(
        30.0, "The lease holder snapshots the KV index this often (0 = never)", ge=0
    )
    lease_ttl_s: float = setting(
        10.0, "Lifetime of the snapshot-writer and LoRA-placer leases", gt=0
    )
    lora_placement: bool = setting(
        True,
        "LoRA adapter placement: the replica holding the placer lease asks another worker to "
        "load an adapter whose requests outgrow its holders, and drops cold copies beyond a "
        "worker's --max-loras (off: requests go to the adapters' static holders only)",
    )
    lora_placement_interval_s: float = setting(
        1.0, "How often the LoRA placer looks at the adapters' demand", gt=0
    )
    lora_cooldown_s: float = setting(
        5.0, "An adapter the placer loaded or unloaded is left alone this long", ge=0
    )
    lora_min_inflight: float = setting(
        4.0,
        "An adapter gets another holder only when its requests in flight per holder exceed this...",
        ge=0,
    )
    lora_imbalance: float = setting(
        1.5,
        "...and its holders have more than this times the fleet's mean requests in flight per "
        "worker",
        ge=1,
    )
    kv_stream_max_age_s: float = setting(
        DEFAULT_KV_STREAM_MAX_AGE_S,
        "KV event stream retention by age",
        gt=0,
        aliases=("JETSERVE_KV_STREAM_MAX_AGE_S",),
    )
    kv_stream_max_bytes: int = setting(
        DEFAULT_KV_STREAM_MAX_BYTES,
        "KV event stream retention by size",
        ge=1,
        aliases=("JETSERVE_KV_STREAM_MAX_BYTES",),
    )
    dump_timeout_s: float = setting(2.0, "Wait this long for a worker's KV dump", gt=0)
    probe_interval_s: float = setting(
        0.25,
        "Probe the workers with requests in flight this often (NATS request to their ping "
        'subject; "no responders" = the worker is lost and its requests migrate)',
        gt=0,
    )
    probe_timeout_s: float = setting(1.0, "A probe without an answer after this long failed", gt=0)
    worker_unresponsive_s: float = setting(
        5.0, "A worker whose probes fail for this long is lost (hung, not only dead)", gt=0
    )
    router_conditional_disagg: bool = setting(
        False,
        "Disaggregated models: prefill on the decode worker itself when it would compute fewer "
        "than --disagg-min-prefill-tokens uncached prompt tokens, or already holds at least "
        "--disagg-local-overlap of the prompt",
    )
    disagg_min_prefill_tokens: int = setting(
        512,
        "Conditional disaggregation: a prefill of fewer uncached tokens than this stays on the "
        "decode worker",
        ge=0,
    )
    disagg_local_overlap: float = setting(
        0.5,
        "Conditional disaggregation: a decode worker holding at least this fraction of the "
        "prompt's blocks prefills it itself",
        ge=0,
        le=1,
    )
    enforce_disagg: bool = setting(
        False,
        "Disaggregated models: with no live prefill worker answer 503 instead of serving "
        "aggregated on a decode worker",
    )
    prefill_timeout_s: float = setting(
        120.0,
        "Disaggregated serving: a prefill worker's answer (KV computed and pinned) must come "
        "within this; then the prefill is tried on another prefill worker",
        gt=0,
    )
    catchup_timeout_s: float = setting(
        10.0, "At start, replay the KV stream at most this long before routing", ge=0
    )
