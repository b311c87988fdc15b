"""Chaos fixtures: the weightless Qwen3 model directory every scenario's mockers serve."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.model_dir import ensure_default_model_dir


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("model"))
