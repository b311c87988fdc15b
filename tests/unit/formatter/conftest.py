"""Formatter unit fixtures: the real Qwen3 tokenizer, loaded once per session."""

from __future__ import annotations

from typing import Any

import pytest

from services.formatter.detokenizer import load_tokenizer
from shared.model_dir import ensure_default_model_dir


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model_dir = ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())
