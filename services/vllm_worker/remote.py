"""``RemoteVllmEngine``: JetServe's worker contract in front of an unmodified ``vllm serve``.

Requests go to its OpenAI completions endpoint, token ids both ways: ``POST /v1/completions``
with ``prompt`` a list of token ids, ``stream: true`` and ``return_token_ids: true`` (vLLM's
``CompletionRequest``; each streamed ``CompletionResponseStreamChoice`` then carries the delta's
``token_ids``, as ``completion_stream_generator`` in
``vllm/entrypoints/openai/serving_completion.py`` writes them since vLLM 0.10.2; read through the
code index, and at commit 2d5f987dff069848e428593c21df021d02d4282a for the older layout without
them, which the worker refuses). Cancelling closes the stream:
vLLM aborts a request whose client went away. Facts come from ``GET /v1/models``
(``max_model_len``) and ``GET /metrics`` (``vllm:cache_config_info``: block size, GPU blocks),
else the worker's settings; load from ``GET /metrics`` when ``metrics_interval_s`` > 0. KV
events, when ``kv_events_endpoint`` is set, come from the server's ZMQ publisher
(``--kv-events-config``) through the same relay as in-process, one feed per data-parallel rank.

Data parallelism (``dp_size`` > 1, the server's ``--data-parallel-size``): each request names its
rank in the ``X-data-parallel-rank`` header, which ``vllm serve`` passes to
``generate(data_parallel_rank=...)`` (``OpenAIServing._get_data_parallel_rank``), and rank r's KV
events come from the configured endpoints moved by r (``kv_endpoints``). Disaggregated serving
(the server started with ``--kv-transfer-config``) is what vLLM's proxy does over this same API
(``sampling``): a prefill is one non-streamed request with ``max_tokens`` 1 and the proxy's
``kv_transfer_params``, whose response's ``kv_transfer_params`` (``CompletionResponse``, set from
the final ``RequestOutput`` by ``request_output_to_completion_response`` in
``vllm/entrypoints/openai/completion/serving.py``, read at commit
030ea52effcb05071543c8c42b8f0145e94cee43) end the phase; a decode is the usual stream with the
prefill's ``kv_transfer_params`` in its body.

Agent requests (decision 028): what the server's vLLM can do is read from ``GET /version`` at
start (``sampling.features_for_version``). A thinking budget and reasoning-aware structured
output need the server started with ``--reasoning-parser`` (``qwen3``, ``deepseek_r1``: the
card's); without it vLLM refuses a budget (a 400 here) and constrains from the first token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx
import structlog

from services.vllm_worker.adapters import RemoteAdapters
from services.vllm_worker.engine import check_request
from services.vllm_worker.kv_endpoints import rank_sources
from services.vllm_worker.kv_feeds import FedEngine, KvFeeds
from services.vllm_worker.outputs import ChoiceDelta, DeltaTracker, logprobs_from_http
from services.vllm_worker.sampling import (
    ALL_FEATURES,
    cache_salt,
    completions_body,
    features_for_version,
)
from services.vllm_worker.stats import SchedulerSnapshot, parse_cache_config, parse_prometheus
from shared.hashing import salted_seed
from shared.messages import AnyKvEvent, BlockStored
from shared.worker.records import Emission, EngineError, EngineFacts, EngineInput, EngineLoad
from shared.worker.streaming import StreamingEngine

log = structlog.get_logger(__name__)

__all__ = [
    "DP_RANK_HEADER",
    "RemoteOptions",
    "RemoteVllmEngine",
    "cached_tokens",
    "chunk_deltas",
    "sse_data",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteOptions:
    """Where the server is and what the worker cannot ask it."""

    engine_url: str
    """``http://host:port`` of ``vllm serve`` (``/v1/...`` is appended)."""
    block_size: int
    kv_blocks: int
    max_num_seqs: int = 256
    model: str = ""
    """The served model name to ask for (empty: the first of ``/v1/models``)."""
    kv_events_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    kv_topic: str = ""
    metrics_interval_s: float = 0.0
    request_timeout_s: float = 600.0
    startup_timeout_s: float = 0.0
    """Wait this long for a server that is still loading (refusing connections, or 503)."""
    api_key: str | None = None
    dp_size: int = 1
    """The server's ``--data-parallel-size``."""


DP_RANK_HEADER = "X-data-parallel-rank"
"""The header ``vllm serve`` reads a request's data-parallel rank from."""


def sse_data(line: str) -> str | None:
    """The payload of an SSE ``data:`` line (None for any other line)."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


def chunk_deltas(chunk: dict[str, Any], logprobs: int | None) -> list[ChoiceDelta]:
    """A streamed completions chunk's choices as ``ChoiceDelta``s."""
    out = []
    for choice in chunk.get("choices") or ():
        if choice.get("token_ids") is None:
            raise RuntimeError(
                "vllm serve streamed a choice without token_ids: return_token_ids needs "
                "vLLM 0.10.2 or newer"
            )
        ids = tuple(int(t) for t in choice["token_ids"])
        out.append(
            ChoiceDelta(
                choice=int(choice.get("index", 0)),
                token_ids=ids,
                finish_reason=choice.get("finish_reason"),
                stop_reason=choice.get("stop_reason"),
                logprobs=(
                    logprobs_from_http(choice.get("logprobs"), logprobs)
                    if logprobs is not None
                    else ()
                ),
            )
        )
    return out


def cached_tokens(body: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` (0 when the server does not say)."""
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _error_message(body: bytes) -> str:
    try:
        parsed = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:500]
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            return str(error.get("message", error))
        return str(parsed.get("message", error))
    return str(parsed)


class RemoteVllmEngine(FedEngine, StreamingEngine):
    """One remote ``vllm serve`` behind one worker id."""

    def __init__(self, options: RemoteOptions, *, client: httpx.AsyncClient | None = None) -> None:
        super().__init__()
        self.options = options
        self._own_client = client is None
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
        self._client = client or httpx.AsyncClient(
            base_url=options.engine_url.rstrip("/"),
            timeout=httpx.Timeout(options.request_timeout_s, connect=10.0),
            # One connection per streaming request: never queue a request behind the pool.
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            headers=headers,
        )
        self.model = options.model
        self.features = ALL_FEATURES
        self.facts: EngineFacts | None = None
        self.scheduler = SchedulerSnapshot()
        self.feeds: KvFeeds | None = None
        self._poller: asyncio.Task[None] | None = None
        self._lora = RemoteAdapters(self._client)

    async def load_lora(self, name: str, path: str) -> None:
        """``vllm serve``'s ``/v1/load_lora_adapter`` (decision 031)."""
        await self._lora.load_lora(name, path)

    async def unload_lora(self, name: str) -> None:
        await self._lora.unload_lora(name)

    async def start(self) -> EngineFacts:
        """Ask the server for its model and start following its KV events (once: a started
        engine returns its facts again)."""
        if self.facts is not None:
            return self.facts
        response = await self._models()
        models = response.json().get("data") or []
        if not models:
            raise RuntimeError(f"{self.options.engine_url} serves no model")
        chosen = next((m for m in models if m.get("id") == self.model), None)
        if chosen is None:
            if self.model:
                names = [m.get("id") for m in models]
                url = self.options.engine_url
                raise RuntimeError(f"{url} does not serve {self.model!r}: {names}")
            chosen = models[0]
        self.model = str(chosen["id"])
        options = self.options
        block_size, kv_blocks = options.block_size, options.kv_blocks
        self.features = features_for_version(await self._version())
        geometry = await self._cache_config()
        if geometry is not None:
            if geometry[0] != block_size:
                log.warning("vllm_block_size_differs", setting=block_size, server=geometry[0])
            block_size, kv_blocks = geometry[0], kv_blocks or geometry[1]
        kv_events = options.kv_events_endpoint is not None
        self.facts = EngineFacts(
            kind="vllm-remote",
            block_size=block_size,
            kv_blocks=kv_blocks,
            max_num_seqs=options.max_num_seqs,
            context_length=int(chosen.get("max_model_len") or 0),
            kv_events=kv_events,
        )
        if options.kv_events_endpoint is not None:
            sources = rank_sources(
                options.kv_events_endpoint,
                options.kv_replay_endpoint,
                options.kv_topic,
                options.dp_size,
            )
            self.feeds = KvFeeds(sources, block_size=block_size, on_events=self._on_kv_events)
            await self.feeds.start()
        if options.metrics_interval_s > 0:
            self._poller = asyncio.create_task(self._poll_metrics(), name="vllm-remote-metrics")
        log.info("vllm_remote_connected", url=options.engine_url, model=self.model)
        return self.facts

    async def _models(self) -> httpx.Response:
        """``GET /v1/models``, waiting up to ``startup_timeout_s`` for a server still loading."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.startup_timeout_s
        while True:
            try:
                response = await self._client.get("/v1/models")
            except httpx.TransportError:
                if loop.time() >= deadline:
                    raise
            else:
                if response.status_code != 503 or loop.time() >= deadline:
                    response.raise_for_status()
                    return response
            log.info("vllm_remote_waiting", url=self.options.engine_url)
            await asyncio.sleep(1.0)

    async def _version(self) -> str | None:
        """The server's vLLM version (``GET /version``; None when it does not say)."""
        try:
            response = await self._client.get("/version")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            version = response.json().get("version")
        except (ValueError, AttributeError):
            return None
        return str(version) if version else None

    async def _cache_config(self) -> tuple[int, int] | None:
        """The server's ``(block_size, num_gpu_blocks)`` from its metrics, if it exports them."""
        try:
            response = await self._client.get("/metrics")
        except httpx.HTTPError:
            return None
        return parse_cache_config(response.text) if response.status_code == 200 else None

    def _on_kv_events(self, events: list[AnyKvEvent]) -> None:
        self.add_kv_events(events)

    async def _poll_metrics(self) -> None:
        while True:
            try:
                response = await self._client.get("/metrics")
                if response.status_code == 200:
                    parsed = parse_prometheus(response.text)
                    if parsed is not None:
                        running, waiting, usage = parsed
                        self.scheduler.update(running=running, waiting=waiting, kv_usage=usage)
            except httpx.HTTPError as exc:
                log.debug("vllm_metrics_unreachable", error=str(exc))
            await asyncio.sleep(self.options.metrics_interval_s)

    async def stop(self) -> None:
        await super().stop()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        if self.feeds is not None:
            await self.feeds.stop()
        if self._own_client:
            await self._client.aclose()

    def check(self, request: EngineInput) -> None:
        context_length = self.facts.context_length if self.facts is not None else 0
        check_request(request, context_length, self.options.dp_size)
        if request.images:  # decision 032: /v1/completions takes token ids, not images
            raise EngineError("images need the in-process vLLM engine (not --remote)")
        completions_body(
            request.token_ids,
            request.sampling,
            model=self.model,
            phase=request.phase,
            kv_transfer=request.kv_transfer_params,
            features=self.features,
        )

    def kv_dump(self, *, with_tokens: bool) -> list[BlockStored]:
        """The blocks vLLM reported and has not evicted, every rank's (none without KV
        events)."""
        return self.feeds.dump(with_tokens=with_tokens) if self.feeds is not None else []

    def kv_usage(self) -> tuple[int, int]:
        total = self.facts.kv_blocks if self.facts is not None else self.options.kv_blocks
        if not self.scheduler.seen:
            return 0, total
        return self.scheduler.used_blocks(total), total

    def load(self) -> EngineLoad:
        base = super().load()
        if not self.scheduler.seen:
            return base
        return EngineLoad(
            active=max(base.active, self.scheduler.running),
            waiting=base.waiting + self.scheduler.waiting,
            kv_used_blocks=base.kv_used_blocks,
            kv_total_blocks=base.kv_total_blocks,
            prefill_tokens=base.prefill_tokens,
        )

    async def abort(self, request_id: str) -> None:
        """Nothing to do: the stream is closed, and vLLM aborts a request whose client left."""

    async def stream(self, request: EngineInput) -> AsyncIterator[Emission]:
        sampling = request.sampling
        salt = cache_salt(request.hash_seed, salted_seed(lora_name=request.lora_name))
        model = request.lora_name or self.model  # vLLM serves a LoRA under its own name
        body = completions_body(
            request.token_ids,
            sampling,
            model=model,
            salt=salt,
            phase=request.phase,
            kv_transfer=request.kv_transfer_params,
            features=self.features,
        )
        if self.feeds is not None:
            self.feeds.hint(request)
        tracker = DeltaTracker(
            request.request_id,
            n=sampling.n,
            prompt_tokens=len(request.token_ids),
            resumed_tokens=request.resumed_tokens,
        )
        headers = {"X-Request-Id": request.request_id}
        if self.options.dp_size > 1:
            headers[DP_RANK_HEADER] = str(request.dp_rank)
        if request.phase == "prefill":
            for emission in await self._prefill(body, headers, tracker, sampling.logprobs):
                yield emission
            return
        async with self._client.stream(
            "POST", "/v1/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                _raise_for(response.status_code, await response.aread())
            async for line in response.aiter_lines():
                data = sse_data(line)
                if data is None or not data:
                    continue
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    raise RuntimeError(f"vllm serve failed the request: {chunk['error']}")
                for emission in tracker.emissions(chunk_deltas(chunk, sampling.logprobs)):
                    yield emission
                if tracker.done:
                    return
        raise RuntimeError("vllm serve ended the stream before the request finished")

    async def _prefill(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        tracker: DeltaTracker,
        logprobs: int | None,
    ) -> list[Emission]:
        """A prefill phase: one whole response, its ``kv_transfer_params`` on the last emission
        (none when the server's connector returned none, e.g. a prefill ended by EOS)."""
        response = await self._client.post("/v1/completions", json=body, headers=headers)
        if response.status_code != 200:
            _raise_for(response.status_code, response.content)
        answer = response.json()
        emissions = tracker.emissions(
            chunk_deltas(answer, logprobs), finished=True, cached_tokens=cached_tokens(answer)
        )
        params = answer.get("kv_transfer_params")
        if isinstance(params, dict) and params and emissions:
            emissions[-1] = dataclasses.replace(emissions[-1], kv_transfer_params=dict(params))
        return emissions


def _raise_for(status: int, body: bytes) -> NoReturn:
    """A refusal by the server: ``EngineError`` (a 400) for a 4xx, else a ``RuntimeError``."""
    message = _error_message(body)
    if 400 <= status < 500:
        raise EngineError(message)
    raise RuntimeError(f"vllm serve answered {status}: {message}")
