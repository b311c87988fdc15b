"""Pure: a chat request's images — where they are, whether they may be read, what they are, how
many tokens each makes, and their placeholders expanded in the prompt (decision 032).

The gateway puts every image of a request in its messages as an OpenAI ``image_url`` part with
the ``param`` naming it as the client sent it (``messages[0].content[1]``, ``input[2].content[0]``).
Every refusal here is a 400 whose message starts with that name. The token count follows the
Qwen2-VL rule (``VisionSpec``): the image is resized to multiples of ``patch_size *
merge_size`` pixels, within ``min_pixels`` and ``max_pixels``, keeping its aspect ratio; it makes
``(height / factor) * (width / factor)`` tokens.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from services.preprocessor.image_header import NotAnImage, read_header
from shared.errors import InvalidRequest
from shared.images import image_id
from shared.messages import ImageInput, VisionSpec

IMAGE_PART = "image_url"
"""The part type images travel as from the gateway (every API's image parts become one)."""
MAX_ASPECT_RATIO = 200
"""Qwen2-VL's image processor refuses images longer than 200 times their width (or height)."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image part of a request: where it is in the client's body, and its URL."""

    param: str
    url: str


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """The preprocessor's settings on images."""

    max_images: int = 8
    max_bytes: int = 10_000_000
    url_domains: frozenset[str] = frozenset()
    """Hosts whose http(s) URLs may be fetched; ``*`` = any; empty = none (``data:`` only)."""


@dataclass(frozen=True, slots=True)
class LoadedImage:
    """An image read and measured: its bytes, size and token count."""

    param: str
    data: bytes
    format: str
    width: int
    height: int
    tokens: int
    mm_hash: str


def refused(param: str, why: str) -> InvalidRequest:
    """A 400 whose message names the part (Anthropic's error body has no ``param``)."""
    return InvalidRequest(f"`{param}`: {why}", param=param)


def image_refs(messages: Sequence[Mapping[str, Any]]) -> list[ImageRef]:
    """The image parts of ``messages``, in prompt order."""
    refs: list[ImageRef] = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list | tuple):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != IMAGE_PART:
                continue
            param = part.get("param")
            param = param if isinstance(param, str) and param else f"messages[{i}].content[{j}]"
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, Mapping) else None
            if not isinstance(url, str) or not url:
                raise refused(param, "an image part needs `image_url.url`.")
            refs.append(ImageRef(param, url))
    return refs


def check_refs(
    refs: Sequence[ImageRef], *, model: str, vision: VisionSpec | None, limits: ImageLimits
) -> None:
    """Refuse, before anything is read or fetched: images for a text-only model, too many
    images, and URLs of a scheme or host that is not allowed."""
    if not refs:
        return
    if vision is None:
        raise refused(refs[0].param, f"the model `{model}` does not take images.")
    if len(refs) > limits.max_images:
        raise refused(
            refs[limits.max_images].param,
            f"too many images: at most {limits.max_images} per request.",
        )
    for ref in refs:
        if ref.url.startswith("data:"):
            continue
        parts = urlsplit(ref.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise refused(ref.param, "the image URL must be a `data:` URL or an http(s) URL.")
        if not is_allowed_host(parts.hostname, limits.url_domains):
            raise refused(
                ref.param,
                f"image URLs on `{parts.hostname}` are not allowed here; send the image as a "
                "`data:` URL (base64).",
            )


def is_allowed_host(host: str, domains: frozenset[str]) -> bool:
    """True when ``host`` is one of ``domains`` or under one of them (``*``: any host)."""
    host = host.lower().rstrip(".")
    return "*" in domains or any(host == d or host.endswith(f".{d}") for d in domains)


def decode_data_url(ref: ImageRef, max_bytes: int) -> bytes:
    """The bytes of a ``data:[<type>];base64,<data>`` URL (too large: 400 before decoding)."""
    head, sep, payload = ref.url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise refused(ref.param, "a `data:` image URL must be base64 (`data:image/png;base64,…`).")
    media_type = head[len("data:") : -len(";base64")].split(";")[0].strip().lower()
    if media_type and not media_type.startswith("image/"):
        raise refused(ref.param, f"`{media_type}` is not an image type.")
    if len(payload) // 4 * 3 > max_bytes + 2:
        raise too_large(ref.param, max_bytes)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise refused(ref.param, "the `data:` URL is not valid base64.") from None
    if len(data) > max_bytes:
        raise too_large(ref.param, max_bytes)
    return data


def too_large(param: str, max_bytes: int) -> InvalidRequest:
    return refused(param, f"the image is larger than {max_bytes} bytes.")


def measure(ref: ImageRef, data: bytes, vision: VisionSpec) -> LoadedImage:
    """Read an image's header and count its tokens; 400 for what is not an image."""
    try:
        header = read_header(data)
    except NotAnImage as exc:
        raise refused(ref.param, f"the image could not be read: {exc}.") from None
    return LoadedImage(
        param=ref.param,
        data=data,
        format=header.format,
        width=header.width,
        height=header.height,
        tokens=image_tokens(header.width, header.height, vision, param=ref.param),
        mm_hash=image_id(data),
    )


def resized(width: int, height: int, vision: VisionSpec, *, param: str = "") -> tuple[int, int]:
    """The (width, height) the model sees: the nearest multiples of ``patch_size *
    merge_size``, scaled (aspect kept) into ``min_pixels``..``max_pixels``."""
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise refused(
            param, f"a {width}x{height} image is too narrow (aspect ratio over {MAX_ASPECT_RATIO})."
        )
    factor = vision.patch_size * vision.merge_size
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > vision.max_pixels:
        beta = math.sqrt(height * width / vision.max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < vision.min_pixels:
        beta = math.sqrt(vision.min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return w, h


def image_tokens(width: int, height: int, vision: VisionSpec, *, param: str = "") -> int:
    """How many placeholder tokens a ``width`` x ``height`` image makes."""
    factor = vision.patch_size * vision.merge_size
    w, h = resized(width, height, vision, param=param)
    return (h // factor) * (w // factor)


def expand_placeholders(
    token_ids: Sequence[int], images: Sequence[LoadedImage], image_token_id: int
) -> tuple[tuple[int, ...], tuple[ImageInput, ...]]:
    """The prompt with each image's one placeholder token repeated ``tokens`` times, and each
    image's place in it. The template renders one placeholder per image part, in order; any
    other count means message text spelled the placeholder itself (a 400)."""
    positions = [i for i, t in enumerate(token_ids) if t == image_token_id]
    if len(positions) != len(images):
        raise InvalidRequest(
            f"the prompt holds {len(positions)} image placeholder tokens for {len(images)} "
            "images: message text must not contain the model's image placeholder",
            param="messages",
        )
    out: list[int] = []
    inputs: list[ImageInput] = []
    start = 0
    for at, image in zip(positions, images, strict=True):
        out.extend(token_ids[start:at])
        inputs.append(
            ImageInput(
                mm_hash=image.mm_hash,
                offset=len(out),
                length=image.tokens,
                width=image.width,
                height=image.height,
                data=image.data,
            )
        )
        out.extend([image_token_id] * image.tokens)
        start = at + 1
    out.extend(token_ids[start:])
    return tuple(out), tuple(inputs)
