"""A model directory's image rule (``vision_spec``) and the bundled mock vision model: the
tokenizer's vision tokens, the VL template, the card a worker publishes (decision 032)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.preprocessor.chat_template import render
from shared.model_dir import ensure_default_model_dir
from shared.vision_model import (
    IMAGE_PAD,
    QWEN_VL_CHAT_TEMPLATE,
    VISION_MODEL_NAME,
    ensure_vision_model_dir,
    vision_spec,
)
from shared.worker.config import WorkerConfig
from shared.worker.process import model_card


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_vision_model_dir(tmp_path_factory.mktemp("vl"))


def test_the_bundled_tokenizer_has_qwen_s_vision_tokens(vl_dir: Path) -> None:
    config = json.loads((vl_dir / "tokenizer_config.json").read_text())
    names = {v["content"]: int(k) for k, v in config["added_tokens_decoder"].items()}
    assert (names["<|vision_start|>"], names[IMAGE_PAD], names["<|vision_end|>"]) == (
        151652,
        151655,
        151653,
    )
    assert config["chat_template"] == QWEN_VL_CHAT_TEMPLATE


def test_the_vision_dir_reads_as_qwen2_5_vl_s_rule(vl_dir: Path) -> None:
    spec = vision_spec(vl_dir)
    assert spec is not None
    assert (spec.image_token_id, spec.patch_size, spec.merge_size) == (151655, 14, 2)
    assert (spec.min_pixels, spec.max_pixels) == (3136, 12845056)


def test_a_text_model_has_no_vision(tmp_path: Path) -> None:
    assert vision_spec(ensure_default_model_dir(tmp_path)) is None


def test_size_edges_stand_for_min_and_max_pixels(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"image_token_id": 7}))
    pre = {"patch_size": 16, "merge_size": 2, "size": {"shortest_edge": 100, "longest_edge": 900}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(pre))
    spec = vision_spec(tmp_path)
    assert spec is not None
    assert (spec.patch_size, spec.min_pixels, spec.max_pixels) == (16, 100, 900)


def test_a_worker_s_card_carries_the_rule(vl_dir: Path) -> None:
    config = WorkerConfig(model_path=vl_dir, model_name=VISION_MODEL_NAME)
    assert model_card(config, vl_dir).vision == vision_spec(vl_dir)


def test_the_template_renders_images_between_vision_tokens_in_order() -> None:
    content = [
        {"type": "image"},
        {"type": "text", "text": "and"},
        {"type": "image"},
    ]
    text = render(QWEN_VL_CHAT_TEMPLATE, [{"role": "user", "content": content}])
    image = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"<|im_start|>user\n{image}and{image}<|im_end|>\n" in text
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n")
