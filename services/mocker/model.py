"""What every worker of a mocker process serves, read once from the model directory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from services.mocker.config import MockerConfig
from services.mocker.corpus import corpus_token_ids, load_tokenizer
from services.mocker.transfer import DEFAULT_KV_BYTES_PER_TOKEN, read_kv_bytes_per_token
from shared.model_dir import context_length, eos_token_ids
from shared.worker.process import model_created

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The model directory, the tokenized corpus, EOS ids, the context length and the
    tokenizer (structured output is written as text, then tokenized with it)."""

    model_dir: Path
    corpus: tuple[int, ...]
    eos_token_ids: tuple[int, ...]
    context_length: int
    created: int
    """The model's ``created`` time (its files' newest mtime): the same for every worker that
    serves this directory, so they all publish the same card."""
    tokenizer: Tokenizer | None = None
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    """KV bytes per token from the model's ``config.json`` (``transfer.kv_bytes_per_token``)."""

    def encode(self, text: str) -> Sequence[int]:
        """Token ids of ``text`` (no special tokens added; added tokens such as
        ``<tool_call>`` are single ids). Without a tokenizer: nothing."""
        if self.tokenizer is None:
            return ()
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids


def load_model_info(config: MockerConfig) -> ModelInfo:
    """Resolve the model directory, tokenize the corpus, read EOS ids and context length."""
    model_dir = config.resolved_model_dir()
    tokenizer = load_tokenizer(model_dir)
    return ModelInfo(
        model_dir=model_dir,
        corpus=corpus_token_ids(model_dir, tokenizer=tokenizer),
        tokenizer=tokenizer,
        eos_token_ids=eos_token_ids(model_dir),
        context_length=config.context_length or context_length(model_dir),
        created=model_created(model_dir),
        kv_bytes_per_token=read_kv_bytes_per_token(model_dir),
    )
