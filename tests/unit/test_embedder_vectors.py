"""The mock embedding model (pure): deterministic unit vectors, similarity, Matryoshka cuts."""

from __future__ import annotations

import math
import struct

import pytest

from services.embedder.answer import answer
from services.embedder.vectors import embed, normalized, to_float32_le, truncated
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import EmbedTokens

SIZE = 1024
TEXT = tuple(range(1000, 1040))
EDITED = (*TEXT[:20], 77, *TEXT[21:])
"""``TEXT`` with one token replaced."""
UNRELATED = tuple(range(5000, 5040))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


class TestEmbed:
    def test_equal_ids_give_equal_vectors(self) -> None:
        assert embed(TEXT, SIZE) == embed(list(TEXT), SIZE)

    def test_vectors_have_unit_length_and_the_asked_size(self) -> None:
        vector = embed(TEXT, SIZE)
        assert (len(vector), round(norm(vector), 9)) == (SIZE, 1.0)

    def test_a_similar_text_is_closer_than_an_unrelated_one(self) -> None:
        base = embed(TEXT, SIZE)
        similar, unrelated = cosine(base, embed(EDITED, SIZE)), cosine(base, embed(UNRELATED, SIZE))
        assert similar > 0.8
        assert abs(unrelated) < 0.2

    def test_order_matters(self) -> None:
        assert cosine(embed(TEXT, SIZE), embed(TEXT[::-1], SIZE)) < 0.9

    def test_one_token_still_gives_a_unit_vector(self) -> None:
        assert round(norm(embed((42,), SIZE)), 9) == 1.0

    def test_no_tokens_give_the_first_basis_vector(self) -> None:
        assert embed((), 4) == [1.0, 0.0, 0.0, 0.0]

    def test_size_below_one_is_refused(self) -> None:
        with pytest.raises(ValueError, match="size must be at least 1"):
            embed(TEXT, 0)


class TestTruncated:
    def test_keeps_the_first_values_renormalized(self) -> None:
        vector = embed(TEXT, SIZE)
        short = truncated(vector, 32)
        scale = norm(vector[:32])
        assert short == pytest.approx([v / scale for v in vector[:32]])
        assert round(norm(short), 9) == 1.0

    @pytest.mark.parametrize("dimensions", [None, SIZE, SIZE + 5])
    def test_none_or_the_whole_size_keeps_everything(self, dimensions: int | None) -> None:
        vector = embed(TEXT, SIZE)
        assert truncated(vector, dimensions) == vector

    def test_one_dimension_is_plus_or_minus_one(self) -> None:
        assert truncated(embed(TEXT, SIZE), 1) in ([1.0], [-1.0])

    def test_short_cuts_keep_similar_texts_close(self) -> None:
        a, b = truncated(embed(TEXT, SIZE), 16), truncated(embed(EDITED, SIZE), 16)
        assert cosine(a, b) > 0.8

    def test_short_cuts_still_tell_single_tokens_apart(self) -> None:
        cuts = {tuple(truncated(embed((token,), SIZE), 8)) for token in range(100)}
        assert len(cuts) > 90

    def test_zero_dimensions_are_refused(self) -> None:
        with pytest.raises(ValueError, match="dimensions must be at least 1"):
            truncated([1.0, 0.0], 0)


def test_normalized_scales_to_unit_length() -> None:
    assert normalized([3.0, 4.0]) == [0.6, 0.8]


def test_float32_bytes_are_little_endian_one_vector_after_another() -> None:
    data = to_float32_le([[1.0, -2.0], [0.5, 0.25]])
    assert data == struct.pack("<4f", 1.0, -2.0, 0.5, 0.25)


class TestAnswer:
    def request(self, **fields: object) -> EmbedTokens:
        base: dict[str, object] = {
            "request_id": "r1",
            "model": "m",
            "reply_to": "inbox",
            "token_ids": (TEXT, (7, 8)),
        }
        return EmbedTokens(**{**base, **fields})  # type: ignore[arg-type]

    def test_one_vector_per_input_in_order(self) -> None:
        result = answer(self.request(), model="m", size=8, worker_id="w1")
        first = list(struct.unpack_from("<8f", result.vectors, 0))
        second = list(struct.unpack_from("<8f", result.vectors, 32))
        assert (result.count, result.dimensions, result.worker_id) == (2, 8, "w1")
        assert first == pytest.approx(embed(TEXT, 8), abs=1e-7)
        assert second == pytest.approx(embed((7, 8), 8), abs=1e-7)

    def test_prompt_tokens_count_every_input(self) -> None:
        assert answer(self.request(), model="m", size=8, worker_id="w").prompt_tokens == 42

    def test_dimensions_cut_every_vector(self) -> None:
        result = answer(self.request(dimensions=3), model="m", size=8, worker_id="w")
        assert (result.dimensions, len(result.vectors)) == (3, 2 * 3 * 4)

    def test_another_model_is_404(self) -> None:
        with pytest.raises(ModelNotFound):
            answer(self.request(model="other"), model="m", size=8, worker_id="w")

    @pytest.mark.parametrize("dimensions", [0, 9])
    def test_dimensions_outside_one_to_the_size_are_400(self, dimensions: int) -> None:
        with pytest.raises(InvalidRequest, match="between 1 and 8"):
            answer(self.request(dimensions=dimensions), model="m", size=8, worker_id="w")

    def test_an_input_without_tokens_is_400(self) -> None:
        with pytest.raises(InvalidRequest, match="no tokens"):
            answer(self.request(token_ids=((1,), ())), model="m", size=8, worker_id="w")
