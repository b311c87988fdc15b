"""The vLLM worker's prompt with images (decision 032), as vLLM's ``TokensPrompt``
(``vllm/inputs/data.py``: ``prompt_token_ids``, ``multi_modal_data``, ``multi_modal_uuids``,
``cache_salt``): each image's expanded placeholders collapse back to one token, which vLLM's
multimodal processor expands again (``vllm/multimodal/processing/processor.py``,
``_maybe_apply_prompt_updates`` for a token prompt)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from services.vllm_worker.prompt import collapsed_token_ids, pil_image, tokens_prompt
from shared.messages import ImageInput, SamplingParams
from shared.worker.records import EngineError, EngineInput
from tests.fakes.vllm_fakes import FakeAsyncLLM, inprocess_engine

PAD = 151655
RED = ImageInput(mm_hash="a" * 64, offset=2, length=4, width=56, height=56, data=b"red")
BLUE = ImageInput(mm_hash="b" * 64, offset=8, length=2, width=28, height=56, data=b"blue")
TOKENS = (10, 11, PAD, PAD, PAD, PAD, 12, 13, PAD, PAD, 14)


def request(**fields: Any) -> EngineInput:
    base: dict[str, Any] = {
        "request_id": "r",
        "token_ids": TOKENS,
        "sampling": SamplingParams(max_tokens=2),
        "hash_seed": 1337,
        "images": (RED, BLUE),
    }
    return EngineInput(**{**base, **fields})


def test_each_image_s_placeholders_collapse_to_one_token() -> None:
    assert collapsed_token_ids(request()) == [10, 11, PAD, 12, 13, PAD, 14]


def test_a_prompt_without_images_is_its_tokens() -> None:
    prompt = tokens_prompt(request(images=()), salt=None, load_image=bytes)
    assert prompt == {"prompt_token_ids": list(TOKENS)}


def test_images_are_multi_modal_data_with_their_ids_as_uuids() -> None:
    prompt = tokens_prompt(request(), salt="s", load_image=lambda data: ("loaded", data))
    assert prompt["multi_modal_data"] == {"image": [("loaded", b"red"), ("loaded", b"blue")]}
    assert prompt["multi_modal_uuids"] == {"image": ["a" * 64, "b" * 64]}
    assert prompt["cache_salt"] == "s"


def test_an_image_outside_the_prompt_is_an_engine_error() -> None:
    stray = ImageInput(mm_hash="c" * 64, offset=9, length=5, width=1, height=1)
    with pytest.raises(EngineError, match="outside the prompt"):
        collapsed_token_ids(request(images=(stray,)))


def test_pil_image_decodes_to_rgb_and_refuses_garbage() -> None:
    out = io.BytesIO()
    Image.new("L", (5, 3)).save(out, "PNG")
    image = pil_image(out.getvalue())
    assert (image.mode, image.size) == ("RGB", (5, 3))
    with pytest.raises(EngineError, match="could not be decoded"):
        pil_image(b"not an image")


async def test_the_engine_hands_vllm_the_images() -> None:
    llm = FakeAsyncLLM()
    engine = inprocess_engine(llm)
    await engine.start()
    try:
        png = io.BytesIO()
        Image.new("RGB", (56, 56)).save(png, "PNG")
        image = ImageInput(
            mm_hash="d" * 64, offset=2, length=4, width=56, height=56, data=png.getvalue()
        )
        tokens = (10, 11, PAD, PAD, PAD, PAD, 12)
        async for _ in engine.stream(request(token_ids=tokens, images=(image,))):
            pass
    finally:
        await engine.stop()
    _, prompt, _ = llm.requests[0]
    assert prompt["prompt_token_ids"] == [10, 11, PAD, 12]
    (loaded,) = prompt["multi_modal_data"]["image"]
    assert (loaded.mode, loaded.size) == ("RGB", (56, 56))
    assert prompt["multi_modal_uuids"] == {"image": ["d" * 64]}
