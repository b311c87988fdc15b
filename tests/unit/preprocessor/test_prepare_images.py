"""A chat request with images through the real tokenizer and the shipped VL chat template: the
placeholders rendered, expanded to each image's token count, and folded into the block hashes
(decision 032)."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from services.preprocessor.images import ImageRef, LoadedImage, measure
from services.preprocessor.prepare import generate, prepare, rendered_chat
from services.preprocessor.tokenizer import WANTED_FILES, ModelAssets, load_assets
from shared.hashing import prefix_hashes
from shared.messages import ModelCard, Preprocess, VisionSpec
from shared.vision_model import VISION_MODEL_NAME, ensure_vision_model_dir, vision_spec

BLOCK = 16


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_vision_model_dir(tmp_path_factory.mktemp("qwen-vl"))


@pytest.fixture(scope="module")
def vision(vl_dir: Path) -> VisionSpec:
    spec = vision_spec(vl_dir)
    assert spec is not None
    return spec


@pytest.fixture(scope="module")
def vl_assets(vl_dir: Path, vision: VisionSpec) -> ModelAssets:
    files = {name: (vl_dir / name).read_bytes() for name in WANTED_FILES}
    card = ModelCard(
        model=VISION_MODEL_NAME, context_length=128000, kv_block_size=BLOCK, vision=vision
    )
    return load_assets(card, files)


def png(width: int, height: int, colour: tuple[int, int, int] = (1, 2, 3)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def chat(*, with_image: bool = True) -> Preprocess:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is in this picture?"}]
    if with_image:
        url = "data:image/png;base64," + base64.b64encode(b"unused").decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return Preprocess(
        request_id="r",
        api="chat",
        model=VISION_MODEL_NAME,
        reply_to="x",
        created=0,
        messages=({"role": "user", "content": parts},),
        max_tokens=8,
    )


def image(data: bytes, vision: VisionSpec) -> LoadedImage:
    return measure(ImageRef("messages[0].content[1]", "data:"), data, vision)


def test_the_template_renders_one_placeholder_per_image(vl_assets: ModelAssets) -> None:
    text = rendered_chat(chat(), vl_assets)
    assert "What is in this picture?<|vision_start|><|image_pad|><|vision_end|>" in text


def test_prompt_tokens_count_each_image_by_its_size(
    vl_assets: ModelAssets, vision: VisionSpec
) -> None:
    picture = image(png(448, 224), vision)
    with_image = prepare(chat(), vl_assets, images=[picture])
    text_only = prepare(chat(with_image=False), vl_assets)
    # the vision start and end tokens, and (448 / 28) * (224 / 28) placeholders
    assert with_image.prompt_tokens - text_only.prompt_tokens == 2 + 16 * 8


def test_the_image_s_place_is_its_run_of_placeholders(
    vl_assets: ModelAssets, vision: VisionSpec
) -> None:
    prepared = prepare(chat(), vl_assets, images=[image(png(56, 56), vision)])
    (placed,) = prepared.images
    run = prepared.token_ids[placed.offset : placed.offset + placed.length]
    assert run == (vision.image_token_id,) * placed.length
    assert prepared.token_ids[placed.offset - 1] != vision.image_token_id
    assert prepared.token_ids[placed.offset + placed.length] != vision.image_token_id


def test_block_hashes_fold_the_image_in(vl_assets: ModelAssets, vision: VisionSpec) -> None:
    picture = image(png(448, 224), vision)
    prepared = prepare(chat(), vl_assets, images=[picture])
    plain = prefix_hashes(prepared.token_ids, BLOCK)
    assert prepared.hash_block_size == BLOCK
    assert prepared.block_hashes != tuple(plain)
    first_image_block = prepared.images[0].offset // BLOCK
    assert prepared.block_hashes[:first_image_block] == tuple(plain[:first_image_block])


def test_the_same_image_hashes_alike_and_another_differs(
    vl_assets: ModelAssets, vision: VisionSpec
) -> None:
    red, blue = png(448, 224, (255, 0, 0)), png(448, 224, (0, 0, 255))
    a = prepare(chat(), vl_assets, images=[image(red, vision)])
    again = prepare(chat(), vl_assets, images=[image(red, vision)])
    b = prepare(chat(), vl_assets, images=[image(blue, vision)])
    assert a.token_ids == b.token_ids  # same size: same tokens
    assert a.block_hashes == again.block_hashes
    first_image_block = a.images[0].offset // BLOCK
    assert a.block_hashes[first_image_block:] != b.block_hashes[first_image_block:]


def test_generate_carries_the_images_with_their_bytes(
    vl_assets: ModelAssets, vision: VisionSpec
) -> None:
    data = png(56, 56)
    prepared = prepare(chat(), vl_assets, images=[image(data, vision)])
    gen = generate(chat(), prepared, "s")
    assert [(i.data, i.width, i.height) for i in gen.images] == [(data, 56, 56)]
