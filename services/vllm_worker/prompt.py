"""Pure: a request as vLLM's ``TokensPrompt`` (``vllm/inputs/data.py``), images included.

A ``TokensPrompt`` is a dict: ``prompt_token_ids``, and optionally ``cache_salt``,
``multi_modal_data`` (``{"image": [PIL images]}``, ``vllm/multimodal/inputs.py``'s
``MultiModalDataDict``) and ``multi_modal_uuids`` (``{"image": [ids]}``: vLLM uses them instead of
hashing the pixels, for its prefix and encoder caches and its KV events' extra keys).

Placeholders: JetServe's preprocessor expands each image's ``<|image_pad|>`` to the image's token
count (the router and the usage need the real prompt length). vLLM, given token ids, expands
them itself: for a token prompt its multimodal processor never sees the HF processor apply the
prompt update, so ``_maybe_apply_prompt_updates`` replaces each placeholder token with the
image's feature tokens (``vllm/multimodal/processing/processor.py``: ``_apply_hf_processor_main``
returns ``is_update_applied=False`` for token input). So each image's run of placeholders goes
back to one token here, and vLLM makes it the same count again (decision 032).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from shared.worker.records import EngineError, EngineInput

ImageLoader = Callable[[bytes], Any]
"""An image file's bytes -> what vLLM takes as an image (a ``PIL.Image.Image``)."""


def tokens_prompt(
    request: EngineInput, *, salt: str | None, load_image: ImageLoader
) -> dict[str, Any]:
    """The ``TokensPrompt`` for ``request``: its images as ``multi_modal_data`` with their
    ids as ``multi_modal_uuids``, each one's placeholder run collapsed to one token."""
    prompt: dict[str, Any] = {"prompt_token_ids": collapsed_token_ids(request)}
    if salt is not None:
        prompt["cache_salt"] = salt
    if request.images:
        prompt["multi_modal_data"] = {"image": [load_image(i.data) for i in request.images]}
        prompt["multi_modal_uuids"] = {"image": [i.mm_hash for i in request.images]}
    return prompt


def collapsed_token_ids(request: EngineInput) -> list[int]:
    """``request.token_ids`` with each image's placeholder tokens as one token."""
    ids = request.token_ids
    if not request.images:
        return list(ids)
    out: list[int] = []
    start = 0
    for image in sorted(request.images, key=lambda i: i.offset):
        end = image.offset + image.length
        if image.offset < start or end > len(ids) or image.length < 1:
            raise EngineError("an image's placeholder tokens are outside the prompt")
        out.extend(ids[start : image.offset + 1])
        start = end
    out.extend(ids[start:])
    return out


def pil_image(data: bytes) -> Any:
    """An image file as a RGB ``PIL.Image.Image``, as vLLM's ``ImageMediaIO`` loads one."""
    from PIL import Image  # vLLM depends on Pillow; only this worker needs it

    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (OSError, ValueError) as exc:
        raise EngineError(f"an image could not be decoded: {exc}") from exc
    return image.convert("RGB")
