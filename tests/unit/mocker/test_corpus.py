"""The built-in corpus tokenizes to about a thousand plain-text tokens with the Qwen3 tokenizer."""

from __future__ import annotations

from pathlib import Path

from services.mocker.corpus import corpus_token_ids
from shared.model_dir import ensure_default_model_dir, eos_token_ids


def test_corpus_is_about_a_thousand_tokens_without_eos(tmp_path: Path) -> None:
    model_dir = ensure_default_model_dir(tmp_path / "model")
    ids = corpus_token_ids(model_dir)
    assert 900 <= len(ids) <= 1200
    assert not set(ids) & set(eos_token_ids(model_dir))
