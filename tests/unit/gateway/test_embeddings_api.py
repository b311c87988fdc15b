"""``POST /v1/embeddings`` in the gateway (pure parts, and the route over a fake bus)."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from services.embedder.vectors import to_float32_le
from services.gateway.apis.embeddings import (
    BATCH_INPUTS,
    BATCH_UNITS,
    MAX_INPUTS,
    PATH,
    EmbeddingRequest,
    Inputs,
    batches,
    check_card,
    inputs_of,
    parse,
    response_body,
)
from services.gateway.config import GatewayConfig
from services.gateway.core import asks
from services.gateway.core.context import RequestContext
from services.gateway.core.exchange import Exchanges
from services.gateway.http.app import create_app
from shared.errors import InvalidRequest, ModelNotFound, NoWorkerAvailable, ServiceError
from shared.messages import Embed, EmbedResult, ModelCard
from tests.unit.gateway.fakes import FakeBus

MODEL = "Qwen/Qwen3-Embedding-0.6B"
EMBEDDING_CARD = ModelCard(model=MODEL, context_length=32768, kind="embedding")
LLM_CARD = ModelCard(model="Qwen/Qwen3-0.6B", context_length=40960)


def body(**fields: Any) -> bytes:
    return msgspec.json.encode({"model": MODEL, "input": "hi", **fields})


class TestParse:
    def test_every_openai_field_is_accepted(self) -> None:
        request = parse(body(encoding_format="base64", dimensions=8, user="u1"))
        assert (request.encoding_format, request.dimensions, request.user) == ("base64", 8, "u1")

    def test_an_unknown_field_is_400_naming_it(self) -> None:
        with pytest.raises(InvalidRequest, match="`truncate`") as err:
            parse(body(truncate=True))
        assert err.value.param == "truncate"

    def test_an_unknown_field_is_ignored_when_allowed(self) -> None:
        assert parse(body(truncate=True), allow_unknown=True).model == MODEL

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"encoding_format": "int8"}, "encoding_format"),
            ({"dimensions": 0}, "dimensions"),
            ({"input": 3.5}, "input"),
            ({"input": [-1]}, "input[0]"),
            ({"input": [{"text": "hi"}]}, "input[0]"),
        ],
    )
    def test_bad_values_are_400_naming_the_field(self, fields: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as err:
            parse(body(**fields))
        assert err.value.param == param

    def test_a_missing_model_is_400(self) -> None:
        with pytest.raises(InvalidRequest, match="model"):
            parse(msgspec.json.encode({"input": "hi"}))

    def test_a_body_that_is_not_json_is_400(self) -> None:
        with pytest.raises(InvalidRequest, match="not valid JSON"):
            parse(b"{")


class TestInputs:
    def test_a_string_is_one_text(self) -> None:
        assert inputs_of("hi") == Inputs(texts=("hi",))

    def test_a_list_of_strings(self) -> None:
        assert inputs_of(["a", "b"]) == Inputs(texts=("a", "b"))

    def test_a_list_of_ids_is_one_pre_tokenized_input(self) -> None:
        assert inputs_of([1, 2, 3]) == Inputs(token_ids=((1, 2, 3),))

    def test_a_list_of_id_lists(self) -> None:
        assert inputs_of([[1], [2, 3]]) == Inputs(token_ids=((1,), (2, 3)))

    def test_one_long_id_list_is_not_counted_as_many_inputs(self) -> None:
        assert len(inputs_of(list(range(MAX_INPUTS + 10)))) == 1

    @pytest.mark.parametrize(
        ("value", "message"),
        [
            ([], "must not be empty"),
            ("", "empty string"),
            (["a", ""], "empty string"),
            ([[1], []], "empty token list"),
            (["a", 1], "not a mix"),
            ([[1], "a"], "not a mix"),
            (["a"] * (MAX_INPUTS + 1), "at most 2048"),
        ],
    )
    def test_bad_inputs_are_400(self, value: Any, message: str) -> None:
        with pytest.raises(InvalidRequest, match=message) as err:
            inputs_of(value)
        assert err.value.param == "input"

    def test_units_are_utf8_bytes_or_ids(self) -> None:
        assert Inputs(texts=("é", "ab")).units() == [2, 2]
        assert Inputs(token_ids=((1, 2, 3),)).units() == [3]


class TestBatches:
    def test_at_most_batch_inputs_each(self) -> None:
        spans = batches([1] * (BATCH_INPUTS * 2 + 1))
        assert [len(s) for s in spans] == [BATCH_INPUTS, BATCH_INPUTS, 1]

    def test_large_inputs_split_by_size(self) -> None:
        half = BATCH_UNITS // 2
        assert batches([half, half, 1, half]) == [range(0, 2), range(2, 4)]

    def test_an_input_larger_than_a_batch_goes_alone(self) -> None:
        assert batches([1, BATCH_UNITS * 3, 1]) == [range(0, 1), range(1, 2), range(2, 3)]

    def test_spans_cover_every_input_once_in_order(self) -> None:
        spans = batches([100] * 1000)
        assert [i for s in spans for i in s] == list(range(1000))

    def test_nothing_gives_no_batch(self) -> None:
        assert batches([]) == []


class TestCheckCard:
    def test_an_embedding_model_passes(self) -> None:
        check_card(MODEL, EMBEDDING_CARD)

    def test_a_model_never_registered_is_404(self) -> None:
        with pytest.raises(ModelNotFound):
            check_card("nope", None)

    def test_a_chat_model_is_400_saying_so(self) -> None:
        with pytest.raises(InvalidRequest, match="is not an embedding model") as err:
            check_card(LLM_CARD.model, LLM_CARD)
        assert (err.value.status, err.value.param) == (400, "model")


def result(
    vectors: list[list[float]], prompt_tokens: int = 3, request_id: str = "r"
) -> EmbedResult:
    return EmbedResult(
        request_id=request_id,
        model=MODEL,
        dimensions=len(vectors[0]),
        vectors=to_float32_le(vectors),
        prompt_tokens=prompt_tokens,
    )


class TestResponseBody:
    def test_the_openai_shape(self) -> None:
        out = msgspec.json.decode(response_body(MODEL, [result([[1.0, 0.0]])], "float"))
        assert out == {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}],
            "model": MODEL,
            "usage": {"prompt_tokens": 3, "total_tokens": 3},
        }

    def test_indexes_and_usage_run_across_batches(self) -> None:
        results = [result([[1.0], [0.5]], 4), result([[0.25]], 6)]
        out = msgspec.json.decode(response_body(MODEL, results, "float"))
        assert [(d["index"], d["embedding"]) for d in out["data"]] == [
            (0, [1.0]),
            (1, [0.5]),
            (2, [0.25]),
        ]
        assert out["usage"] == {"prompt_tokens": 10, "total_tokens": 10}

    def test_base64_is_the_little_endian_float32_bytes_of_the_float_form(self) -> None:
        vector = [0.1, -0.7, 0.3]
        floats = msgspec.json.decode(response_body(MODEL, [result([vector])], "float"))
        packed = msgspec.json.decode(response_body(MODEL, [result([vector])], "base64"))
        raw = base64.b64decode(packed["data"][0]["embedding"])
        assert list(struct.unpack("<3f", raw)) == floats["data"][0]["embedding"]


class EmbeddingBus(FakeBus):
    """Cards by model, live models, and an ``embed`` answering one vector per input."""

    def __init__(self, cards: dict[str, ModelCard | None], live: set[str]) -> None:
        super().__init__()
        self.cards = cards
        self.live = live
        self.sent: list[Embed] = []

    async def check_model(self, model: str) -> None:
        if model not in self.live:
            raise NoWorkerAvailable(f"The model `{model}` has no live worker right now.")

    async def embed(self, request: Embed, timeout_s: float) -> EmbedResult:
        self.sent.append(request)
        n = len(request.texts) or len(request.token_ids)
        width = request.dimensions or 2
        # A text "t<i>" gets i as its first value, so a test sees where each vector came from.
        firsts = [float(t[1:]) if t[1:].isdigit() else 0.0 for t in request.texts] or [0.0] * n
        vectors = [[first] + [0.0] * (width - 1) for first in firsts]
        return result(vectors, prompt_tokens=n, request_id=request.request_id)


@pytest.fixture
def bus() -> EmbeddingBus:
    cards: dict[str, ModelCard | None] = {
        MODEL: EMBEDDING_CARD,
        LLM_CARD.model: LLM_CARD,
        "nope": None,  # never published
    }
    return EmbeddingBus(cards, {MODEL, LLM_CARD.model})


async def create_embeddings(bus: EmbeddingBus, request: EmbeddingRequest) -> bytes:
    exchanges = Exchanges(bus, first_timeout_s=1, idle_timeout_s=1)
    envelope = exchanges.envelope(RequestContext("r", "POST", PATH))
    return await asks.embed(exchanges, request, envelope)


class TestCreateEmbeddings:
    async def test_batches_come_back_in_input_order(self, bus: EmbeddingBus) -> None:
        texts: list[Any] = [f"t{i}" for i in range(BATCH_INPUTS * 2 + 5)]
        request = EmbeddingRequest(model=MODEL, input=texts)
        out = msgspec.json.decode(await create_embeddings(bus, request))
        assert [d["embedding"][0] for d in out["data"]] == [float(i) for i in range(len(texts))]
        assert out["usage"]["prompt_tokens"] == len(texts)

    async def test_each_batch_has_its_own_request_id(self, bus: EmbeddingBus) -> None:
        request = EmbeddingRequest(model=MODEL, input=["a"] * (BATCH_INPUTS + 1))
        await create_embeddings(bus, request)
        assert sorted(e.request_id for e in bus.sent) == ["r-0", "r-1"]

    async def test_one_batch_keeps_the_request_id_and_passes_dimensions(
        self, bus: EmbeddingBus
    ) -> None:
        request = EmbeddingRequest(model=MODEL, input=[[1, 2]], dimensions=4)
        await create_embeddings(bus, request)
        assert [(e.request_id, e.token_ids, e.dimensions) for e in bus.sent] == [
            ("r", ((1, 2),), 4)
        ]

    @pytest.mark.parametrize(
        ("model", "status"), [("nope", 404), (LLM_CARD.model, 400), ("down", 503)]
    )
    async def test_model_errors(self, bus: EmbeddingBus, model: str, status: int) -> None:
        bus.cards["down"] = msgspec.structs.replace(EMBEDDING_CARD, model="down")
        with pytest.raises(ServiceError) as err:
            await create_embeddings(bus, EmbeddingRequest(model=model, input="hi"))
        assert err.value.status == status
        assert bus.sent == []


@pytest.fixture
async def http(bus: EmbeddingBus) -> AsyncIterator[AsyncTestClient[Any]]:
    app = create_app(GatewayConfig(request_timeout_s=1.0), bus=bus)
    async with AsyncTestClient(app) as client:
        yield client


class TestRoute:
    async def test_answers_200_with_the_openai_body(self, http: AsyncTestClient[Any]) -> None:
        response = await http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
        assert response.status_code == 200
        assert [d["index"] for d in response.json()["data"]] == [0, 1]

    async def test_bad_input_is_a_400_openai_error(self, http: AsyncTestClient[Any]) -> None:
        response = await http.post("/v1/embeddings", json={"model": MODEL, "input": []})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "input"

    async def test_unknown_model_is_a_404_openai_error(self, http: AsyncTestClient[Any]) -> None:
        response = await http.post("/v1/embeddings", json={"model": "nope", "input": "a"})
        assert (response.status_code, response.json()["error"]["code"]) == (404, "model_not_found")
