"""``/v1/embeddings`` end to end with the real ``openai`` SDK: gateway, preprocessor, router and
the mock embedder (``services.embedder``) as separate processes."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from services.cli.stack import Stack
from services.embedder.model import DEFAULT_EMBEDDING_MODEL
from tests.e2e.conftest import MODEL, serving_models

EMBEDDING_MODEL = DEFAULT_EMBEDDING_MODEL
SIZE = 1024
TEXT = "The quick brown fox jumps over the lazy dog."
SIMILAR = "The quick brown fox jumped over the lazy dog."
UNRELATED = "Quarterly revenue grew by eleven percent in Europe."


@pytest.fixture(scope="module")
def embed_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One chat worker and one mock embedder."""
    run_dir = tmp_path_factory.mktemp("embeddings")
    models = [MODEL, EMBEDDING_MODEL]
    with serving_models(run_dir, model_dir, models, workers=1, embedders=1) as s:
        yield s


@pytest.fixture
async def client(embed_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{embed_stack.base_url}/v1", api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    """The Qwen3 tokenizer, which the Qwen3-Embedding models use too."""
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


async def test_a_string_gets_one_unit_vector(client: openai.AsyncOpenAI) -> None:
    response = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXT, encoding_format="float"
    )
    (item,) = response.data
    assert (response.object, response.model, item.object, item.index) == (
        "list",
        EMBEDDING_MODEL,
        "embedding",
        0,
    )
    assert (len(item.embedding), round(norm(item.embedding), 5)) == (SIZE, 1.0)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 0


async def test_usage_counts_the_models_tokens(
    client: openai.AsyncOpenAI, tokenizer: Tokenizer
) -> None:
    response = await client.embeddings.create(model=EMBEDDING_MODEL, input=[TEXT, UNRELATED])
    expected = len(tokenizer.encode(TEXT).ids) + len(tokenizer.encode(UNRELATED).ids)
    assert response.usage.prompt_tokens == expected


async def test_a_list_keeps_its_order_and_similar_texts_are_closer(
    client: openai.AsyncOpenAI,
) -> None:
    response = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=[TEXT, SIMILAR, UNRELATED, TEXT], encoding_format="float"
    )
    vectors = [d.embedding for d in response.data]
    assert [d.index for d in response.data] == [0, 1, 2, 3]
    assert vectors[0] == vectors[3]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3


async def test_token_ids_embed_as_their_text(
    client: openai.AsyncOpenAI, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(TEXT).ids
    by_text = await client.embeddings.create(model=EMBEDDING_MODEL, input=TEXT)
    one = await client.embeddings.create(model=EMBEDDING_MODEL, input=ids)
    many = await client.embeddings.create(model=EMBEDDING_MODEL, input=[ids, ids[:3]])
    assert one.data[0].embedding == by_text.data[0].embedding
    assert many.data[0].embedding == by_text.data[0].embedding
    assert (len(many.data), many.usage.prompt_tokens) == (2, len(ids) + 3)


async def test_base64_decodes_to_the_float_vector(client: openai.AsyncOpenAI) -> None:
    floats = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXT, encoding_format="float"
    )
    # No encoding_format: the SDK asks for base64 and decodes it itself.
    decoded_by_sdk = await client.embeddings.create(model=EMBEDDING_MODEL, input=TEXT)
    raw = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXT, encoding_format="base64"
    )
    packed = base64.b64decode(str(raw.data[0].embedding))
    assert decoded_by_sdk.data[0].embedding == floats.data[0].embedding
    assert list(struct.unpack(f"<{SIZE}f", packed)) == floats.data[0].embedding


async def test_dimensions_shorten_and_renormalize(client: openai.AsyncOpenAI) -> None:
    whole = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXT, encoding_format="float"
    )
    short = await client.embeddings.create(
        model=EMBEDDING_MODEL, input=TEXT, dimensions=256, encoding_format="float"
    )
    vector, head = short.data[0].embedding, whole.data[0].embedding[:256]
    assert (len(vector), round(norm(vector), 5)) == (256, 1.0)
    assert vector == pytest.approx([v / norm(head) for v in head], abs=1e-6)


async def test_unknown_model_is_404(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        await client.embeddings.create(model="no-such-model", input=TEXT)
    assert err.value.status_code == 404


@pytest.mark.parametrize("empty", ["", []])
async def test_empty_input_is_400(client: openai.AsyncOpenAI, empty: str | list[str]) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await client.embeddings.create(model=EMBEDDING_MODEL, input=empty)
    assert err.value.status_code == 400


async def test_dimensions_above_the_models_size_is_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="dimensions"):
        await client.embeddings.create(model=EMBEDDING_MODEL, input=TEXT, dimensions=SIZE + 1)


async def test_a_chat_model_is_not_an_embedding_model(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="not an embedding model"):
        await client.embeddings.create(model=MODEL, input=TEXT)


async def test_chat_with_the_embedding_model_is_400(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        await client.chat.completions.create(
            model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
