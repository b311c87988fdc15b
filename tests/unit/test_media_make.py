"""The mock media worker's pictures: valid PNG / APNG files of the asked size, the same bytes
for the same inputs, different ones when the prompt, seed, index or negative prompt differ."""

from __future__ import annotations

import pytest

from services.media.make import APNG, PNG, frame_count, make
from services.media.picture import image_png, video_apng
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import MediaGenerate, MediaKind
from tests.unit.test_media_png import decode

MODELS: dict[str, MediaKind] = {"img": "image", "vid": "video"}


def request(**fields: object) -> MediaGenerate:
    base: dict[str, object] = {
        "request_id": "r1",
        "model": "img",
        "reply_to": "",
        "kind": "image",
        "prompt": "a red fox",
        "width": 64,
        "height": 48,
    }
    return MediaGenerate(**{**base, **fields})  # type: ignore[arg-type]


def test_image_is_a_png_of_the_asked_size() -> None:
    decoded = decode(image_png("a red fox", seed=None, width=256, height=128, index=0))
    assert (decoded.width, decoded.height) == (256, 128)
    assert len(decoded.frames) == 1
    assert len({row for row in decoded.frames[0]}) > 1, "a picture, not one flat colour"


def test_same_inputs_same_bytes() -> None:
    one = image_png("a red fox", seed=7, width=64, height=64, index=1)
    assert one == image_png("a red fox", seed=7, width=64, height=64, index=1)


def picture(
    prompt: str = "a red fox", seed: int | None = 7, index: int = 1, extra: str = ""
) -> bytes:
    return image_png(prompt, seed=seed, width=64, height=64, index=index, extra=extra)


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param(picture(prompt="a blue fox"), id="prompt"),
        pytest.param(picture(seed=8), id="seed"),
        pytest.param(picture(seed=None), id="no-seed"),
        pytest.param(picture(index=2), id="index"),
        pytest.param(picture(extra="blurry"), id="negative-prompt"),
    ],
)
def test_any_input_changes_the_picture(changed: bytes) -> None:
    assert changed != picture()


def test_video_is_an_animation_whose_frames_move() -> None:
    decoded = decode(video_apng("waves", seed=1, width=80, height=40, index=0, frames=5, fps=10))
    assert (decoded.width, decoded.height) == (80, 40)
    assert len(decoded.frames) == 5
    assert len({tuple(frame) for frame in decoded.frames}) > 1


def test_make_images() -> None:
    result = make(request(n=3, seed=5), models=MODELS, worker_id="w-image")
    assert result.media_type == PNG
    assert result.worker_id == "w-image"
    assert len(result.items) == 3
    assert len(set(result.items)) == 3, "each item of a request differs"
    assert all((decode(item).width, decode(item).height) == (64, 48) for item in result.items)
    again = make(request(n=3, seed=5), models=MODELS, worker_id="w-image")
    assert again.items == result.items


def test_make_video_frames_from_seconds_and_fps() -> None:
    message = request(model="vid", kind="video", seconds=2, fps=3)
    assert frame_count(message) == 6
    result = make(message, models=MODELS, worker_id="w-video")
    assert result.media_type == APNG
    assert len(decode(result.items[0]).frames) == 6


def test_num_frames_wins_over_seconds() -> None:
    assert frame_count(request(kind="video", num_frames=4, seconds=9, fps=9)) == 4
    assert frame_count(request(kind="video")) == 96  # Dynamo's 24 fps, 4 s by default


def test_unknown_model_and_wrong_kind() -> None:
    with pytest.raises(ModelNotFound):
        make(request(model="nope"), models=MODELS, worker_id="w")
    with pytest.raises(InvalidRequest, match="is a video model"):
        make(request(model="vid"), models=MODELS, worker_id="w")


def test_too_many_frames_is_a_400() -> None:
    big = request(model="vid", kind="video", width=1920, height=1080, num_frames=1000)
    with pytest.raises(InvalidRequest, match="fewer frames") as caught:
        make(big, models=MODELS, worker_id="w")
    assert caught.value.status == 400
