"""Embeddings over a real nats-server: gateway bus → preprocessor → router → mock embedder.

The gateway side is the real ``NatsBus`` (and ``asks.embed``, what the HTTP route
runs); preprocessor, router and embedders are the real services, in process.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from tokenizers import Tokenizer

from services.embedder.config import EmbedderConfig
from services.embedder.model import DEFAULT_EMBEDDING_MODEL, ensure_embedding_model_dir
from services.embedder.service import EmbedderService
from services.gateway.apis.embeddings import PATH, EmbeddingRequest
from services.gateway.config import GatewayConfig
from services.gateway.core import asks
from services.gateway.core.bus import NatsBus
from services.gateway.core.context import RequestContext
from services.gateway.core.exchange import Exchanges
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import serving as preprocessor_serving
from services.router.config import RouterConfig
from services.router.service import Router
from shared import codec
from shared.bus import connect
from shared.errors import ServiceError
from shared.messages import (
    Embed,
    EmbedResult,
    Generate,
    ModelCard,
    RequestFailed,
    RequestPhase,
    SamplingParams,
)
from shared.registry import publish_model
from shared.subjects import Subjects

MODEL = DEFAULT_EMBEDDING_MODEL
TIMEOUT_S = 10.0
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def embedding_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_embedding_model_dir(tmp_path_factory.mktemp("qwen3-embedding"))


@pytest.fixture(scope="module")
def tokenizer(embedding_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(embedding_dir / "tokenizer.json"))


class Pipeline:
    """Starts the services of one test on their own connections; stops them in reverse."""

    def __init__(self, nats_url: str, subjects: Subjects, model_dir: Path) -> None:
        self.nats_url = nats_url
        self.subjects = subjects
        self.model_dir = model_dir
        self.stack = AsyncExitStack()
        self.bus: NatsBus | None = None

    def _common(self) -> dict[str, Any]:
        return {"nats_url": self.nats_url, "namespace": self.subjects.namespace}

    async def embedder(self, worker_id: str = "emb-1", **options: Any) -> EmbedderService:
        config = EmbedderConfig(
            **self._common(), worker_id=worker_id, model_path=self.model_dir, **options
        )
        client = await nats.connect(self.nats_url)
        service = EmbedderService(config, client)
        await service.start()
        self.stack.push_async_callback(client.drain)
        self.stack.push_async_callback(service.stop)
        return service

    async def preprocessor(self) -> None:
        config = PreprocessorConfig(**self._common())
        await self.stack.enter_async_context(preprocessor_serving(config))

    async def router(self) -> Router:
        client = await connect(self.nats_url, name="test-router")
        router = Router(RouterConfig(**self._common()), client)
        await router.start()
        self.stack.push_async_callback(client.drain)
        self.stack.push_async_callback(router.stop)
        return router

    async def gateway(self) -> NatsBus:
        bus = NatsBus(GatewayConfig(**self._common(), gateway_id=uuid.uuid4().hex[:8]))
        await bus.start()
        self.stack.push_async_callback(bus.stop)
        self.bus = bus
        return bus

    async def embed(self, **fields: Any) -> EmbedResult:
        assert self.bus is not None
        model = fields.pop("model", MODEL)
        request = Embed(request_id=uuid.uuid4().hex, model=model, reply_to="", **fields)
        return await self.bus.embed(request, TIMEOUT_S)


@pytest.fixture
async def pipeline(
    nats_url: str, subjects: Subjects, embedding_dir: Path
) -> AsyncIterator[Pipeline]:
    pipe = Pipeline(nats_url, subjects, embedding_dir)
    async with pipe.stack:
        yield pipe


@pytest.fixture
async def full(pipeline: Pipeline) -> Pipeline:
    """Embedder, preprocessor, router and gateway bus, all running, the worker live."""
    await pipeline.embedder()
    await pipeline.preprocessor()
    await pipeline.router()
    bus = await pipeline.gateway()
    await _until(lambda: _is_live(bus))
    return pipeline


async def _is_live(bus: NatsBus) -> bool:
    return bus.is_live(MODEL)


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


def vectors(result: EmbedResult) -> list[tuple[float, ...]]:
    width = result.dimensions
    return [
        struct.unpack_from(f"<{width}f", result.vectors, i * 4 * width) for i in range(result.count)
    ]


def norm(vector: tuple[float, ...]) -> float:
    return math.sqrt(sum(v * v for v in vector))


class TestEmbeddings:
    async def test_texts_get_unit_vectors_of_the_models_size(self, full: Pipeline) -> None:
        result = await full.embed(texts=(TEXT, "hello"))
        assert (result.count, result.dimensions, result.worker_id) == (2, 1024, "emb-1")
        assert [round(norm(v), 5) for v in vectors(result)] == [1.0, 1.0]

    async def test_prompt_tokens_are_the_model_tokenizers_count(
        self, full: Pipeline, tokenizer: Tokenizer
    ) -> None:
        result = await full.embed(texts=(TEXT, "hello world"))
        expected = len(tokenizer.encode(TEXT).ids) + len(tokenizer.encode("hello world").ids)
        assert result.prompt_tokens == expected

    async def test_token_ids_embed_as_their_text_does(
        self, full: Pipeline, tokenizer: Tokenizer
    ) -> None:
        ids = tuple(tokenizer.encode(TEXT).ids)
        by_text = await full.embed(texts=(TEXT,))
        by_ids = await full.embed(token_ids=(ids,))
        assert by_ids.vectors == by_text.vectors

    async def test_dimensions_truncate_and_renormalize(self, full: Pipeline) -> None:
        whole = vectors(await full.embed(texts=(TEXT,)))[0]
        short = vectors(await full.embed(texts=(TEXT,), dimensions=64))[0]
        scale = norm(whole[:64])
        assert len(short) == 64
        assert short == pytest.approx([v / scale for v in whole[:64]], abs=1e-6)

    async def test_dimensions_above_the_models_size_is_400(self, full: Pipeline) -> None:
        with pytest.raises(ServiceError, match="dimensions must be between 1 and 1024") as err:
            await full.embed(texts=(TEXT,), dimensions=1025)
        assert (err.value.status, err.value.param) == (400, "dimensions")

    async def test_token_id_outside_the_vocabulary_is_400(self, full: Pipeline) -> None:
        with pytest.raises(ServiceError, match="token id 151669 is out of vocabulary") as err:
            await full.embed(token_ids=((1, 2), (3, 151669)))
        assert (err.value.status, err.value.param) == (400, "input")

    async def test_unknown_model_is_404(self, full: Pipeline) -> None:
        with pytest.raises(ServiceError) as err:
            await full.embed(model="no-such-model", texts=("hi",))
        assert (err.value.status, err.value.code) == (404, "model_not_found")

    async def test_a_chat_request_routed_to_the_embedder_is_400(
        self, full: Pipeline, nc: Client, subjects: Subjects
    ) -> None:
        stream = f"test.stream.{uuid.uuid4().hex}"
        lifecycle = await nc.subscribe(subjects.lifecycle("emb-1"))
        sub = await nc.subscribe(stream)
        gen = Generate(
            request_id="chat-1",
            model=MODEL,
            token_ids=(1, 2, 3),
            sampling=SamplingParams(),
            stream_to=stream,
        )
        await nc.publish(subjects.generate("emb-1"), codec.encode(gen))
        failed = codec.decode((await sub.next_msg(timeout=TIMEOUT_S)).data, RequestFailed)
        phase = codec.decode((await lifecycle.next_msg(timeout=TIMEOUT_S)).data, RequestPhase)
        assert (failed.status, failed.param) == (400, "model")
        assert "is an embedding model" in failed.message
        assert (phase.request_id, phase.phase) == ("chat-1", "finished")

    async def test_create_embeddings_batches_keep_input_order(self, full: Pipeline) -> None:
        assert full.bus is not None
        texts: list[Any] = [f"sentence number {i}" for i in range(70)]  # 3 batches of <= 32
        exchanges = Exchanges(full.bus, first_timeout_s=TIMEOUT_S, idle_timeout_s=TIMEOUT_S)
        envelope = exchanges.envelope(RequestContext("batched", "POST", PATH))
        request = EmbeddingRequest(model=MODEL, input=texts, encoding_format="base64")
        body = await asks.embed(exchanges, request, envelope)
        one_by_one = [await full.embed(texts=(t,)) for t in (texts[0], texts[45], texts[69])]
        data = msgspec.json.decode(body)["data"]
        assert [d["index"] for d in data] == list(range(70))
        picked = [base64.b64decode(data[i]["embedding"]) for i in (0, 45, 69)]
        assert picked == [r.vectors for r in one_by_one]


class TestLimits:
    async def test_input_longer_than_the_context_is_400(self, pipeline: Pipeline) -> None:
        await pipeline.embedder(context_length=8)
        await pipeline.preprocessor()
        await pipeline.router()
        bus = await pipeline.gateway()
        await _until(lambda: _is_live(bus))
        with pytest.raises(ServiceError, match="maximum context length is 8 tokens") as err:
            await pipeline.embed(texts=("short", TEXT))
        assert (err.value.status, err.value.code) == (400, "context_length_exceeded")


class TestRouting:
    async def test_requests_take_turns_across_live_workers(self, pipeline: Pipeline) -> None:
        await pipeline.embedder("emb-a")
        await pipeline.embedder("emb-b")
        await pipeline.preprocessor()
        router = await pipeline.router()
        bus = await pipeline.gateway()
        await _until(lambda: _both_live(router))
        await _until(lambda: _is_live(bus))
        served = [(await pipeline.embed(texts=("hi",))).worker_id for _ in range(4)]
        assert sorted(served) == ["emb-a", "emb-a", "emb-b", "emb-b"]

    async def test_equal_texts_get_equal_vectors_from_any_worker(self, pipeline: Pipeline) -> None:
        await pipeline.embedder("emb-a")
        await pipeline.embedder("emb-b")
        await pipeline.preprocessor()
        router = await pipeline.router()
        await pipeline.gateway()
        await _until(lambda: _both_live(router))
        first, second = [await pipeline.embed(texts=(TEXT,)) for _ in range(2)]
        assert first.worker_id != second.worker_id
        assert first.vectors == second.vectors


async def _both_live(router: Router) -> bool:
    return len(router.live(MODEL)) == 2


class TestFailures:
    async def test_no_preprocessor_is_503(self, pipeline: Pipeline) -> None:
        await pipeline.gateway()
        with pytest.raises(ServiceError, match="No preprocessor") as err:
            await pipeline.embed(texts=("hi",))
        assert err.value.status == 503

    async def test_no_router_is_503(self, pipeline: Pipeline) -> None:
        await pipeline.embedder()
        await pipeline.preprocessor()
        await pipeline.gateway()
        with pytest.raises(ServiceError, match="no router is running") as err:
            await pipeline.embed(texts=("hi",))
        assert err.value.status == 503

    async def test_no_live_worker_is_503(
        self, pipeline: Pipeline, nc: Client, subjects: Subjects
    ) -> None:
        card = ModelCard(model=MODEL, context_length=32768, kind="embedding")
        await publish_model(nc.jetstream(), subjects, card, pipeline.model_dir)
        await pipeline.preprocessor()
        await pipeline.router()
        await pipeline.gateway()
        with pytest.raises(ServiceError, match="no live worker") as err:
            await pipeline.embed(texts=("hi",))
        assert (err.value.status, err.value.code) == (503, "no_worker_available")
