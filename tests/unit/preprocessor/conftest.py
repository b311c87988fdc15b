"""Fixtures: the real Qwen3 tokenizer and chat template, loaded once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.preprocessor.tokenizer import WANTED_FILES, ModelAssets, load_assets
from shared.messages import ModelCard
from shared.model_dir import ensure_default_model_dir

QWEN = "Qwen/Qwen3-0.6B"
QWEN_EOS = (151645, 151643)


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="session")
def qwen_files(qwen_dir: Path) -> dict[str, bytes]:
    return {name: (qwen_dir / name).read_bytes() for name in WANTED_FILES}


@pytest.fixture(scope="session")
def qwen_template(qwen_dir: Path) -> str:
    config = json.loads((qwen_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    template: str = config["chat_template"]
    return template


@pytest.fixture(scope="session")
def qwen_assets(qwen_files: dict[str, bytes]) -> ModelAssets:
    card = ModelCard(model=QWEN, context_length=40960, eos_token_ids=QWEN_EOS)
    return load_assets(card, qwen_files)
