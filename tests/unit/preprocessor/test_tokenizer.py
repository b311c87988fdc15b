"""Model assets built from registry bytes: tokenizer, templates, special tokens, limits."""

from __future__ import annotations

import json

import pytest

from services.preprocessor.tokenizer import (
    ModelAssets,
    chat_templates,
    load_assets,
    special_tokens,
)
from shared.errors import InternalError
from shared.messages import ModelCard

from .conftest import QWEN, QWEN_EOS

CARD = ModelCard(model=QWEN, context_length=40960, eos_token_ids=QWEN_EOS)


def test_qwen_special_tokens_leave_out_unset_ones(qwen_assets: ModelAssets) -> None:
    assert (
        qwen_assets.special_tokens["eos_token"],
        qwen_assets.special_tokens["pad_token"],
        "bos_token" in qwen_assets.special_tokens,
    ) == ("<|im_end|>", "<|endoftext|>", False)


def test_vocab_size_is_the_larger_of_tokenizer_and_model(qwen_assets: ModelAssets) -> None:
    assert qwen_assets.vocab_size == 151936  # config.json; the tokenizer has 151669


def test_limits_come_from_the_card(qwen_assets: ModelAssets) -> None:
    assert (qwen_assets.context_length, qwen_assets.eos_token_ids) == (40960, QWEN_EOS)


def test_max_model_len_overrides_the_card(qwen_files: dict[str, bytes]) -> None:
    assert load_assets(CARD, qwen_files, max_model_len=2048).context_length == 2048


def test_added_token_dicts_become_their_content() -> None:
    config = {"bos_token": {"content": "<s>", "lstrip": False}, "unk_token": None}
    assert special_tokens(config) == {"bos_token": "<s>"}


def test_named_chat_templates() -> None:
    config = {"chat_template": [{"name": "default", "template": "d"}, {"name": "rag"}]}
    assert chat_templates(config) == {"default": "d"}


def test_missing_tokenizer_is_an_internal_error() -> None:
    with pytest.raises(InternalError, match=r"no tokenizer\.json"):
        load_assets(CARD, {})


def test_broken_tokenizer_is_an_internal_error() -> None:
    with pytest.raises(InternalError, match=r"unreadable tokenizer\.json"):
        load_assets(CARD, {"tokenizer.json": b"{not json"})


def test_broken_template_fails_at_load(qwen_files: dict[str, bytes]) -> None:
    config = json.dumps({"chat_template": "{% if %}"}).encode()
    with pytest.raises(InternalError, match="does not compile"):
        load_assets(CARD, {**qwen_files, "tokenizer_config.json": config})


def test_encode_keeps_special_tokens_whole(qwen_assets: ModelAssets) -> None:
    assert qwen_assets.encode("<|im_start|>user", add_special_tokens=False) == [151644, 872]
