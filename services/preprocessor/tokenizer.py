"""One model's tokenizer, chat templates and limits, built from its registry files (bytes only).

``load_assets`` is CPU bound (~0.5 s for Qwen3's 11 MB tokenizer.json); callers run it off the
event loop. Encoding goes through ``encode_batch_fast``, which skips offsets and releases the
GIL, so long prompts can be tokenized on a worker thread in parallel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from services.preprocessor import chat_template
from services.preprocessor.segments import SegmentEncoder
from shared.errors import InternalError
from shared.messages import ModelCard, VisionSpec

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CONFIG = "config.json"
WANTED_FILES = (TOKENIZER_JSON, TOKENIZER_CONFIG, CONFIG)
"""Registry files the preprocessor reads; only ``tokenizer.json`` is required."""

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)
"""transformers' ``special_tokens_map`` keys, handed to chat templates."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelAssets:
    """Everything needed to turn one model's requests into token ids."""

    model: str
    tokenizer: Tokenizer
    context_length: int
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    """Ids at or above this are rejected (max of the tokenizer's and the model's vocab)."""
    chat_templates: Mapping[str, str] = field(default_factory=dict)
    """Template sources by name (``default``, ``tool_use``, ...); empty = no chat template."""
    special_tokens: Mapping[str, Any] = field(default_factory=dict)
    segments: SegmentEncoder | None = None
    """Piecewise encoder with a cache of long pieces (shared system prompts), when verified."""
    tool_parser: str = ""
    """The model's tool-call syntax (``ModelCard.tool_parser``; empty: none)."""
    reasoning_parser: str = ""
    """The model's reasoning syntax (``ModelCard.reasoning_parser``; empty: none)."""
    kv_block_size: int = 0
    """``ModelCard.kv_block_size``: prompts are block-hashed at this size for the router."""
    vision: VisionSpec | None = None
    """``ModelCard.vision``: the model's image rule (``None``: it takes text only)."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of ``text``."""
        if self.segments is not None and not add_special_tokens:
            return self.segments.encode(text)
        ids: list[int] = self.tokenizer.encode_batch_fast(
            [text], add_special_tokens=add_special_tokens
        )[0].ids
        return ids

    def uncached_chars(self, text: str) -> int:
        """The characters ``encode(text, add_special_tokens=False)`` would tokenize afresh."""
        return self.segments.uncached_chars(text) if self.segments is not None else len(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept (for ``echo``)."""
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return text


def load_assets(
    card: ModelCard, files: Mapping[str, bytes], *, max_model_len: int = 0
) -> ModelAssets:
    """Build a model's assets from its card and registry files; compile its templates.

    Raises:
        InternalError: ``tokenizer.json`` is missing or broken, or a template does not compile.
    """
    raw = files.get(TOKENIZER_JSON)
    if not raw:
        raise InternalError(f"model {card.model!r} has no tokenizer.json in the registry")
    try:
        tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise InternalError(f"model {card.model!r} has an unreadable tokenizer.json") from exc
    tok_config = _json_object(files.get(TOKENIZER_CONFIG))
    templates = chat_templates(tok_config)
    for source in templates.values():
        chat_template.compile_template(source)
    model_vocab = _json_object(files.get(CONFIG)).get("vocab_size")
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if isinstance(model_vocab, int):
        vocab_size = max(vocab_size, model_vocab)
    segments = SegmentEncoder(tokenizer)
    return ModelAssets(
        segments=segments if segments.verified() else None,
        model=card.model,
        tokenizer=tokenizer,
        context_length=max_model_len or card.context_length,
        eos_token_ids=card.eos_token_ids,
        vocab_size=vocab_size,
        chat_templates=templates,
        special_tokens=special_tokens(tok_config),
        tool_parser=card.tool_parser,
        reasoning_parser=card.reasoning_parser,
        kv_block_size=card.kv_block_size,
        vision=card.vision,
    )


def chat_templates(tok_config: Mapping[str, Any]) -> dict[str, str]:
    """``chat_template`` of tokenizer_config.json: one string, or a list of named templates."""
    value = tok_config.get("chat_template")
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {
            item["name"]: item["template"]
            for item in value
            if isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("template"), str)
        }
    return {}


def special_tokens(tok_config: Mapping[str, Any]) -> dict[str, Any]:
    """The special tokens map as transformers builds it (strings; unset ones left out)."""
    result: dict[str, Any] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = tok_config.get(key)
        if key == "additional_special_tokens" and isinstance(value, list):
            result[key] = [t for t in map(_token_text, value) if t is not None]
            continue
        text = _token_text(value)
        if text is not None:
            result[key] = text
    return result


def _token_text(value: Any) -> str | None:
    # A token is either its text or an AddedToken dict {"content": ..., ...}.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _json_object(raw: bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
