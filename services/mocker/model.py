"""What every worker of a mocker process serves, read once from the model directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.mocker.config import MockerConfig
from services.mocker.corpus import corpus_token_ids
from shared.model_dir import context_length, eos_token_ids


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The model directory, the tokenized corpus, EOS ids and the context length."""

    model_dir: Path
    corpus: tuple[int, ...]
    eos_token_ids: tuple[int, ...]
    context_length: int
    created: int
    """The model's ``created`` time (its files' newest mtime): the same for every worker that
    serves this directory, so they all publish the same card."""


def load_model_info(config: MockerConfig) -> ModelInfo:
    """Resolve the model directory, tokenize the corpus, read EOS ids and context length."""
    model_dir = config.resolved_model_dir()
    return ModelInfo(
        model_dir=model_dir,
        corpus=corpus_token_ids(model_dir),
        eos_token_ids=eos_token_ids(model_dir),
        context_length=config.context_length or context_length(model_dir),
        created=model_created(model_dir),
    )


def model_created(model_dir: Path) -> int:
    """The newest mtime of the directory's files, in whole seconds."""
    times = [p.stat().st_mtime for p in model_dir.iterdir() if p.is_file()]
    return int(max(times, default=model_dir.stat().st_mtime))
