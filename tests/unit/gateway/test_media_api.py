"""``/v1/images/generations`` and ``/v1/videos/generations`` in the gateway: body validation
(every problem a 400 naming the field), the bus request, the response bodies, and the choice
of worker (round-robin order, the next one when a worker has just gone; a fake bus)."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from services.gateway.apis.bodies import UnknownField
from services.gateway.apis.media import (
    IMAGES_PATH,
    image_body,
    image_message,
    parse_image,
    parse_video,
    video_body,
    video_message,
)
from services.gateway.core import asks
from services.gateway.core.context import RequestContext
from services.gateway.core.errors import NoResponders
from services.gateway.core.exchange import Exchanges
from shared.errors import InvalidRequest, ModelNotFound, NoWorkerAvailable, UpstreamTimeout
from shared.messages import MediaResult, ModelCard
from tests.unit.gateway.fakes import FakeBus


def body(**fields: Any) -> bytes:
    return json.dumps({"model": "img", "prompt": "a fox", **fields}).encode()


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": "x" * 32_001}, "prompt"),
        ({"n": 0}, "n"),
        ({"n": 11}, "n"),
        ({"size": "100x100"}, "size"),
        ({"size": "big"}, "size"),
        ({"response_format": "png"}, "response_format"),
        ({"quality": "ultra"}, "quality"),
        ({"style": "bold"}, "style"),
        ({"output_format": "jpeg"}, "output_format"),
        ({"background": "transparent"}, "background"),
        ({"stream": True}, "stream"),
        ({"seed": -1}, "seed"),
        ({"nvext": {"seed": "one"}}, "nvext.seed"),
    ],
)
def test_bad_image_bodies_are_400_naming_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_image(body(**fields))
    assert caught.value.status == 400
    assert caught.value.param == param


def test_image_body_needs_prompt_and_model() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_image(b'{"model": "img"}')
    assert caught.value.param == "prompt"
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        parse_image(b"{")


def test_unknown_fields_refused_unless_allowed() -> None:
    with pytest.raises(UnknownField) as caught:
        parse_image(body(colour="red"))
    assert caught.value.param == "colour"
    assert parse_image(body(colour="red"), allow_unknown=True).prompt == "a fox"


def test_documented_fields_are_accepted() -> None:
    parsed = parse_image(
        body(
            n=2,
            size="256x256",
            response_format="b64_json",
            quality="hd",
            style="vivid",
            user="u",
            safety_identifier="s",
            moderation="low",
            output_format="png",
            output_compression=80,
            background="opaque",
            stream=False,
            seed=3,
            nvext={"negative_prompt": "blur", "num_inference_steps": 4, "guidance_scale": 3.5},
        )
    )
    message = image_message(parsed, request_id="r", deadline_ms=5)
    assert (message.width, message.height, message.n, message.seed) == (256, 256, 2, 3)
    assert message.negative_prompt == "blur"
    assert (message.quality, message.style, message.kind) == ("hd", "vivid", "image")


def test_image_defaults_and_nvext_seed_wins() -> None:
    message = image_message(
        parse_image(body(seed=1, nvext={"seed": 2})), request_id="r", deadline_ms=0
    )
    assert (message.width, message.height, message.n, message.seed) == (1024, 1024, 1, 2)
    assert (
        image_message(parse_image(body(size="auto")), request_id="r", deadline_ms=0).width == 1024
    )


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"size": "832by480"}, "size"),
        ({"size": "4000x480"}, "size"),
        ({"seconds": 0}, "seconds"),
        ({"seconds": "four"}, "seconds"),
        ({"seconds": "61"}, "seconds"),
        ({"nvext": {"fps": 0}}, "nvext.fps"),
        ({"nvext": {"num_frames": 5000}}, "nvext.num_frames"),
        ({"input_reference": "data:image/png;base64,AAAA"}, "input_reference"),
        ({"n": 2}, "n"),
    ],
)
def test_bad_video_bodies_are_400(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_video(body(**fields))
    assert caught.value.param == param


def test_video_message_follows_dynamo_defaults_and_fields() -> None:
    default = video_message(parse_video(body()), request_id="r", deadline_ms=0)
    assert (default.width, default.height, default.kind) == (832, 480, "video")
    message = video_message(
        parse_video(body(seconds="2", size="64x32", nvext={"fps": 5, "seed": 9})),
        request_id="r",
        deadline_ms=0,
    )
    assert (message.seconds, message.fps, message.width, message.height) == (2, 5, 64, 32)
    assert message.seed == 9


# --- response bodies -----------------------------------------------------------------------------


RESULT = MediaResult(request_id="r", model="img", media_type="image/png", items=(b"\x89PNG1", b"2"))


def test_image_body_b64_json_and_url() -> None:
    parsed = parse_image(body(response_format="b64_json"))
    out = json.loads(image_body(RESULT, parsed, created=7, size=(256, 256)))
    assert out["created"] == 7
    assert out["size"] == "256x256"
    assert [base64.b64decode(d["b64_json"]) for d in out["data"]] == [b"\x89PNG1", b"2"]
    out = json.loads(image_body(RESULT, parse_image(body()), created=7, size=(256, 256)))
    assert (
        out["data"][0]["url"] == "data:image/png;base64," + base64.b64encode(b"\x89PNG1").decode()
    )
    assert "b64_json" not in out["data"][0]


def test_video_body() -> None:
    result = msgspec.structs.replace(RESULT, media_type="image/apng", items=(b"v",))
    out = json.loads(
        video_body(result, parse_video(body()), video_id="video_r", created=3, inference_time_s=0.5)
    )
    assert out["object"] == "video"
    assert (out["status"], out["progress"], out["id"]) == ("completed", 100, "video_r")
    assert out["data"] == [{"url": "data:image/apng;base64,dg=="}]


# --- the exchange (fake bus) ---------------------------------------------------------------------


IMAGE_CARD = ModelCard(model="img", context_length=0, kind="image")


def fake(card: ModelCard | None, workers: list[str], gone: set[str]) -> FakeBus:
    bus = FakeBus()
    bus.cards = {"img": card}
    bus.workers, bus.gone = workers, gone
    return bus


async def generate(
    bus: FakeBus, timeout_s: float = 5, clock: Callable[[], float] = time.monotonic
) -> MediaResult:
    exchanges = Exchanges(bus, first_timeout_s=timeout_s, idle_timeout_s=timeout_s, clock=clock)
    ctx = RequestContext("r", "POST", IMAGES_PATH)
    envelope = exchanges.envelope(ctx)
    message = image_message(
        parse_image(body()), request_id=envelope.request_id, deadline_ms=envelope.deadline_ms
    )
    return await asks.generate_media(exchanges, message, envelope)


async def test_first_worker_in_turn_answers() -> None:
    bus = fake(IMAGE_CARD, ["w1", "w2"], gone=set())
    assert (await generate(bus)).worker_id == "w1"
    assert bus.asked == ["w1"]


async def test_a_gone_worker_is_skipped() -> None:
    bus = fake(IMAGE_CARD, ["w1", "w2"], gone={"w1"})
    assert (await generate(bus)).worker_id == "w2"
    assert bus.asked == ["w1", "w2"]


async def test_every_worker_gone_is_503() -> None:
    bus = fake(IMAGE_CARD, ["w1", "w2"], gone={"w1", "w2"})
    with pytest.raises(NoResponders) as caught:
        await generate(bus)
    assert caught.value.status == 503


async def test_unknown_model_404_wrong_kind_400_no_worker_503() -> None:
    with pytest.raises(ModelNotFound):
        await generate(fake(None, ["w"], set()))
    llm = ModelCard(model="img", context_length=8, kind="llm")
    with pytest.raises(InvalidRequest, match="not an image generation model") as caught:
        await generate(fake(llm, ["w"], set()))
    assert caught.value.param == "model"
    with pytest.raises(NoWorkerAvailable) as no_worker:
        await generate(fake(IMAGE_CARD, [], set()))
    assert no_worker.value.status == 503


async def test_the_time_limit_covers_every_attempt() -> None:
    ticks = iter([0.0, 0.0, 10.0])
    bus = fake(IMAGE_CARD, ["w1", "w2"], gone={"w1"})
    with pytest.raises(UpstreamTimeout):
        await generate(bus, clock=lambda: next(ticks))
    assert bus.asked == ["w1"]
