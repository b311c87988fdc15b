"""Build a real in-process vLLM engine: the only module that imports vllm.

``load_vllm`` makes an ``AsyncLLM`` (``vllm/v1/engine/async_llm.py``
``AsyncLLM.from_engine_args(engine_args, stat_loggers=...)``) from the worker's settings with
prefix caching on and KV events enabled (``vllm/config/kv_events.py`` ``KVEventsConfig``:
``enable_kv_cache_events``, ``publisher="zmq"``, ``endpoint``, ``replay_endpoint``, ``topic``)
on two IPC sockets in a private temporary directory (local to the host, no port to pick; vLLM's
``ZmqEventPublisher`` binds an ``ipc://`` endpoint). A stat logger (``vllm/v1/metrics/
loggers.py`` ``StatLoggerBase``) copies the scheduler's stats into the handle's
``SchedulerSnapshot``. The engine's facts (block size, GPU blocks, context length, batch size)
are read from its ``vllm_config`` once it has loaded.

Agent requests (decision 028): the engine gets the card's reasoning parser
(``AsyncEngineArgs(reasoning_parser=...)``, as ``vllm serve --reasoning-parser``), which gives it
a ``ReasoningConfig`` (``thinking_token_budget`` needs one) and makes structured outputs start
after the reasoning block (``StructuredOutputsConfig.reasoning_parser``). ``features`` reads what
the installed vLLM can do: ``SamplingParams.thinking_token_budget`` (vLLM 0.20+) and
``StructuredOutputsParams.structural_tag`` with xgrammar's ``format`` tags
(``xgrammar.structural_tag.TagsWithSeparatorFormat``, xgrammar 0.1.25+).

Like ``vllm serve``, the engine is built on the event loop (vLLM's client sockets belong to
it); a worker is not registered while its engine loads.

Disaggregated serving and data parallelism go to the engine arguments as ``vllm serve`` takes
them: ``kv_transfer_config`` (``vllm/config/kv_transfer.py`` ``KVTransferConfig``, from
``--kv-transfer-config``) and ``data_parallel_size`` (one ``AsyncLLM`` fronting every rank, its
internal load balancer bypassed per request by ``generate(data_parallel_rank=...)``). With more
than one rank the KV events use loopback TCP ports instead of IPC sockets: vLLM moves each rank's
endpoints by the rank (``kv_endpoints.offset_endpoint``), which it cannot do to an ``ipc://`` path.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import structlog
import vllm
from vllm import SamplingParams
from vllm.config import KVEventsConfig, KVTransferConfig
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.engine import VllmHandle
from services.vllm_worker.kv_endpoints import KvSource, loopback_sources
from services.vllm_worker.sampling import VllmFeatures
from services.vllm_worker.stats import SchedulerSnapshot
from shared.worker.records import EngineFacts

log = structlog.get_logger(__name__)

__all__ = ["KV_TOPIC", "features", "load_vllm", "make_sampling_params"]

KV_TOPIC = "kv"


def make_sampling_params(kwargs: dict[str, Any]) -> Any:
    """``sampling.engine_kwargs`` → ``vllm.SamplingParams`` (vLLM validates it)."""
    values = dict(kwargs)
    kind = values.pop("output_kind", None)
    if kind is not None:
        values["output_kind"] = RequestOutputKind[kind]
    structured = values.pop("structured_outputs", None)
    if structured is not None:
        values["structured_outputs"] = StructuredOutputsParams(**structured)
    return SamplingParams(**values)


def features() -> VllmFeatures:
    """What the installed vLLM can do for agent requests."""
    budget = "thinking_token_budget" in getattr(SamplingParams, "__struct_fields__", ())
    tag_field = any(f.name == "structural_tag" for f in dataclasses.fields(StructuredOutputsParams))
    try:
        tags = hasattr(
            importlib.import_module("xgrammar.structural_tag"), "TagsWithSeparatorFormat"
        )
    except ImportError:
        tags = False
    return VllmFeatures(
        tool_tags=tag_field and tags,
        thinking_budget=budget,
        version=str(getattr(vllm, "__version__", "")),
    )


def _snapshot_logger(snapshot: SchedulerSnapshot) -> Any:
    """A stat logger factory (``(vllm_config, engine_index) -> StatLoggerBase``)."""

    class SnapshotLogger(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is None:
                return
            usage: Any = getattr(scheduler_stats, "kv_cache_usage", None)
            if usage is None:
                usage = getattr(scheduler_stats, "gpu_cache_usage", 0.0)
            snapshot.update(
                running=int(scheduler_stats.num_running_reqs),
                waiting=int(scheduler_stats.num_waiting_reqs),
                kv_usage=float(usage),
                engine=engine_idx,
            )

        def log_engine_initialized(self) -> None:
            return

    return SnapshotLogger


async def load_vllm(config: VllmWorkerConfig, worker_id: str) -> VllmHandle:
    """Load the model and start the engine (minutes on a GPU)."""
    model = config.vllm_model or str(config.resolved_model_dir())
    sockets = Path(tempfile.mkdtemp(prefix="jetserve-vllm-"))
    dp_size = config.data_parallel_size
    if dp_size > 1:
        endpoint, replay, sources = loopback_sources(dp_size, KV_TOPIC)
    else:
        endpoint = f"ipc://{sockets}/kv.sock"
        replay = f"ipc://{sockets}/kv-replay.sock"
        sources = (KvSource(endpoint=endpoint, replay_endpoint=replay, topic=KV_TOPIC),)
    kv_transfer = config.kv_transfer()
    snapshot = SchedulerSnapshot()
    reasoning = config.parsers()[1]
    extra: dict[str, Any] = {"reasoning_parser": reasoning} if reasoning else {}
    has_lora = bool(config.adapters())  # decision 031: LoRA only when adapters are configured
    if has_lora:
        extra.update(enable_lora=True, max_loras=config.max_loras)
    args = AsyncEngineArgs(
        model=model,
        served_model_name=[config.model_name],
        block_size=config.block_size,
        enable_prefix_caching=True,
        max_num_seqs=config.max_num_seqs,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len or None,
        tensor_parallel_size=config.tensor_parallel_size,
        data_parallel_size=dp_size,
        kv_transfer_config=KVTransferConfig(**kv_transfer) if kv_transfer is not None else None,
        dtype=config.dtype,
        enforce_eager=config.enforce_eager,
        kv_events_config=KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=endpoint,
            replay_endpoint=replay,
            topic=KV_TOPIC,
        ),
        **extra,
    )
    log.info(
        "vllm_loading",
        worker_id=worker_id,
        model=model,
        role=config.role,
        dp_size=dp_size,
        kv_connector=kv_transfer.get("kv_connector") if kv_transfer is not None else None,
        reasoning_parser=reasoning or None,
    )
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[_snapshot_logger(snapshot)])
    vllm_config = engine.vllm_config
    block_size = int(vllm_config.cache_config.block_size)
    if block_size != config.block_size:
        log.warning("vllm_block_size_changed", asked=config.block_size, actual=block_size)
    facts = EngineFacts(
        kind="vllm",
        block_size=block_size,
        kv_blocks=int(vllm_config.cache_config.num_gpu_blocks or 0),
        max_num_seqs=int(vllm_config.scheduler_config.max_num_seqs),
        context_length=int(vllm_config.model_config.max_model_len),
        kv_pin_timeout_s=config.kv_pin_timeout_s(),
    )

    async def shutdown() -> None:
        engine.shutdown()
        shutil.rmtree(sockets, ignore_errors=True)

    return VllmHandle(
        client=engine,
        facts=facts,
        make_sampling_params=make_sampling_params,
        kv_sources=sources,
        dp_size=dp_size,
        scheduler=snapshot,
        shutdown=shutdown,
        features=features(),
        make_lora=LoRARequest if has_lora else None,
        max_loras=config.max_loras if has_lora else 0,
    )
