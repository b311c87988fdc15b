"""Pure: the answer to one ``MediaGenerate`` — ``n`` deterministic images (PNG) or videos
(animated PNG), or a typed error for a request this worker cannot serve."""

from __future__ import annotations

from services.media.picture import image_png, video_apng
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import MediaGenerate, MediaKind, MediaResult

PNG = "image/png"
APNG = "image/apng"
DEFAULT_FPS = 24
"""As Dynamo's video ``nvext.fps`` default."""
DEFAULT_SECONDS = 4
MAX_PIXELS = 4096 * 4096
MAX_VIDEO_PIXELS = 1920 * 1080 * 240
"""Frames times frame size: about ten seconds of 1080p at 24 fps."""


def frame_count(request: MediaGenerate) -> int:
    """``num_frames``, else ``seconds * fps`` (Dynamo's rule), at least one."""
    if request.num_frames:
        return request.num_frames
    fps = request.fps or DEFAULT_FPS
    return max(1, (request.seconds or DEFAULT_SECONDS) * fps)


def make(request: MediaGenerate, *, models: dict[str, MediaKind], worker_id: str) -> MediaResult:
    """Generate every item of ``request`` (``models``: what this worker serves, by name)."""
    kind = models.get(request.model)
    if kind is None:
        raise ModelNotFound(request.model)
    if kind != request.kind:
        raise InvalidRequest(
            f"The model `{request.model}` is a {kind} model, not a {request.kind} model.",
            param="model",
        )
    if not 1 <= request.width * request.height <= MAX_PIXELS:
        raise InvalidRequest(
            f"The size {request.width}x{request.height} is too large.", param="size"
        )
    extra = request.negative_prompt
    if kind == "image":
        items = tuple(
            image_png(
                request.prompt,
                seed=request.seed,
                width=request.width,
                height=request.height,
                index=i,
                extra=extra,
            )
            for i in range(request.n)
        )
        return MediaResult(
            request_id=request.request_id,
            model=request.model,
            media_type=PNG,
            items=items,
            worker_id=worker_id,
        )
    frames = frame_count(request)
    if frames * request.width * request.height > MAX_VIDEO_PIXELS:
        raise InvalidRequest(
            f"{frames} frames of {request.width}x{request.height} are more than this mock "
            "makes; ask for fewer frames or a smaller size.",
            param="nvext.num_frames",
        )
    fps = request.fps or DEFAULT_FPS
    items = tuple(
        video_apng(
            request.prompt,
            seed=request.seed,
            width=request.width,
            height=request.height,
            index=i,
            frames=frames,
            fps=fps,
            extra=extra,
        )
        for i in range(request.n)
    )
    return MediaResult(
        request_id=request.request_id,
        model=request.model,
        media_type=APNG,
        items=items,
        worker_id=worker_id,
    )
