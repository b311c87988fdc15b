"""Fakes of vLLM that follow its interfaces exactly, for tests that run without vLLM or a GPU.

Each fake names the vLLM source it follows (read through the code index; commits below):

- ``FakeAsyncLLM``: ``vllm/v1/engine/async_llm.py`` ``AsyncLLM.generate(prompt,
  sampling_params, request_id, *, lora_request=...)`` (an async generator of
  ``RequestOutput``; the prompt a ``TokensPrompt`` dict ``{"prompt_token_ids", "cache_salt"}``
  from ``vllm/inputs/data.py``) and ``AsyncLLM.abort(request_id: str | Iterable[str])``; outputs
  follow ``vllm/outputs.py`` ``RequestOutput`` / ``CompletionOutput`` (commit
  003d3ee22261b7937258b7531aee00e10393f1d6) with ``RequestOutputKind.DELTA`` semantics
  (``vllm/sampling_params.py``, commit 00388f6573ccfcffad607b8c9ecdf341a4669ceb): each output
  carries only the new ``token_ids``; a stop token id is in the output and named by
  ``stop_reason``, EOS is in the output with ``stop_reason=None``; an aborted request ends with
  ``finish_reason="abort"``. Its prefix cache stores full blocks (prompt, then generated) and
  publishes ``BlockStored``/``BlockRemoved`` like vLLM's ``KVCacheManager`` with prefix caching.
  ``generate`` takes ``data_parallel_rank`` (commit 00080ee13c7a451fce071ccb8d0e94d395acf5a7)
  and records it. With a ``FakeNixl``, a request whose ``SamplingParams.extra_args`` carries
  ``kv_transfer_params`` behaves as under vLLM's ``NixlConnector``
  (``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``, commit
  002a1057e9ae674d7bdc9c4be95bc29d65d2e808): ``do_remote_decode`` keeps the finished request's
  blocks and, only when it finished at its token limit (``FINISHED_LENGTH_CAPPED``), returns the
  params of ``NixlConnectorScheduler.request_finished`` on its last output;
  ``do_remote_prefill`` with ``remote_block_ids`` and the four ``remote_*`` fields reads the
  blocks of the prompt not cached locally (``get_num_new_matched_tokens``) and frees them on the
  prefill side (the read notification), then decodes as usual; the dict is marked
  ``do_remote_prefill=False`` as the connector marks it. ``FakeCompletionOutput`` carries
  ``kv_transfer_params`` and ``FakeRequestOutput.kv_transfer_params`` is the property of
  ``vllm/outputs.py`` at commit 003d3ee.
- ``FakeDpAsyncLLM``: an ``AsyncLLM`` with ``data_parallel_size`` > 1: one ``FakeAsyncLLM`` per
  rank (its own cache and publisher, as each of vLLM's engine cores), ``generate`` going to
  ``data_parallel_rank`` (out of range: ``ValueError``, as ``InputProcessor.process_inputs``) or,
  without one, to the least busy rank (the internal load balancer).
- ``FakeSamplingParams``: the ``vllm.SamplingParams`` fields the worker sets (an unknown keyword
  is a ``TypeError``, as for the real struct), ``extra_args`` included.
- ``FakeKvPublisher``: ``vllm/distributed/kv_events.py`` ``ZmqEventPublisher`` — a PUB socket
  sending ``(topic, seq.to_bytes(8, "big"), msgpack(KVEventBatch))`` from a background thread,
  a ``deque`` replay buffer, and a ROUTER replay socket answering ``(identity, b"", start_seq)``
  with ``(identity, b"", topic, seq, payload)`` per buffered batch then ``(identity, b"", b"",
  END_SEQ, b"")`` (vLLM 0.33.0's ``_service_replay``, seen in the installed package by
  ``make test-vllm``; ``replay_topic=False``: the earlier ``(identity, b"", seq, payload)``).
  ``data_parallel_rank`` moves the endpoints given (``ZmqEventPublisher.offset_endpoint_port``)
  and is put in every batch, as for each rank of a data-parallel engine; a given endpoint is
  bound or connected to as ``_socket_setup`` decides (bound: ``*``, ``::``, ``ipc://``,
  ``inproc://``).
  ``layout="array"`` encodes the structs as vLLM did with ``array_like=True`` (commit
  b4e69e0af33f4698e157a262cc787fe61983cd3d, field order of vLLM 0.11+ with ``medium``,
  ``lora_name``, ``extra_keys``); ``layout="map"`` as after vLLM PR #42892 (commit
  0181ea3173e53eea8cf04a86891488e3dc89bb34: maps tagged ``type``).
- ``FakeVllmServer``: ``vllm serve``'s OpenAI server on a real socket (uvicorn, 127.0.0.1,
  port 0): ``GET /v1/models`` (``ModelCard`` with ``max_model_len``), streaming ``POST
  /v1/completions`` as ``completion_stream_generator`` in
  ``vllm/entrypoints/openai/serving_completion.py`` writes it (``CompletionStreamResponse``
  chunks; ``prompt_token_ids`` on a choice's first chunk and ``token_ids`` per delta with
  ``return_token_ids``; logprobs keyed ``token_id:<id>`` with ``return_tokens_as_token_ids``;
  a final usage chunk with ``prompt_tokens_details.cached_tokens``; ``data: [DONE]``), a
  non-streamed ``CompletionResponse`` with its ``kv_transfer_params`` (``stream: false``;
  ``stream_options`` without ``stream`` refused as ``CompletionRequest`` refuses it), the
  request's ``kv_transfer_params`` into ``SamplingParams.extra_args`` and its
  ``X-data-parallel-rank`` header into ``generate(data_parallel_rank=...)``, errors
  as ``{"error": {"message", "type", "param", "code"}}``, and ``GET /metrics`` (the
  ``vllm:num_requests_running`` / ``_waiting`` / ``kv_cache_usage_perc`` gauges and the
  ``vllm:cache_config_info`` info gauge of ``vllm/v1/metrics/loggers.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec
import uvicorn
import zmq

from services.vllm_worker.engine import VllmEngine, VllmHandle
from services.vllm_worker.kv_endpoints import KvSource, offset_endpoint
from services.vllm_worker.remote import RemoteOptions, RemoteVllmEngine
from services.vllm_worker.stats import SchedulerSnapshot
from shared.worker.records import EngineFacts
from tests.support import eventually_async

__all__ = [
    "FakeAsyncLLM",
    "FakeCompletionOutput",
    "FakeKvPublisher",
    "FakeLogprob",
    "FakeRequestOutput",
    "FakeSamplingParams",
    "FakeStack",
    "FakeVllmServer",
    "KvPublisher",
    "fake_inprocess_engine",
    "fake_inprocess_stack",
    "fake_remote_engine",
    "fake_remote_stack",
    "inprocess_engine",
    "remote_engine",
]

EOS = 2
END_SEQ = (-1).to_bytes(8, "big", signed=True)


# --- vllm/outputs.py, vllm/logprobs.py ----------------------------------------------------------


@dataclass
class FakeLogprob:
    """``vllm.logprobs.Logprob``."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FakeCompletionOutput:
    """``vllm.outputs.CompletionOutput``."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: Any = None
    kv_transfer_params: dict[str, Any] | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


class FakeRequestOutput:
    """``vllm.outputs.RequestOutput`` (same constructor)."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int] | None,
        prompt_logprobs: Any,
        outputs: list[FakeCompletionOutput],
        finished: bool,
        metrics: Any = None,
        lora_request: Any = None,
        encoder_prompt: str | None = None,
        encoder_prompt_token_ids: list[int] | None = None,
        num_cached_tokens: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.prompt_logprobs = prompt_logprobs
        self.outputs = outputs
        self.finished = finished
        self.metrics = metrics
        self.lora_request = lora_request
        self.encoder_prompt = encoder_prompt
        self.encoder_prompt_token_ids = encoder_prompt_token_ids
        self.num_cached_tokens = num_cached_tokens
        self.kv_transfer_params_list = [
            o.kv_transfer_params for o in outputs if o.kv_transfer_params
        ]

    @property
    def kv_transfer_params(self) -> dict[str, Any] | list[dict[str, Any]] | None:
        if len(self.kv_transfer_params_list) == 1:
            return self.kv_transfer_params_list[0]
        return self.kv_transfer_params_list or None


# --- vllm/sampling_params.py --------------------------------------------------------------------


@dataclass(kw_only=True)
class FakeSamplingParams:
    """The ``vllm.SamplingParams`` fields the worker sets (defaults as vLLM's)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    output_kind: str = "CUMULATIVE"
    structured_outputs: dict[str, Any] | None = None
    logit_bias: dict[int, float] | None = None
    extra_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.structured_outputs is not None:
            kinds = [k for k in ("json", "json_object") if self.structured_outputs.get(k)]
            if len(kinds) != 1:
                raise ValueError("You must use one kind of structured outputs constraint")


def fake_sampling_params(kwargs: dict[str, Any]) -> FakeSamplingParams:
    """What ``loader.make_sampling_params`` does, without vllm."""
    return FakeSamplingParams(**kwargs)


# --- vllm/distributed/kv_events.py ---------------------------------------------------------------


class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _ArrayStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class _ArrayRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None


class _ArrayCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _MapBatch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _MapStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None


class _MapRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _MapCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


@dataclass(frozen=True)
class Stored:
    """A ``BlockStored`` to publish (layout-independent)."""

    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = "GPU"
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


@dataclass(frozen=True)
class Removed:
    block_hashes: list[int | bytes]
    medium: str | None = "GPU"
    group_idx: int | None = None


@dataclass(frozen=True)
class Cleared:
    pass


FakeEvent = Stored | Removed | Cleared


def encode_batch(
    events: Iterable[FakeEvent],
    layout: Literal["array", "map"],
    ts: float = 0.0,
    data_parallel_rank: int = 0,
) -> bytes:
    """The msgpack payload vLLM's publisher sends for these events."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, Stored):
            if layout == "array":
                out.append(
                    _ArrayStored(
                        e.block_hashes,
                        e.parent_block_hash,
                        e.token_ids,
                        e.block_size,
                        None,
                        e.medium,
                        e.lora_name,
                        e.extra_keys,
                    )
                )
            else:
                out.append(
                    _MapStored(
                        e.block_hashes,
                        e.parent_block_hash,
                        e.token_ids,
                        e.block_size,
                        None,
                        e.medium,
                        e.lora_name,
                        e.extra_keys,
                        e.group_idx,
                        "full_attention" if e.group_idx is not None else None,
                    )
                )
        elif isinstance(e, Removed):
            if layout == "array":
                out.append(_ArrayRemoved(e.block_hashes, e.medium))
            else:
                out.append(_MapRemoved(e.block_hashes, e.medium, e.group_idx))
        else:
            out.append(_ArrayCleared() if layout == "array" else _MapCleared())
    rank = data_parallel_rank
    batch: Any = _ArrayBatch(ts, out, rank) if layout == "array" else _MapBatch(ts, out, rank)
    return msgspec.msgpack.encode(batch)


class KvPublisher(Protocol):
    """What ``FakeAsyncLLM``, the engine builders and ``until_subscribed`` use of a publisher:
    ``FakeKvPublisher`` here, vLLM's own ``ZmqEventPublisher`` behind
    ``tests/vllm_real/real_publisher.py``'s ``RealKvPublisher`` in ``make test-vllm``."""

    @property
    def endpoint(self) -> str: ...

    @property
    def replay_endpoint(self) -> str | None: ...

    @property
    def topic(self) -> str: ...

    @property
    def layout(self) -> Literal["array", "map"]: ...

    def publish(self, events: Iterable[FakeEvent]) -> None: ...

    def publish_empty(self) -> None:
        """A batch without events (``until_subscribed``'s probe)."""

    def shutdown(self) -> None: ...


class FakeKvPublisher:
    """``ZmqEventPublisher`` on loopback TCP ports the OS picks (see the module docstring)."""

    def __init__(
        self,
        *,
        layout: Literal["array", "map"] = "array",
        topic: str = "kv",
        buffer_steps: int = 10_000,
        replay: bool = True,
        replay_topic: bool = True,
        endpoint: str | None = None,
        replay_endpoint: str | None = None,
        data_parallel_rank: int = 0,
    ) -> None:
        """``replay_topic``: replay replies carry the topic, as vLLM 0.33's do. ``endpoint`` /
        ``replay_endpoint``: bind these, moved for ``data_parallel_rank`` (None: ports the OS
        picks on 127.0.0.1)."""
        self.layout = layout
        self.topic = topic
        self.replay_topic = replay_topic
        self.data_parallel_rank = data_parallel_rank
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint: str | None = None
        self._replay: zmq.Socket[bytes] | None = None
        try:
            if endpoint is None:
                port = self._pub.bind_to_random_port("tcp://127.0.0.1")
                self.endpoint = f"tcp://127.0.0.1:{port}"
            else:
                # ZmqEventPublisher._socket_setup: bind a wildcard, IPC or inproc endpoint, else
                # connect (to a subscriber that binds)
                self.endpoint = offset_endpoint(endpoint, data_parallel_rank)
                wildcard = "*" in self.endpoint or "::" in self.endpoint
                if wildcard or self.endpoint.startswith(("ipc://", "inproc://")):
                    self._pub.bind(self.endpoint)
                else:
                    self._pub.connect(self.endpoint)
            if replay:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                if replay_endpoint is None:
                    rport = self._replay.bind_to_random_port("tcp://127.0.0.1")
                    self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
                else:
                    self.replay_endpoint = offset_endpoint(replay_endpoint, data_parallel_rank)
                    self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError:  # a port taken meanwhile: close what was opened (no context left)
            self._pub.close()
            if self._replay is not None:
                self._replay.close()
            self._ctx.term()
            raise
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[tuple[bytes, bool] | None] = queue.Queue()
        self._seq = itertools.count()
        self._running = True
        self.published = 0
        self.replay_requests: list[int] = []
        self._drop = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="fake-kv-publisher")
        self._thread.start()

    def drop_next(self, count: int) -> None:
        """The next ``count`` batches are buffered for replay but never sent (a lost message)."""
        self._drop += count

    def publish(self, events: Iterable[FakeEvent]) -> None:
        events = list(events)
        if not events:
            return
        drop = self._drop > 0
        if drop:
            self._drop -= 1
        payload = encode_batch(events, self.layout, time.time(), self.data_parallel_rank)
        self._queue.put((payload, drop))

    def publish_raw(self, payload: bytes) -> None:
        """A payload as is (a malformed batch, for tests)."""
        self._queue.put((payload, False))

    def publish_empty(self) -> None:
        """A batch without events."""
        self.publish_raw(encode_batch([], self.layout, 0.0, self.data_parallel_rank))

    def shutdown(self) -> None:
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def _loop(self) -> None:
        while self._running or not self._queue.empty():
            if self._replay is not None and self._replay.poll(0):
                self._service_replay()
            try:
                item = self._queue.get(timeout=0.01)
            except queue.Empty:
                continue
            if item is None:
                break
            payload, drop = item
            seq = next(self._seq)
            if not drop:
                self._pub.send_multipart((self.topic.encode(), seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self.published += 1

    def _service_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        self.replay_requests.append(start_seq)
        for seq, payload in self._buffer:
            if seq >= start_seq:
                self._replay.send_multipart(
                    self._replay_reply(client, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart(self._replay_reply(client, END_SEQ, b"", end=True))

    def _replay_reply(
        self, client: bytes, seq: bytes, payload: bytes, *, end: bool = False
    ) -> tuple[bytes, ...]:
        """vLLM 0.33's ``_service_replay`` sends the topic too (``(client, b"", topic, seq,
        payload)``, end ``(client, b"", b"", END_SEQ, b"")``); earlier releases did not."""
        if not self.replay_topic:
            return (client, b"", seq, payload)
        return (client, b"", b"" if end else self.topic.encode(), seq, payload)


# --- vllm/v1/engine/async_llm.py -----------------------------------------------------------------


@dataclass
class _Block:
    parent: int | bytes | None
    tokens: tuple[int, ...]


@dataclass
class FakeNixl:
    """What vLLM's ``NixlConnector`` moves between engines, kept in one place: the blocks each
    prefill keeps for a remote decode (until read or aborted) and every read a decode did.
    ``side_channel_host``/``side_channel_port``: ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``'s
    defaults; a rank's port is the base plus its data-parallel rank (``NixlConnectorScheduler``)."""

    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    kept: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """``(remote_engine_id, remote_request_id)`` → the blocks kept for a decode."""
    reads: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    """``(decode request id, kv_transfer_params as received, prompt tokens read)``."""
    failed_reads: list[str] = field(default_factory=list)
    """Decode requests whose blocks were gone (vLLM then recomputes them locally)."""

    def finished_prefill(
        self, llm: FakeAsyncLLM, request_id: str, prompt_len: int, length_capped: bool
    ) -> dict[str, Any] | None:
        """``NixlConnectorScheduler.request_finished`` for a ``do_remote_decode`` request."""
        if not length_capped:
            return None  # e.g. EOS: the blocks are freed at once, nothing to read
        blocks = list(range(-(-prompt_len // llm.block_size)))
        self.kept[(llm.engine_id, request_id)] = blocks
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": blocks,
            "remote_engine_id": llm.engine_id,
            "remote_request_id": request_id,
            "remote_host": self.side_channel_host,
            "remote_port": self.side_channel_port + llm.dp_rank,
            "tp_size": 1,
        }

    def read(self, request_id: str, params: dict[str, Any], tokens: int) -> None:
        """A decode reads the prompt's blocks (``tokens`` of them not cached locally) and
        notifies the prefill side, which frees them."""
        key = (params["remote_engine_id"], params["remote_request_id"])
        if self.kept.pop(key, None) is None:
            self.failed_reads.append(request_id)
            return
        self.reads.append((request_id, dict(params), tokens))


_REMOTE_FIELDS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")


@dataclass
class FakeAsyncLLM:
    """``AsyncLLM`` with deterministic tokens and a prefix cache (see the module docstring)."""

    block_size: int = 16
    num_gpu_blocks: int = 64
    max_model_len: int = 4096
    max_num_seqs: int = 8
    vocab: int = 1000
    eos_after: int | None = None
    """Emit EOS as this (1-based) token of each choice (None: never)."""
    step_s: float = 0.0
    publisher: KvPublisher | None = None
    hash_kind: Literal["int", "bytes"] = "int"
    extra_keys: bool = True
    """Send the cache salt in the first block's ``extra_keys`` (vLLM 0.11+)."""
    aborted: set[str] = field(default_factory=set)
    abort_calls: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    requests: list[tuple[str, dict[str, Any], FakeSamplingParams]] = field(default_factory=list)
    dp_ranks: list[int | None] = field(default_factory=list)
    """Each request's ``data_parallel_rank`` argument, in order."""
    cache: OrderedDict[int | bytes, _Block] = field(default_factory=OrderedDict)
    scheduler: SchedulerSnapshot = field(default_factory=SchedulerSnapshot)
    nixl: FakeNixl | None = None
    """The KV connector (None: no ``--kv-transfer-config``; ``kv_transfer_params`` ignored)."""
    engine_id: str = "fake-engine"
    """``KVTransferConfig.engine_id``."""
    dp_rank: int = 0
    """This engine core's data-parallel rank (``FakeDpAsyncLLM``)."""

    def _hash(self, parent: int | bytes | None, tokens: tuple[int, ...], extra: Any) -> int | bytes:
        digest = hashlib.sha256(repr((parent, tokens, extra)).encode()).digest()
        if self.hash_kind == "bytes":
            return digest
        return int.from_bytes(digest[:8], "big")

    def _store(self, tokens: list[int], salt: str | None, lora: str | None) -> int:
        """Cache the full blocks of ``tokens``; how many were already cached."""
        bs = self.block_size
        parent: int | bytes | None = None
        hits = 0
        new_hashes: list[int | bytes] = []
        new_tokens: list[int] = []
        first_parent: int | bytes | None = None
        first_extra: list[tuple[Any, ...] | None] | None = None
        for i in range(len(tokens) // bs):
            block = tuple(tokens[i * bs : (i + 1) * bs])
            extra = (salt,) if i == 0 and salt else None
            h = self._hash(parent, block, (extra, lora))
            if h in self.cache and not new_hashes:
                hits += 1
                self.cache.move_to_end(h)
            else:
                if not new_hashes:
                    first_parent = parent
                    first_extra = []
                new_hashes.append(h)
                new_tokens.extend(block)
                assert first_extra is not None
                first_extra.append(extra if self.extra_keys else None)
                self.cache[h] = _Block(parent, block)
            parent = h
        events: list[FakeEvent] = []
        if new_hashes:
            events.append(
                Stored(
                    block_hashes=new_hashes,
                    parent_block_hash=first_parent,
                    token_ids=new_tokens,
                    block_size=bs,
                    lora_name=lora,
                    extra_keys=first_extra if self.extra_keys else None,
                )
            )
        evicted: list[int | bytes] = []
        while len(self.cache) > self.num_gpu_blocks:
            h, _ = self.cache.popitem(last=False)
            evicted.append(h)
        if evicted:
            events.append(Removed(block_hashes=evicted))
        if self.publisher is not None:
            self.publisher.publish(events)
        return hits

    def reset_prefix_cache(self) -> None:
        self.cache.clear()
        if self.publisher is not None:
            self.publisher.publish([Cleared()])

    def _token(self, prompt: list[int], params: FakeSamplingParams, choice: int, i: int) -> int:
        base = params.seed if params.seed is not None else sum(prompt)
        return 3 + (base * 31 + i * 7 + choice * 13) % (self.vocab - 3)

    def _logprobs(self, token: int, k: int) -> dict[int, FakeLogprob]:
        out = {token: FakeLogprob(-0.25, rank=1)}
        for j in range(1, k):
            out[(token + j) % self.vocab] = FakeLogprob(-0.25 - j, rank=j + 1)
        return out

    async def generate(
        self,
        prompt: Any,
        sampling_params: FakeSamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[FakeRequestOutput, None]:
        params = sampling_params
        # A string here, a ``RequestOutputKind`` member from a real ``vllm.SamplingParams``.
        if getattr(params.output_kind, "name", params.output_kind) != "DELTA":
            raise AssertionError("the worker asks for RequestOutputKind.DELTA")
        if params.detokenize:
            raise AssertionError("the worker detokenizes itself")
        ids = list(prompt["prompt_token_ids"])
        if not ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                f"length of {self.max_model_len}."
            )
        if request_id in self.running:
            raise ValueError(f"Request id {request_id} already running.")
        lora = getattr(lora_request, "lora_name", None)
        self.requests.append((request_id, dict(prompt), params))
        self.dp_ranks.append(data_parallel_rank)
        self.running.add(request_id)
        self._stats()
        kv = (params.extra_args or {}).get("kv_transfer_params") if self.nixl else None
        try:
            cached = self._store(ids, prompt.get("cache_salt"), lora) * self.block_size
            if kv is not None and kv.get("do_remote_prefill"):
                # get_num_new_matched_tokens / update_state_after_alloc: read what is not
                # cached here, once (the connector marks the params)
                if kv.get("remote_block_ids") and all(k in kv for k in _REMOTE_FIELDS):
                    assert self.nixl is not None
                    self.nixl.read(request_id, kv, len(ids) - cached)
                kv["do_remote_prefill"] = False
            outputs: list[list[int]] = [[] for _ in range(params.n)]
            done: dict[int, tuple[str, int | None]] = {}
            max_tokens = params.max_tokens or 16
            first = True
            while len(done) < params.n:
                if self.step_s:
                    await asyncio.sleep(self.step_s)
                else:
                    await asyncio.sleep(0)
                if request_id in self.aborted:
                    yield FakeRequestOutput(
                        request_id,
                        None,
                        ids,
                        None,
                        [
                            FakeCompletionOutput(c, "", [], None, None, "abort")
                            for c in range(params.n)
                            if c not in done
                        ],
                        True,
                        num_cached_tokens=cached,
                    )
                    return
                deltas = []
                for c in range(params.n):
                    if c in done:
                        continue
                    i = len(outputs[c])
                    token = self._token(ids, params, c, i)
                    if self.eos_after is not None and i + 1 == self.eos_after:
                        token = EOS
                    outputs[c].append(token)
                    reason: str | None = None
                    stop_reason: int | None = None
                    may_stop = len(outputs[c]) >= params.min_tokens
                    if may_stop and token in (params.stop_token_ids or ()):
                        reason, stop_reason = "stop", token
                    elif may_stop and token == EOS and not params.ignore_eos:
                        reason = "stop"
                    elif len(outputs[c]) >= max_tokens:
                        reason = "length"
                    transfer: dict[str, Any] | None = None
                    if reason is not None:
                        done[c] = (reason, stop_reason)
                        self._store(ids + outputs[c], prompt.get("cache_salt"), lora)
                        if kv is not None and kv.get("do_remote_decode"):
                            assert self.nixl is not None
                            transfer = self.nixl.finished_prefill(
                                self, request_id, len(ids), length_capped=reason == "length"
                            )
                    logprobs = (
                        [self._logprobs(token, params.logprobs)]
                        if params.logprobs is not None
                        else None
                    )
                    deltas.append(
                        FakeCompletionOutput(
                            c,
                            "",
                            [token],
                            None,
                            logprobs,
                            reason,
                            stop_reason,
                            kv_transfer_params=transfer,
                        )
                    )
                yield FakeRequestOutput(
                    request_id,
                    None,
                    ids if first else None,
                    None,
                    deltas,
                    len(done) == params.n,
                    num_cached_tokens=cached,
                )
                first = False
        finally:
            self.running.discard(request_id)
            self.aborted.discard(request_id)
            self._stats()

    def _stats(self) -> None:
        self.scheduler.update(
            running=len(self.running), waiting=0, kv_usage=0.0, engine=self.dp_rank
        )

    async def abort(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            self.abort_calls.append(rid)
            if rid in self.running:
                self.aborted.add(rid)

    def facts(self) -> EngineFacts:
        return EngineFacts(
            kind="vllm",
            block_size=self.block_size,
            kv_blocks=self.num_gpu_blocks,
            max_num_seqs=self.max_num_seqs,
            context_length=self.max_model_len,
        )


class FakeDpAsyncLLM:
    """``AsyncLLM`` with ``data_parallel_size`` ranks (see the module docstring)."""

    def __init__(self, ranks: list[FakeAsyncLLM]) -> None:
        self.ranks = ranks
        self.scheduler = ranks[0].scheduler
        self.dp_ranks: list[int | None] = []

    @classmethod
    def build(
        cls,
        dp_size: int,
        *,
        publishers: list[KvPublisher] | None = None,
        nixl: FakeNixl | None = None,
        engine_id: str = "fake-engine",
        **llm: Any,
    ) -> FakeDpAsyncLLM:
        """``dp_size`` engine cores sharing one scheduler snapshot (one stat logger per core)."""
        snapshot = SchedulerSnapshot()
        return cls(
            [
                FakeAsyncLLM(
                    publisher=publishers[rank] if publishers else None,
                    scheduler=snapshot,
                    nixl=nixl,
                    engine_id=engine_id,
                    dp_rank=rank,
                    **llm,
                )
                for rank in range(dp_size)
            ]
        )

    # what FakeVllmServer and the builders read of an engine
    @property
    def block_size(self) -> int:
        return self.ranks[0].block_size

    @property
    def num_gpu_blocks(self) -> int:
        return self.ranks[0].num_gpu_blocks

    @property
    def max_model_len(self) -> int:
        return self.ranks[0].max_model_len

    @property
    def max_num_seqs(self) -> int:
        return self.ranks[0].max_num_seqs

    @property
    def publisher(self) -> KvPublisher | None:
        return self.ranks[0].publisher

    @property
    def running(self) -> set[str]:
        return {rid for rank in self.ranks for rid in rank.running}

    @property
    def cache(self) -> dict[int | bytes, _Block]:
        return {h: b for rank in self.ranks for h, b in rank.cache.items()}

    def _token(self, prompt: list[int], params: FakeSamplingParams, choice: int, i: int) -> int:
        return self.ranks[0]._token(prompt, params, choice, i)

    async def generate(
        self,
        prompt: Any,
        sampling_params: FakeSamplingParams,
        request_id: str,
        *,
        prompt_text: str | None = None,
        lora_request: Any = None,
        tokenization_kwargs: dict[str, Any] | None = None,
        trace_headers: Any = None,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> AsyncGenerator[FakeRequestOutput, None]:
        self.dp_ranks.append(data_parallel_rank)
        size = len(self.ranks)
        if data_parallel_rank is not None and not 0 <= data_parallel_rank < size:
            raise ValueError(
                f"data_parallel_rank {data_parallel_rank} is out of range [0, {size})."
            )
        if data_parallel_rank is None:  # the internal load balancer: the least busy core
            data_parallel_rank = min(range(size), key=lambda r: len(self.ranks[r].running))
        rank = self.ranks[data_parallel_rank]
        async for output in rank.generate(
            prompt,
            sampling_params,
            request_id,
            lora_request=lora_request,
            data_parallel_rank=data_parallel_rank,
        ):
            yield output

    async def abort(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rank in self.ranks:
            await rank.abort([rid for rid in ids if rid in rank.running])

    def facts(self) -> EngineFacts:
        return self.ranks[0].facts()


# --- vllm serve ----------------------------------------------------------------------------------

_SAMPLING_FIELDS = (
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "max_tokens",
    "min_tokens",
    "logprobs",
    "structured_outputs",
)


class FakeVllmServer:
    """``vllm serve`` on 127.0.0.1 and a port the OS picks (see the module docstring)."""

    def __init__(
        self,
        llm: FakeAsyncLLM | FakeDpAsyncLLM,
        *,
        model: str = "fake-model",
        prompt_tokens_details: bool = True,
        cache_config_info: bool = True,
        loading_for: int = 0,
        token_ids: bool = True,
    ) -> None:
        self.llm = llm
        self.cache_config_info = cache_config_info
        self.loading_for = loading_for
        self.token_ids = token_ids
        """False: a vLLM before 0.10.2, which ignores ``return_token_ids``."""
        """Answer ``/v1/models`` with 503 this many times (a server still loading)."""
        self.model = model
        self.prompt_tokens_details = prompt_tokens_details
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.disconnects: list[str] = []
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> None:
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
        )
        server = self._server = uvicorn.Server(config)
        task = self._task = asyncio.create_task(server.serve())

        def started() -> bool:
            if task.done():
                task.result()  # it failed to start: say why
            return server.started

        await eventually_async(
            started, interval_s=0.01, message="the fake vLLM HTTP server never started"
        )
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # --- ASGI --------------------------------------------------------------------------------

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models":
            if self.loading_for > 0:
                self.loading_for -= 1
                await _json(send, 503, _error("loading", "ServiceUnavailableError", 503))
                return
            await _json(send, 200, self._models())
        elif method == "GET" and path == "/metrics":
            await _text(send, 200, self._metrics())
        elif method == "POST" and path == "/v1/completions":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            self.headers.append(headers)
            await self._completions(json.loads(body), headers, receive, send)
        else:
            await _json(send, 404, _error("Not Found", "NotFoundError", 404))

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "vllm",
                    "root": self.model,
                    "parent": None,
                    "max_model_len": self.llm.max_model_len,
                    "permission": [],
                }
            ],
        }

    def _metrics(self) -> str:
        labels = f'{{engine="0",model_name="{self.model}"}}'
        info = ""
        if self.cache_config_info:
            info = (
                f'vllm:cache_config_info{{block_size="{self.llm.block_size}",'
                f'cache_dtype="auto",engine="0",num_cpu_blocks="None",'
                f'num_gpu_blocks="{self.llm.num_gpu_blocks}"}} 1.0\n'
            )
        return info + (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {len(self.llm.running)}.0\n"
            f"vllm:num_requests_waiting{labels} 0.0\n"
            f"vllm:kv_cache_usage_perc{labels} "
            f"{len(self.llm.cache) / self.llm.num_gpu_blocks}\n"
        )

    async def _completions(
        self, body: dict[str, Any], headers: dict[str, str], receive: Any, send: Any
    ) -> None:
        self.bodies.append(body)
        if body.get("stream_options") and not body.get("stream"):
            message = "Stream options can only be defined when `stream=True`."
            await _json(send, 400, _error(message, "BadRequestError", 400))
            return
        if body.get("model") != self.model:
            message = f"The model `{body.get('model')}` does not exist."
            await _json(send, 404, _error(message, "NotFoundError", 404))
            return
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            await _json(send, 400, _error("prompt must be token ids here", "BadRequestError", 400))
            return
        try:
            # CompletionRequest.to_sampling_params: kv_transfer_params go into extra_args
            kv = body.get("kv_transfer_params")
            params = FakeSamplingParams(
                **{k: body[k] for k in _SAMPLING_FIELDS if k in body and body[k] is not None},
                output_kind="DELTA",
                detokenize=False,
                # a copy, as the engine core process gets one
                extra_args={"kv_transfer_params": dict(kv)} if kv else None,
            )
        except (TypeError, ValueError) as exc:
            await _json(send, 400, _error(str(exc), "BadRequestError", 400))
            return
        request_id = f"cmpl-{len(self.bodies)}"
        prompt_dict: dict[str, Any] = {"prompt_token_ids": prompt}
        if body.get("cache_salt"):
            prompt_dict["cache_salt"] = body["cache_salt"]
        rank: int | None = None
        with contextlib.suppress(KeyError, ValueError):  # OpenAIServing._get_data_parallel_rank
            rank = int(headers["x-data-parallel-rank"])
        generator = self.llm.generate(prompt_dict, params, request_id, data_parallel_rank=rank)
        try:
            first = await generator.__anext__()
        except ValueError as exc:
            await _json(send, 400, _error(str(exc), "BadRequestError", 400))
            return
        if not body.get("stream"):
            await self._whole(body, first, generator, send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        disconnected = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            await self._stream(body, first, generator, send, disconnected)
        except OSError:
            disconnected.set()
        finally:
            watcher.cancel()
            if disconnected.is_set():
                self.disconnects.append(request_id)
                await self.llm.abort(request_id)  # vLLM aborts a request whose client left
            await generator.aclose()

    async def _stream(
        self,
        body: dict[str, Any],
        first: FakeRequestOutput,
        generator: AsyncIterator[FakeRequestOutput],
        send: Any,
        disconnected: asyncio.Event,
    ) -> None:
        created = int(time.time())
        n = int(body.get("n") or 1)
        sent_prompt = [False] * n
        completion = [0] * n
        num_prompt = len(first.prompt_token_ids or ())
        cached = first.num_cached_tokens or 0
        return_ids = bool(body.get("return_token_ids")) and self.token_ids

        async def chunks() -> AsyncIterator[FakeRequestOutput]:
            yield first
            async for item in generator:
                yield item

        async for res in chunks():
            if disconnected.is_set():
                return
            for output in res.outputs:
                i = output.index
                if not output.token_ids and output.finish_reason is None and not completion[i]:
                    continue
                prompt_ids = None
                if return_ids and not sent_prompt[i]:
                    prompt_ids = first.prompt_token_ids
                    sent_prompt[i] = True
                completion[i] += len(output.token_ids)
                choice = {
                    "index": i,
                    "text": "",
                    "logprobs": _http_logprobs(output, body),
                    "finish_reason": output.finish_reason,
                    "stop_reason": output.stop_reason,
                    "prompt_token_ids": prompt_ids,
                    "token_ids": list(output.token_ids) if return_ids else None,
                }
                if not self.token_ids:
                    del choice["prompt_token_ids"], choice["token_ids"]
                chunk = {
                    "id": f"cmpl-{len(self.bodies)}",
                    "object": "text_completion",
                    "created": created,
                    "model": self.model,
                    "choices": [choice],
                    "usage": None,
                }
                await _event(send, json.dumps(chunk))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage: dict[str, Any] = {
                "prompt_tokens": num_prompt,
                "completion_tokens": sum(completion),
                "total_tokens": num_prompt + sum(completion),
            }
            if self.prompt_tokens_details and cached:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            chunk = {
                "id": f"cmpl-{len(self.bodies)}",
                "object": "text_completion",
                "created": created,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
            await _event(send, json.dumps(chunk))
        await _event(send, "[DONE]")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _whole(
        self,
        body: dict[str, Any],
        first: FakeRequestOutput,
        generator: AsyncIterator[FakeRequestOutput],
        send: Any,
    ) -> None:
        """A non-streamed ``CompletionResponse`` (``request_output_to_completion_response``):
        the whole output per choice, usage, and the final output's ``kv_transfer_params``."""
        outputs: dict[int, list[int]] = {}
        finish: dict[int, tuple[str | None, int | str | None]] = {}
        last = first

        async def rest() -> AsyncIterator[FakeRequestOutput]:
            yield first
            async for item in generator:
                yield item

        async for res in rest():
            last = res
            for output in res.outputs:
                outputs.setdefault(output.index, []).extend(output.token_ids)
                finish[output.index] = (output.finish_reason, output.stop_reason)
        return_ids = bool(body.get("return_token_ids")) and self.token_ids
        choices = [
            {
                "index": i,
                "text": "",
                "logprobs": None,
                "finish_reason": finish[i][0],
                "stop_reason": finish[i][1],
                "prompt_token_ids": first.prompt_token_ids if return_ids else None,
                "token_ids": ids if return_ids else None,
            }
            for i, ids in sorted(outputs.items())
        ]
        num_prompt = len(first.prompt_token_ids or ())
        completion = sum(len(ids) for ids in outputs.values())
        usage: dict[str, Any] = {
            "prompt_tokens": num_prompt,
            "completion_tokens": completion,
            "total_tokens": num_prompt + completion,
        }
        if self.prompt_tokens_details and first.num_cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": first.num_cached_tokens}
        response = {
            "id": f"cmpl-{len(self.bodies)}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": usage,
            "kv_transfer_params": last.kv_transfer_params,
        }
        await _json(send, 200, response)


def _http_logprobs(output: FakeCompletionOutput, body: dict[str, Any]) -> dict[str, Any] | None:
    k = body.get("logprobs")
    if k is None or output.logprobs is None:
        return None
    as_ids = bool(body.get("return_tokens_as_token_ids"))

    def name(token: int) -> str:
        return f"token_id:{token}" if as_ids else f"<{token}>"

    tokens, values, tops = [], [], []
    for token, step in zip(output.token_ids, output.logprobs, strict=True):
        tokens.append(name(token))
        values.append(max(step[token].logprob, -9999.0))
        tops.append(
            {name(t): max(lp.logprob, -9999.0) for i, (t, lp) in enumerate(step.items()) if k >= i}
        )
    return {
        "text_offset": [0] * len(tokens),
        "token_logprobs": values,
        "tokens": tokens,
        "top_logprobs": tops,
    }


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def _json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _text(send: Any, status: int, body: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; version=0.0.4")],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})


async def _event(send: Any, data: str) -> None:
    await send(
        {"type": "http.response.body", "body": f"data: {data}\n\n".encode(), "more_body": True}
    )


# --- ready engines -------------------------------------------------------------------------------


async def until_subscribed(
    engine: VllmEngine | RemoteVllmEngine,
    publisher: KvPublisher | None,
    timeout_s: float = 5.0,
    rank: int = 0,
) -> None:
    """Publish empty batches until the engine's SUB socket (of ``rank``) receives one (ZMQ's
    slow joiner: a subscription takes a moment to reach the publisher)."""
    if engine.feeds is None or publisher is None:
        return
    subscriber = engine.feeds.subscribers[rank]

    def received() -> bool:
        """Whether a batch came; if not, one more is on its way."""
        if subscriber.received:
            return True
        publisher.publish_empty()
        return False

    await eventually_async(
        received, timeout_s=timeout_s, message="the KV event subscriber never received a batch"
    )


@dataclass
class FakeStack:
    """A started engine and the fakes behind it."""

    engine: VllmEngine | RemoteVllmEngine
    llm: FakeAsyncLLM
    publisher: FakeKvPublisher | None
    facts: EngineFacts
    server: FakeVllmServer | None = None


def _kv_sources(llm: FakeAsyncLLM | FakeDpAsyncLLM) -> tuple[KvSource, ...]:
    ranks = llm.ranks if isinstance(llm, FakeDpAsyncLLM) else [llm]
    return tuple(
        KvSource(
            endpoint=rank.publisher.endpoint,
            replay_endpoint=rank.publisher.replay_endpoint,
            topic=rank.publisher.topic,
            dp_rank=rank.dp_rank,
        )
        for rank in ranks
        if rank.publisher is not None
    )


def inprocess_engine(llm: FakeAsyncLLM | FakeDpAsyncLLM) -> VllmEngine:
    """A ``VllmEngine`` (not started) whose ``load`` hands it ``llm`` and its publishers (one
    per data-parallel rank), as ``loader.load_vllm`` does."""

    async def load() -> VllmHandle:
        return VllmHandle(
            client=llm,
            facts=llm.facts(),
            make_sampling_params=fake_sampling_params,
            kv_sources=_kv_sources(llm),
            dp_size=len(llm.ranks) if isinstance(llm, FakeDpAsyncLLM) else 1,
            scheduler=llm.scheduler,
        )

    return VllmEngine(load)


def remote_engine(server: FakeVllmServer, **options: Any) -> RemoteVllmEngine:
    """A ``RemoteVllmEngine`` (not started) for ``server`` and its LLM's (rank 0's) publisher."""
    llm = server.llm
    publisher = llm.publisher
    return RemoteVllmEngine(
        RemoteOptions(
            engine_url=server.url,
            block_size=llm.block_size,
            kv_blocks=llm.num_gpu_blocks,
            max_num_seqs=llm.max_num_seqs,
            kv_events_endpoint=publisher.endpoint if publisher else None,
            kv_replay_endpoint=publisher.replay_endpoint if publisher else None,
            kv_topic=publisher.topic if publisher else "",
            **options,
        )
    )


@asynccontextmanager
async def fake_inprocess_stack(
    *, kv_events: bool = True, layout: Literal["array", "map"] = "array", **llm: Any
) -> AsyncIterator[FakeStack]:
    """A started ``VllmEngine`` over a ``FakeAsyncLLM`` publishing KV events through a
    ``FakeKvPublisher``; everything stops on exit."""
    publisher = FakeKvPublisher(layout=layout) if kv_events else None
    fake = FakeAsyncLLM(publisher=publisher, **llm)
    engine = inprocess_engine(fake)
    facts = await engine.start()
    await until_subscribed(engine, publisher)
    try:
        yield FakeStack(engine=engine, llm=fake, publisher=publisher, facts=facts)
    finally:
        await engine.stop()
        if publisher is not None:
            await asyncio.to_thread(publisher.shutdown)


@asynccontextmanager
async def fake_remote_stack(
    *,
    kv_events: bool = True,
    layout: Literal["array", "map"] = "map",
    metrics_interval_s: float = 0.0,
    **llm: Any,
) -> AsyncIterator[FakeStack]:
    """A started ``RemoteVllmEngine`` talking to a ``FakeVllmServer`` over HTTP, with KV
    events from a ``FakeKvPublisher``; everything stops on exit."""
    publisher = FakeKvPublisher(layout=layout) if kv_events else None
    fake = FakeAsyncLLM(publisher=publisher, **llm)
    server = FakeVllmServer(fake)
    await server.start()
    engine = remote_engine(server, metrics_interval_s=metrics_interval_s)
    try:
        facts = await engine.start()
        await until_subscribed(engine, publisher)
        yield FakeStack(engine=engine, llm=fake, publisher=publisher, facts=facts, server=server)
    finally:
        await engine.stop()
        await server.stop()
        if publisher is not None:
            await asyncio.to_thread(publisher.shutdown)


@asynccontextmanager
async def fake_inprocess_engine(**options: Any) -> AsyncIterator[VllmEngine]:
    """A ready (started) in-process ``WorkerEngine`` over fakes; stopped on exit."""
    async with fake_inprocess_stack(**options) as stack:
        assert isinstance(stack.engine, VllmEngine)
        yield stack.engine


@asynccontextmanager
async def fake_remote_engine(**options: Any) -> AsyncIterator[RemoteVllmEngine]:
    """A ready (started) remote ``WorkerEngine`` over a fake ``vllm serve``; stopped on exit."""
    async with fake_remote_stack(**options) as stack:
        assert isinstance(stack.engine, RemoteVllmEngine)
        yield stack.engine
