"""Piecewise encoding with a cache of long pieces gives exactly the whole-text ids."""

import random

import pytest

from services.preprocessor.segments import SegmentEncoder
from services.preprocessor.tokenizer import ModelAssets

WORDS = [
    "the",
    "of",
    "and",
    "river",
    "stone",
    "light",
    "garden",
    "naïve",
    "café",
    "🙂",
    "über",
    "1234",
    "--",
    "\n\t",
    "ok,",
    "fine.",
]


def _chat(rng: random.Random, system_words: int, user_words: int) -> str:
    system = " ".join(rng.choice(WORDS) for _ in range(system_words))
    user = " ".join(rng.choice(WORDS) for _ in range(user_words))
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.fixture
def encoder(qwen_assets: ModelAssets) -> SegmentEncoder:
    return SegmentEncoder(qwen_assets.tokenizer, min_chars=64)


def _whole(qwen_assets: ModelAssets, text: str) -> list[int]:
    return qwen_assets.tokenizer.encode(text, add_special_tokens=False).ids


def test_the_qwen3_tokenizer_passes_the_probe(qwen_assets: ModelAssets) -> None:
    assert qwen_assets.segments is not None


@pytest.mark.parametrize("seed", range(20))
def test_piecewise_ids_equal_whole_text_ids(
    encoder: SegmentEncoder, qwen_assets: ModelAssets, seed: int
) -> None:
    rng = random.Random(seed)
    text = _chat(rng, rng.randrange(0, 400), rng.randrange(0, 400))
    assert encoder.encode(text) == _whole(qwen_assets, text)


def test_a_repeated_system_prompt_is_tokenized_once(
    encoder: SegmentEncoder, qwen_assets: ModelAssets
) -> None:
    rng = random.Random(1)
    system = " ".join(rng.choice(WORDS) for _ in range(500))
    texts = [
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nquestion {i}<|im_end|>\n"
        for i in range(5)
    ]
    assert [encoder.encode(t) for t in texts] == [_whole(qwen_assets, t) for t in texts]
    assert (encoder.misses, encoder.hits) == (1, 4)


def test_text_without_special_tokens_is_encoded_whole(
    encoder: SegmentEncoder, qwen_assets: ModelAssets
) -> None:
    text = "plain text " * 50
    assert encoder.encode(text) == _whole(qwen_assets, text)
    assert encoder.hits == 0


def test_the_cache_keeps_at_most_max_entries(qwen_assets: ModelAssets) -> None:
    encoder = SegmentEncoder(qwen_assets.tokenizer, min_chars=8, max_entries=2)
    for i in range(5):
        encoder.encode(f"<|im_start|>system\nsystem prompt number {i}<|im_end|>\n")
    encoder.encode("<|im_start|>system\nsystem prompt number 0<|im_end|>\n")
    assert encoder.hits == 0  # number 0 was evicted long ago
