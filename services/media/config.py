"""Mock media worker configuration: its settings table (``JETSERVE_MEDIA_*``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from shared.config import CommonConfig, computed_setting, setting
from shared.registry import DEFAULT_WORKER_TTL_S
from shared.subjects import check_token

DEFAULT_IMAGE_MODEL = "black-forest-labs/FLUX.1-schnell"
DEFAULT_VIDEO_MODEL = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"


def _random_id() -> str:
    return f"media-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaConfig(CommonConfig):
    """One mock media worker: an image model and a video model, each registered as a worker of
    its own (``<worker-id>-image``, ``<worker-id>-video``)."""

    SERVICE = "media"
    DESCRIPTION = (
        "A mock image and video generation worker: deterministic PNG images and animated PNG "
        "videos (/v1/images/generations, /v1/videos/generations)."
    )

    image_model: str = setting(DEFAULT_IMAGE_MODEL, "Served image model name (empty = none)")
    video_model: str = setting(DEFAULT_VIDEO_MODEL, "Served video model name (empty = none)")
    worker_id: str = computed_setting(
        _random_id,
        "Worker id prefix: the image model's worker is <id>-image, the video model's "
        "<id>-video (empty = random)",
        default_doc="random",
        per_instance=True,
    )
    worker_ttl_s: float = setting(
        DEFAULT_WORKER_TTL_S,
        "Worker card TTL; heartbeat every TTL/3",
        gt=0,
        aliases=("JETSERVE_WORKER_TTL_S",),
    )

    def __post_init__(self) -> None:
        # Not super(): slotted dataclasses are rebuilt, which breaks zero-argument super().
        CommonConfig.__post_init__(self)
        check_token(self.worker_id, "--worker-id / JETSERVE_MEDIA_WORKER_ID")
        if not self.image_model and not self.video_model:
            raise ValueError("--image-model and --video-model are both empty: nothing to serve")
        if self.image_model and self.image_model == self.video_model:
            raise ValueError("--image-model and --video-model must differ")
