"""Piecewise encoding with a cache of long pieces gives exactly the whole-text ids."""

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from services.preprocessor.segments import SegmentEncoder
from services.preprocessor.tokenizer import ModelAssets
from tests.support import eventually

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


class _GatedTokenizer:
    """The real tokenizer, but encoding a long text waits until the test opens the gate."""

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self.gate = threading.Event()
        self.long_calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._tokenizer, name)

    def encode_batch_fast(self, texts: list[str], **kw: object) -> object:
        if len(texts[0]) >= 1024:
            self.long_calls += 1
            assert self.gate.wait(10), "the gate was never opened"
        return self._tokenizer.encode_batch_fast(texts, **kw)  # type: ignore[attr-defined]


def test_concurrent_requests_with_a_new_system_prompt_encode_it_once(
    qwen_assets: ModelAssets,
) -> None:
    gated = _GatedTokenizer(qwen_assets.tokenizer)
    encoder = SegmentEncoder(gated)
    system = " ".join(random.Random(2).choice(WORDS) for _ in range(600))
    texts = [
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nq {i}<|im_end|>\n"
        for i in range(6)
    ]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(encoder.encode, t) for t in texts]
        eventually(
            lambda: encoder.hits == 5,
            interval_s=0.005,
            message="five of them find the first one's encode pending",
        )
        gated.gate.set()
        results = [f.result(timeout=10) for f in futures]
    assert results == [_whole(qwen_assets, t) for t in texts]
    assert (gated.long_calls, encoder.misses, encoder.hits) == (1, 1, 5)


def test_a_failed_encode_fails_its_waiters_and_is_not_cached(qwen_assets: ModelAssets) -> None:
    class Broken(_GatedTokenizer):
        def encode_batch_fast(self, texts: list[str], **kw: object) -> object:
            if len(texts[0]) >= 1024:
                raise RuntimeError("tokenizer exploded")
            return super().encode_batch_fast(texts, **kw)

    encoder = SegmentEncoder(Broken(qwen_assets.tokenizer))
    text = "<|im_start|>system\n" + "word " * 400 + "<|im_end|>\n"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="exploded"):
            encoder.encode(text)
    assert encoder.misses == 0


def test_uncached_chars_counts_what_encode_would_tokenize_afresh(
    encoder: SegmentEncoder,
) -> None:
    system = "word " * 100  # a 500-char piece, cached after the first encode
    text = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert encoder.uncached_chars(text) == len(text)
    encoder.encode(text)
    piece = len(f"system\n{system}")
    assert encoder.uncached_chars(text) == len(text) - piece
    assert encoder.uncached_chars("short") == 5
