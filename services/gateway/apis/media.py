"""Pure: ``POST /v1/images/generations`` and ``POST /v1/videos/generations`` bodies ->
``MediaGenerate``, and ``MediaResult`` -> the response body (``core/asks.py`` sends them). It goes
straight from the gateway to a worker of the model (as tensor models are: no preprocessor,
router or formatter, nothing is tokenized).

Images follow OpenAI's Images API (``openai.types.ImageGenerateParams`` / ``ImagesResponse``):
``prompt`` (non-empty), ``n`` 1..10, ``size`` one of ``SIZES`` (``auto`` = 1024x1024),
``response_format`` ``url`` (default, as OpenAI's DALL·E models) or ``b64_json``; the ``url``
is a ``data:image/png;base64,...`` URL (nothing is stored, so there is nothing to link to).
Videos follow Dynamo's synchronous ``/v1/videos/generations`` (``NvCreateVideoRequest``:
``seconds``, ``size`` ``WxH`` default 832x480, ``nvext.fps`` / ``num_frames``), not OpenAI's
asynchronous job API (``POST /v1/videos`` then poll, then ``/content``): the mock answers in
one response like Dynamo's frontend. A video is an animated PNG (``image/apng``), the one
animated format the standard library writes honestly. ``seed`` (top level or ``nvext.seed``)
makes the output reproducible; the mock is deterministic anyway.

The model must be registered with the route's kind (404 unknown, 400 another kind, 503 no live
worker).
"""

from __future__ import annotations

import base64
import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from services.gateway.apis.bodies import Decoders
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import MediaGenerate, MediaKind, MediaResult, ModelCard

JSON = "application/json"
IMAGES_PATH = "/v1/images/generations"
VIDEOS_PATH = "/v1/videos/generations"
SIZES: dict[str, tuple[int, int]] = {
    "256x256": (256, 256),
    "512x512": (512, 512),
    "1024x1024": (1024, 1024),
    "1536x1024": (1536, 1024),
    "1024x1536": (1024, 1536),
    "1792x1024": (1792, 1024),
    "1024x1792": (1024, 1792),
}
"""The sizes OpenAI's SDK lists for ``images.generate`` (``auto`` picks 1024x1024)."""
DEFAULT_VIDEO_SIZE = "832x480"
"""Dynamo's default video size."""
MAX_VIDEO_EDGE = 1920
MAX_PROMPT_CHARS = 32_000
"""As OpenAI's GPT image models."""
_WXH = re.compile(r"^([1-9][0-9]{0,4})x([1-9][0-9]{0,4})$")

Count = Annotated[int, Meta(ge=1, le=10)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Fps = Annotated[int, Meta(ge=1, le=120)]
Frames = Annotated[int, Meta(ge=1, le=1000)]
Seconds = Annotated[int, Meta(ge=1, le=60)]
Steps = Annotated[int, Meta(ge=1, le=1000)]
ResponseFormat = Literal["url", "b64_json"]
Quality = Literal["auto", "low", "medium", "high", "xhigh", "max", "standard", "hd"]


class MediaNvext(msgspec.Struct, kw_only=True):
    """Dynamo's ``nvext`` for image and video requests (``fps`` / ``num_frames``: videos)."""

    seed: Seed | None = None
    negative_prompt: str | None = None
    num_inference_steps: Steps | None = None
    guidance_scale: float | None = None
    fps: Fps | None = None
    num_frames: Frames | None = None
    annotations: list[str] | None = None
    """Accepted; the answer is one JSON body, so there is no event stream to annotate."""


class ImageRequest(msgspec.Struct, kw_only=True):
    """OpenAI's ``ImageGenerateParams`` (non-streaming) plus Dynamo's ``nvext`` and ``seed``."""

    prompt: str
    model: str
    n: Count | None = None
    size: str | None = None
    response_format: ResponseFormat | None = None
    quality: Quality | None = None
    style: Literal["vivid", "natural"] | None = None
    """Passed to the worker; the mock draws the same either way."""
    background: Literal["auto", "opaque", "transparent"] | None = None
    output_format: Literal["png", "webp", "jpeg", "gif", "svg"] | None = None
    output_compression: Annotated[int, Meta(ge=0, le=100)] | None = None
    """Accepted, not acted on: for ``jpeg`` / ``webp`` only, and PNG is lossless."""
    moderation: Literal["low", "auto"] | None = None
    """Accepted, not acted on: nothing here moderates prompts."""
    stream: bool | None = None
    partial_images: Annotated[int, Meta(ge=0, le=3)] | None = None
    user: str | None = None
    """Accepted, not acted on (an end-user id for abuse monitoring)."""
    safety_identifier: str | None = None
    """Same purpose as ``user``."""
    seed: Seed | None = None
    nvext: MediaNvext | None = None


class StrictImageRequest(ImageRequest, kw_only=True, forbid_unknown_fields=True):
    """``ImageRequest`` with unknown top-level fields refused (the gateway's default)."""


class VideoRequest(msgspec.Struct, kw_only=True):
    """Dynamo's ``NvCreateVideoRequest`` (``/v1/videos/generations``)."""

    prompt: str
    model: str
    seconds: Seconds | str | None = None
    """Clip length; OpenAI's SDK sends it as a string (``"4"``), Dynamo as an integer."""
    size: str | None = None
    response_format: ResponseFormat | None = None
    output_format: str | None = None
    """A container hint (``mp4``, ``webm``, ...) the model may ignore, as in Dynamo; the mock
    always answers an animated PNG."""
    input_reference: str | None = None
    user: str | None = None
    seed: Seed | None = None
    nvext: MediaNvext | None = None


class StrictVideoRequest(VideoRequest, kw_only=True, forbid_unknown_fields=True):
    """``VideoRequest`` with unknown top-level fields refused (the gateway's default)."""


class ImageData(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One image of OpenAI's ``ImagesResponse`` (``openai.types.Image``)."""

    b64_json: str | None = None
    url: str | None = None
    """A ``data:image/png;base64,...`` URL."""
    revised_prompt: str | None = None


class ImagesResponse(msgspec.Struct, kw_only=True):
    """OpenAI's ``ImagesResponse`` (the fields that apply here)."""

    created: int
    data: list[ImageData]
    output_format: Literal["png"] = "png"
    size: str


class VideoData(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One video: an animated PNG, inline."""

    b64_json: str | None = None
    url: str | None = None
    """A ``data:image/apng;base64,...`` URL."""


class VideoResponse(msgspec.Struct, kw_only=True):
    """Dynamo's video generation response: one completed job, its videos inline."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["completed"] = "completed"
    progress: int = 100
    created: int
    data: list[VideoData]
    inference_time_s: float


_IMAGE_DECODERS = Decoders(StrictImageRequest, ImageRequest, "image generation request")
_VIDEO_DECODERS = Decoders(StrictVideoRequest, VideoRequest, "video generation request")


# --- validation (pure) ---------------------------------------------------------------------------


def parse_image(body: bytes, *, allow_unknown: bool = False) -> ImageRequest:
    """Decode and validate an image generation body (every problem a 400)."""
    request = _IMAGE_DECODERS.decode(body, allow_unknown=allow_unknown)
    _check_prompt(request.prompt)
    if request.stream:
        raise InvalidRequest(
            "Streaming image generation (`stream: true`) is not supported.", param="stream"
        )
    if request.output_format not in (None, "png"):
        raise InvalidRequest(
            f"`output_format` `{request.output_format}` is not supported: only `png`.",
            param="output_format",
        )
    if request.background == "transparent":
        raise InvalidRequest(
            "`background: transparent` is not supported: the images are opaque.",
            param="background",
        )
    image_size(request.size)
    return request


def parse_video(body: bytes, *, allow_unknown: bool = False) -> VideoRequest:
    """Decode and validate a video generation body (every problem a 400)."""
    request = _VIDEO_DECODERS.decode(body, allow_unknown=allow_unknown)
    _check_prompt(request.prompt)
    if request.input_reference is not None:
        raise InvalidRequest(
            "`input_reference` (image-to-video) is not supported: text-to-video only.",
            param="input_reference",
        )
    video_size(request.size)
    video_seconds(request.seconds)
    return request


def _check_prompt(prompt: str) -> None:
    if not prompt.strip():
        raise InvalidRequest("`prompt` must not be empty.", param="prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(
            f"`prompt` has {len(prompt)} characters; at most {MAX_PROMPT_CHARS} are allowed.",
            param="prompt",
        )


def image_size(size: str | None) -> tuple[int, int]:
    """Width and height for an image ``size``; 400 for one not in ``SIZES``."""
    if size is None or size == "auto":
        return SIZES["1024x1024"]
    found = SIZES.get(size)
    if found is None:
        allowed = ", ".join(f"`{s}`" for s in ("auto", *SIZES))
        raise InvalidRequest(
            f"`size` `{size}` is not supported; use one of {allowed}.", param="size"
        )
    return found


def video_size(size: str | None) -> tuple[int, int]:
    """Width and height for a video ``size`` (``WxH``, each edge 1..1920)."""
    match = _WXH.match(size or DEFAULT_VIDEO_SIZE)
    if match is None:
        raise InvalidRequest(
            f"`size` must be `WIDTHxHEIGHT` (e.g. `832x480`), not `{size}`.", param="size"
        )
    width, height = int(match[1]), int(match[2])
    if width > MAX_VIDEO_EDGE or height > MAX_VIDEO_EDGE:
        raise InvalidRequest(
            f"`size` `{size}`: each edge must be at most {MAX_VIDEO_EDGE}.", param="size"
        )
    return width, height


def video_seconds(seconds: int | str | None) -> int:
    """``seconds`` as an integer 1..60 (0: not given)."""
    if seconds is None:
        return 0
    if isinstance(seconds, str):
        if not seconds.isdigit():
            raise InvalidRequest(
                f"`seconds` must be a whole number, not `{seconds}`.", param="seconds"
            )
        seconds = int(seconds)
    if not 1 <= seconds <= 60:
        raise InvalidRequest(f"`seconds` must be 1..60, not {seconds}.", param="seconds")
    return seconds


def check_card(model: str, card: ModelCard | None, kind: MediaKind) -> None:
    """404 for a model never registered, 400 for one of another kind."""
    if card is None:
        raise ModelNotFound(model)
    if card.kind != kind:
        path = IMAGES_PATH if kind == "image" else VIDEOS_PATH
        raise InvalidRequest(
            f"The model `{model}` is not an {kind} generation model (it is a `{card.kind}` "
            f"model); {path} needs an {kind} model.",
            param="model",
        )


def image_message(request: ImageRequest, *, request_id: str, deadline_ms: int) -> MediaGenerate:
    """The bus request for a validated image request."""
    width, height = image_size(request.size)
    nvext = request.nvext or MediaNvext()
    return MediaGenerate(
        request_id=request_id,
        model=request.model,
        reply_to="",
        kind="image",
        prompt=request.prompt,
        width=width,
        height=height,
        n=request.n or 1,
        seed=nvext.seed if nvext.seed is not None else request.seed,
        negative_prompt=nvext.negative_prompt or "",
        quality=request.quality or "",
        style=request.style or "",
        num_inference_steps=nvext.num_inference_steps or 0,
        guidance_scale=nvext.guidance_scale,
        deadline_ms=deadline_ms,
    )


def video_message(request: VideoRequest, *, request_id: str, deadline_ms: int) -> MediaGenerate:
    """The bus request for a validated video request."""
    width, height = video_size(request.size)
    nvext = request.nvext or MediaNvext()
    return MediaGenerate(
        request_id=request_id,
        model=request.model,
        reply_to="",
        kind="video",
        prompt=request.prompt,
        width=width,
        height=height,
        seed=nvext.seed if nvext.seed is not None else request.seed,
        negative_prompt=nvext.negative_prompt or "",
        num_frames=nvext.num_frames or 0,
        fps=nvext.fps or 0,
        seconds=video_seconds(request.seconds),
        num_inference_steps=nvext.num_inference_steps or 0,
        guidance_scale=nvext.guidance_scale,
        deadline_ms=deadline_ms,
    )


def _encoded(
    data: bytes, media_type: str, response_format: ResponseFormat
) -> tuple[str | None, str | None]:
    """``(b64_json, url)``: the one ``response_format`` asks for, the other ``None``."""
    encoded = base64.b64encode(data).decode("ascii")
    if response_format == "b64_json":
        return encoded, None
    return None, f"data:{media_type};base64,{encoded}"


def image_body(
    result: MediaResult, request: ImageRequest, *, created: int, size: tuple[int, int]
) -> bytes:
    """OpenAI's ``ImagesResponse`` for ``result``."""
    response_format = request.response_format or "url"
    data = []
    for item in result.items:
        b64_json, url = _encoded(item, result.media_type, response_format)
        data.append(
            ImageData(b64_json=b64_json, url=url, revised_prompt=result.revised_prompt or None)
        )
    body = ImagesResponse(created=created, data=data, size=f"{size[0]}x{size[1]}")
    return msgspec.json.encode(body)


def video_body(
    result: MediaResult,
    request: VideoRequest,
    *,
    video_id: str,
    created: int,
    inference_time_s: float,
) -> bytes:
    """Dynamo's video response: one completed job, its videos inline."""
    response_format = request.response_format or "url"
    data = []
    for item in result.items:
        b64_json, url = _encoded(item, result.media_type, response_format)
        data.append(VideoData(b64_json=b64_json, url=url))
    body = VideoResponse(
        id=video_id,
        model=result.model,
        created=created,
        data=data,
        inference_time_s=round(inference_time_s, 6),
    )
    return msgspec.json.encode(body)
