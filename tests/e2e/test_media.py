"""Media generation end to end with the real ``openai`` SDK: gateway and the mock media worker
(``services.media``) as separate processes (``jetserve up --media-workers 1``)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from services.cli.stack import Stack
from services.media.config import DEFAULT_IMAGE_MODEL, DEFAULT_VIDEO_MODEL
from tests.e2e.conftest import MODEL, serving_models
from tests.unit.test_media_png import decode

IMAGE = DEFAULT_IMAGE_MODEL
VIDEO = DEFAULT_VIDEO_MODEL
DATA_URL = "data:image/png;base64,"


@pytest.fixture(scope="module")
def media_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One chat worker and one mock media worker (an image and a video model)."""
    run_dir = tmp_path_factory.mktemp("media")
    models = [MODEL, IMAGE, VIDEO]
    with serving_models(run_dir, model_dir, models, workers=1, media_workers=1) as s:
        yield s


@pytest.fixture
async def client(media_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{media_stack.base_url}/v1", api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


async def test_b64_json_images_are_pngs_of_the_size(client: openai.AsyncOpenAI) -> None:
    response = await client.images.generate(
        model=IMAGE, prompt="a lighthouse at dusk", n=2, size="256x256", response_format="b64_json"
    )
    assert response.created > 0
    assert response.data is not None
    assert len(response.data) == 2
    images = []
    for image in response.data:
        assert image.b64_json is not None
        assert image.url is None
        data = base64.b64decode(image.b64_json)
        decoded = decode(data)
        assert (decoded.width, decoded.height) == (256, 256)
        images.append(data)
    assert images[0] != images[1], "each image of a request differs"
    again = await client.images.generate(
        model=IMAGE, prompt="a lighthouse at dusk", n=2, size="256x256", response_format="b64_json"
    )
    assert again.data is not None
    assert [base64.b64decode(i.b64_json or "") for i in again.data] == images


async def test_url_form_and_seed(client: openai.AsyncOpenAI) -> None:
    async def url(seed: int) -> str:
        response = await client.images.generate(
            model=IMAGE, prompt="a fox", size="512x512", extra_body={"nvext": {"seed": seed}}
        )
        assert response.data is not None
        found = response.data[0].url
        assert found is not None
        return found

    first = await url(1)
    assert first.startswith(DATA_URL)
    assert decode(base64.b64decode(first[len(DATA_URL) :])).width == 512
    assert await url(1) == first
    assert await url(2) != first


async def test_video_generation(client: openai.AsyncOpenAI) -> None:
    body: dict[str, Any] = {
        "model": VIDEO,
        "prompt": "waves on a beach",
        "seconds": 1,
        "size": "128x96",
        "response_format": "b64_json",
        "nvext": {"fps": 8},
    }
    out = await client.post("/videos/generations", body=body, cast_to=object)
    assert isinstance(out, dict)
    assert (out["object"], out["status"], out["model"]) == ("video", "completed", VIDEO)
    decoded = decode(base64.b64decode(out["data"][0]["b64_json"]))
    assert (decoded.width, decoded.height, len(decoded.frames)) == (128, 96, 8)


async def test_errors(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.images.generate(model="no-such-model", prompt="p")
    with pytest.raises(openai.BadRequestError) as wrong_kind:
        await client.images.generate(model=MODEL, prompt="p")
    assert "image" in wrong_kind.value.message
    with pytest.raises(openai.BadRequestError) as too_many:
        await client.images.generate(model=IMAGE, prompt="p", n=11)
    assert isinstance(too_many.value.body, dict)
    assert too_many.value.body.get("param") == "n"
    with pytest.raises(openai.BadRequestError):
        await client.images.generate(model=IMAGE, prompt="")
    with pytest.raises(openai.BadRequestError):
        await client.images.generate(model=IMAGE, prompt="p", size="100x100")
    with pytest.raises(openai.BadRequestError):
        await client.post(
            "/videos/generations", body={"model": IMAGE, "prompt": "p"}, cast_to=object
        )
