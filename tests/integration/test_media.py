"""Media generation over a real nats-server: the gateway's media routes (on the real
``NatsBus``, with the gateway's own error renderers) → the real mock media worker
(``services.media``), in process. Cards in the registry, PNGs and animated PNGs that decode,
round-robin over two workers, a worker gone, every error in OpenAI's body."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from nats.aio.client import Client

from services.gateway.core.bus import NatsBus
from services.gateway.http.app import create_app
from services.media.config import DEFAULT_IMAGE_MODEL, DEFAULT_VIDEO_MODEL, MediaConfig
from services.media.service import MediaService, build_service
from shared.registry import ModelFiles
from shared.subjects import Subjects
from tests.integration.gateway_support import gateway_config, until
from tests.unit.test_media_png import decode

IMAGE = DEFAULT_IMAGE_MODEL
VIDEO = DEFAULT_VIDEO_MODEL
TIMEOUT_S = 10.0


class Media:
    """In-process media workers (each on its own connection) and a gateway in front of them."""

    def __init__(self, nats_url: str, subjects: Subjects) -> None:
        self.nats_url = nats_url
        self.subjects = subjects
        self.workers: list[tuple[MediaService, Client]] = []

    async def worker(self, worker_id: str, **options: Any) -> MediaService:
        config = MediaConfig(
            nats_url=self.nats_url,
            namespace=self.subjects.namespace,
            worker_id=worker_id,
            **options,
        )
        client = await nats.connect(self.nats_url)
        service = build_service(config, client)
        await service.start()
        self.workers.append((service, client))
        return service

    async def stop(self, service: MediaService) -> None:
        for entry in self.workers:
            if entry[0] is service:
                await service.stop()
                await entry[1].drain()
                self.workers.remove(entry)
                return

    async def crash(self, service: MediaService) -> None:
        """Drop the worker's connection without deregistering: its cards stay live a TTL.
        Returns once the server has noticed (its subjects answer "no responders"): a message
        sent before that is lost with the socket, as with any process that dies."""
        for entry in self.workers:
            if entry[0] is service:
                await entry[1].close()
                self.workers.remove(entry)
                break
        probe = await nats.connect(self.nats_url)
        try:
            for worker_id in service.worker_ids.values():
                await _until_no_responders(probe, self.subjects.media_generate(worker_id))
        finally:
            await probe.close()

    async def close(self) -> None:
        for service, client in reversed(self.workers):
            await service.stop()
            await client.drain()


async def _until_no_responders(nc: Client, subject: str) -> None:
    for _ in range(50):  # bounded: 50 x at most 0.2 s
        try:
            await nc.request(subject, b"", timeout=0.2)
        except nats.errors.NoRespondersError:
            return
        except nats.errors.TimeoutError:
            pass
        await asyncio.sleep(0.02)
    raise AssertionError(f"{subject} still has a subscriber")


@pytest.fixture
async def media(nats_url: str, subjects: Subjects) -> AsyncIterator[Media]:
    started = Media(nats_url, subjects)
    try:
        yield started
    finally:
        await started.close()


@pytest.fixture
async def bus(nats_url: str, subjects: Subjects) -> AsyncIterator[NatsBus]:
    config = gateway_config(nats_url, subjects, TIMEOUT_S)
    gateway_bus = NatsBus(config)
    await gateway_bus.start()
    try:
        yield gateway_bus
    finally:
        await gateway_bus.stop()


@pytest.fixture
async def http(bus: NatsBus, nats_url: str, subjects: Subjects) -> AsyncIterator[httpx.AsyncClient]:
    """The media routes as the gateway serves them (its exception handlers, its bus)."""
    app = create_app(gateway_config(nats_url, subjects, TIMEOUT_S), bus=bus)  # no lifespan: started
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]  # Litestar's ASGI types
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        yield client


async def live(bus: NatsBus, model: str, count: int = 1) -> None:
    await until(lambda: len(_live_ids(bus, model)) >= count, f"{count} workers of {model}")


def _live_ids(bus: NatsBus, model: str) -> list[str]:
    return bus.workers_in_turn(model) if bus.is_live(model) else []


async def test_worker_registers_typed_cards(
    media: Media, nats_url: str, subjects: Subjects, bus: NatsBus
) -> None:
    service = await media.worker("m1")
    assert service.worker_ids == {IMAGE: "m1-image", VIDEO: "m1-video"}
    await live(bus, IMAGE)
    await live(bus, VIDEO)
    client = await nats.connect(nats_url)
    try:
        files = ModelFiles(client.jetstream(), subjects)
        image_card = await files.card(IMAGE)
        video_card = await files.card(VIDEO)
        assert image_card is not None
        assert video_card is not None
        assert (image_card.kind, video_card.kind) == ("image", "video")
        # Routers probe liveness with an empty request: answered, not "no responders".
        reply = await client.request(subjects.worker_ping("m1-image"), b"", timeout=TIMEOUT_S)
        assert reply.data == b""
    finally:
        await client.drain()


async def test_images_b64_json_are_pngs_of_the_size(
    media: Media, bus: NatsBus, http: httpx.AsyncClient
) -> None:
    await media.worker("m1")
    await live(bus, IMAGE)
    body = {
        "model": IMAGE,
        "prompt": "a lighthouse at dusk",
        "n": 2,
        "size": "256x256",
        "response_format": "b64_json",
    }
    response = await http.post("/v1/images/generations", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert isinstance(out["created"], int)
    assert len(out["data"]) == 2
    images = [base64.b64decode(item["b64_json"]) for item in out["data"]]
    for image in images:
        decoded = decode(image)
        assert (decoded.width, decoded.height) == (256, 256)
    assert images[0] != images[1]
    again = await http.post("/v1/images/generations", json=body)
    assert [base64.b64decode(d["b64_json"]) for d in again.json()["data"]] == images


async def test_image_url_form_is_a_data_url(
    media: Media, bus: NatsBus, http: httpx.AsyncClient
) -> None:
    await media.worker("m1")
    await live(bus, IMAGE)
    body = {"model": IMAGE, "prompt": "x", "size": "512x512", "nvext": {"seed": 3}}
    response = await http.post("/v1/images/generations", json=body)
    assert response.status_code == 200, response.text
    url = response.json()["data"][0]["url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    assert decode(base64.b64decode(url[len(prefix) :])).width == 512


async def test_video_is_an_animated_png(
    media: Media, bus: NatsBus, http: httpx.AsyncClient
) -> None:
    await media.worker("m1")
    await live(bus, VIDEO)
    body = {
        "model": VIDEO,
        "prompt": "waves",
        "seconds": 1,
        "size": "64x48",
        "response_format": "b64_json",
        "nvext": {"fps": 6, "seed": 1},
    }
    response = await http.post("/v1/videos/generations", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert (out["object"], out["status"], out["model"]) == ("video", "completed", VIDEO)
    decoded = decode(base64.b64decode(out["data"][0]["b64_json"]))
    assert (decoded.width, decoded.height, len(decoded.frames)) == (64, 48, 6)


async def test_requests_alternate_between_workers_and_skip_a_gone_one(
    media: Media, bus: NatsBus, http: httpx.AsyncClient, subjects: Subjects
) -> None:
    first = await media.worker("m1", video_model="")
    await media.worker("m2", video_model="")
    await live(bus, IMAGE, 2)
    seen: list[str] = []
    sub_client = await nats.connect(media.nats_url)
    try:
        recorders = [
            await sub_client.subscribe(subjects.media_generate(w), cb=_recorder(seen, w))
            for w in ("m1-image", "m2-image")
        ]
        body = {"model": IMAGE, "prompt": "p", "size": "256x256"}
        for _ in range(4):
            response = await http.post("/v1/images/generations", json=body)
            assert response.status_code == 200, response.text
        await until(lambda: len(seen) == 4, "4 requests seen")
        assert sorted(seen) == ["m1-image", "m1-image", "m2-image", "m2-image"]
        for recorder in recorders:
            await recorder.unsubscribe()
        await sub_client.flush()  # the server has dropped them: they answer nothing now
        # m1 crashes: its card stays live until its TTL, NATS answers "no responders" for it,
        # and a request whose turn it is goes on to m2 (3 requests: m1's turn comes).
        await media.crash(first)
        assert len(_live_ids(bus, IMAGE)) == 2
        for _ in range(3):
            response = await http.post("/v1/images/generations", json=body)
            assert response.status_code == 200, response.text
    finally:
        await sub_client.drain()


def _recorder(seen: list[str], worker: str) -> Callable[[Any], Any]:
    async def record(_: Any) -> None:
        seen.append(worker)

    return record


async def test_errors_in_openai_body(media: Media, bus: NatsBus, http: httpx.AsyncClient) -> None:
    await media.worker("m1")
    await live(bus, IMAGE)
    await live(bus, VIDEO)
    cases = [
        ("/v1/images/generations", {"model": "nope", "prompt": "p"}, 404, "model"),
        ("/v1/images/generations", {"model": VIDEO, "prompt": "p"}, 400, "model"),
        ("/v1/videos/generations", {"model": IMAGE, "prompt": "p"}, 400, "model"),
        ("/v1/images/generations", {"model": IMAGE, "prompt": ""}, 400, "prompt"),
        ("/v1/images/generations", {"model": IMAGE, "prompt": "p", "n": 11}, 400, "n"),
        ("/v1/images/generations", {"model": IMAGE, "prompt": "p", "size": "1x1"}, 400, "size"),
        ("/v1/images/generations", {"model": IMAGE, "prompt": "p", "x": 1}, 400, "x"),
    ]
    for path, body, status, param in cases:
        response = await http.post(path, json=body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == param, error
        assert error["message"]


async def test_no_live_worker_is_503(
    media: Media, bus: NatsBus, http: httpx.AsyncClient, nats_url: str
) -> None:
    service = await media.worker("m1", worker_ttl_s=1.0)
    await live(bus, IMAGE)
    await media.stop(service)  # deregisters: the card stays, no worker is live
    await until(lambda: not bus.is_live(IMAGE), "the worker to be gone")
    response = await http.post("/v1/images/generations", json={"model": IMAGE, "prompt": "p"})
    assert response.status_code == 503, response.text
    assert response.headers.get("retry-after")
    assert json.loads(response.text)["error"]["message"]
    await asyncio.sleep(0)
