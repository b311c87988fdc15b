"""Fixtures of the engine tests: a tiny random-weight Qwen3 model directory (2 layers, hidden 64)
with the real Qwen3 tokenizer files, so the whole stack can serve it.

``make test-engines`` installs ``.[hf]`` (torch, transformers) first; in a plain ``make test``
without them, the modules that need torch are skipped at import (``pytest.importorskip``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_dir import TINY_QWEN3, ensure_default_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("tiny-qwen3"), TINY_QWEN3)
