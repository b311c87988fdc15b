"""Images in, through the whole stack (decision 032): a mocker stack serving the mock vision model
(``--vision-workers``) beside a text model, real ``openai`` and ``anthropic`` clients.

Data-URL images in OpenAI chat, Anthropic ``image`` blocks and Responses ``input_image`` parts
count their tokens in the usage; an allowed http URL is fetched from a server the test runs; the
same image again is routed to the worker that cached it with the overlap in the routing
decision, another image of the same size is not; every bad input is a 400 naming the part.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import nats
import openai
import pytest
from PIL import Image

from services.cli.stack import Stack
from shared.messages import RouteDecision
from shared.vision_model import VISION_MODEL_NAME
from tests.e2e.conftest import MODEL, route_decisions, start_stack
from tests.support import eventually_awaited, registered_cards

pytestmark = pytest.mark.timeout(240)

VL = VISION_MODEL_NAME
MAX_IMAGE_BYTES = 20_000
MAX_IMAGES = 2
BLOCK = 16
"""The mocker's default KV block size."""
SYSTEM = "You describe pictures for a museum catalogue. " * 12
"""Long enough that several full blocks come before the image."""


def png(width: int, height: int, colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(out, "PNG")
    return out.getvalue()


def noisy_png(side: int) -> bytes:
    """A PNG that does not compress: larger than ``MAX_IMAGE_BYTES``."""
    pixels = random.Random(7).randbytes(side * side * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), pixels).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def tokens_of(width: int, height: int) -> int:
    """Qwen2.5-VL's rule for sizes that are multiples of 28 within its pixel bounds."""
    return (width // 28) * (height // 28)


class _Images(BaseHTTPRequestHandler):
    """Serves ``/cat.png``; records every path asked for."""

    body: ClassVar[bytes] = png(224, 112, (20, 120, 220))
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 (a port the OS picks) that serves one image."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def vision_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """The text model on one worker, the vision model on two; KV routing; images from
    127.0.0.1 allowed, at most two of at most ``MAX_IMAGE_BYTES`` each."""
    stack = start_stack(
        tmp_path_factory.mktemp("vision"),
        model_dir,
        workers=1,
        vision_workers=2,
        router_mode="kv",
        service_args={
            "preprocessor": [
                *("--image-url-domains", "127.0.0.1"),
                *("--max-images", str(MAX_IMAGES), "--max-image-bytes", str(MAX_IMAGE_BYTES)),
            ]
        },
    )
    try:
        asyncio.run(_wait_for_cards(stack, 3))
        yield stack
    finally:
        stack.stop()


async def _wait_for_cards(stack: Stack, count: int) -> None:
    nc = await nats.connect(stack.nats_url)
    try:

        async def enough() -> bool:
            return len(await registered_cards(nc.jetstream(), stack.config.namespace)) >= count

        await eventually_awaited(enough, timeout_s=60, message=f"{count} workers registered")
    finally:
        await nc.close()


@pytest.fixture
async def oai(vision_stack: Stack) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=f"{vision_stack.base_url}/v1", api_key="x", max_retries=0)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def claude(vision_stack: Stack) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=vision_stack.base_url, api_key="x", max_retries=0)
    try:
        yield client
    finally:
        await client.close()


def user(*images: str, text: str = "What is in this picture?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": parts}]


async def _prompt_tokens(client: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> int:
    completion = await client.chat.completions.create(
        model=VL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
    )
    assert completion.usage is not None
    return completion.usage.prompt_tokens


# --- images that work ------------------------------------------------------------------------


async def test_a_data_url_image_counts_its_tokens_in_the_usage(oai: openai.AsyncOpenAI) -> None:
    with_image = await _prompt_tokens(oai, user(data_url(png(448, 224))))
    text_only = await _prompt_tokens(oai, user())
    # <|vision_start|>, the image's tokens, <|vision_end|>
    assert with_image - text_only == 2 + tokens_of(448, 224)


async def test_a_jpeg_counts_by_its_own_size(oai: openai.AsyncOpenAI) -> None:
    out = io.BytesIO()
    Image.new("RGB", (280, 560), (5, 5, 5)).save(out, "JPEG")
    with_image = await _prompt_tokens(oai, user(data_url(out.getvalue(), "image/jpeg")))
    assert with_image - await _prompt_tokens(oai, user()) == 2 + tokens_of(280, 560)


async def test_an_anthropic_base64_image_block_counts_its_tokens(
    claude: anthropic.AsyncAnthropic,
) -> None:
    image = base64.b64encode(png(224, 224)).decode()
    source = {"type": "base64", "media_type": "image/png", "data": image}
    content: list[Any] = [{"type": "text", "text": "Describe it."}]
    with_image = await claude.messages.create(
        model=VL,
        max_tokens=4,
        messages=[{"role": "user", "content": [*content, {"type": "image", "source": source}]}],
    )
    text_only = await claude.messages.create(
        model=VL, max_tokens=4, messages=[{"role": "user", "content": content}]
    )
    assert _prompt(with_image.usage) - _prompt(text_only.usage) == 2 + tokens_of(224, 224)


async def test_count_tokens_counts_an_image_as_generation_does(
    claude: anthropic.AsyncAnthropic,
) -> None:
    image = base64.b64encode(png(336, 224)).decode()
    source = {"type": "base64", "media_type": "image/png", "data": image}
    messages: list[Any] = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi."}, {"type": "image", "source": source}],
        }
    ]
    counted = await claude.messages.count_tokens(model=VL, messages=messages)
    reply = await claude.messages.create(model=VL, max_tokens=4, messages=messages)
    assert counted.input_tokens == _prompt(reply.usage)


def _prompt(usage: anthropic.types.Usage) -> int:
    """Anthropic's ``input_tokens`` leave out what the prefix cache served."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


async def test_a_responses_input_image_counts_its_tokens(oai: openai.AsyncOpenAI) -> None:
    text = {"type": "input_text", "text": "Describe it."}
    image = {"type": "input_image", "image_url": data_url(png(112, 224)), "detail": "auto"}
    with_image = await oai.responses.create(
        model=VL,
        input=[{"role": "user", "content": [text, image]}],  # type: ignore[list-item]
        max_output_tokens=16,
    )
    text_only = await oai.responses.create(
        model=VL,
        input=[{"role": "user", "content": [text]}],  # type: ignore[list-item]
        max_output_tokens=16,
    )
    assert with_image.usage is not None
    assert text_only.usage is not None
    assert with_image.usage.input_tokens - text_only.usage.input_tokens == 2 + tokens_of(112, 224)


async def test_an_allowed_http_url_is_fetched(
    oai: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic, image_server: str
) -> None:
    url = f"{image_server}/cat.png?openai"
    with_image = await _prompt_tokens(oai, user(url))
    assert "/cat.png?openai" in _Images.seen
    assert with_image - await _prompt_tokens(oai, user()) == 2 + tokens_of(224, 112)
    block = {"type": "image", "source": {"type": "url", "url": f"{image_server}/cat.png?claude"}}
    reply = await claude.messages.create(
        model=VL, max_tokens=4, messages=[{"role": "user", "content": [block]}]
    )
    assert _prompt(reply.usage) > tokens_of(224, 112)
    assert "/cat.png?claude" in _Images.seen


# --- routing -----------------------------------------------------------------------------------


async def _routed(
    client: openai.AsyncOpenAI, decisions: dict[str, RouteDecision], messages: list[dict[str, Any]]
) -> RouteDecision:
    raw = await client.chat.completions.with_raw_response.create(
        model=VL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
    )
    request_id = (raw.headers.get("x-request-id") or raw.parse().id).removeprefix("chatcmpl-")

    async def decided() -> RouteDecision | None:
        return decisions.get(request_id)

    return await eventually_awaited(decided, timeout_s=10, message="the routing decision")


async def test_the_same_image_goes_back_to_the_worker_that_cached_it(
    vision_stack: Stack, oai: openai.AsyncOpenAI
) -> None:
    first_image = user(data_url(png(448, 224, (1, 2, 3))), text="Which painting is this?")
    other_image = user(data_url(png(448, 224, (3, 2, 1))), text="Which painting is this?")
    async with route_decisions(vision_stack) as decisions:
        first = await _routed(oai, decisions, first_image)
        full = first.prompt_tokens // BLOCK

        async def cached_again() -> RouteDecision | None:
            # the worker's KV events reach the router shortly after the first answer
            again = await _routed(oai, decisions, first_image)
            return again if again.overlap_blocks == full else None

        again = await eventually_awaited(
            cached_again, timeout_s=20, message="the repeated image's blocks all cached"
        )
        other = await _routed(oai, decisions, other_image)
    assert again.worker_id == first.worker_id
    assert other.prompt_tokens == first.prompt_tokens  # same size: same tokens
    best_other = max(c.overlap_blocks for c in other.candidates)
    assert 0 < best_other < full  # only the blocks before the image match


# --- bad input ---------------------------------------------------------------------------------

BAD_CASES = ["not an image", "too large", "too many", "url not allowed", "no vision"]


def _bad_cases(image_server: str) -> dict[str, tuple[str, list[str], str]]:
    """name -> (model, image URLs, what the error says); the image part at fault is the last."""
    ok = data_url(png(56, 56))
    return {
        "not an image": (VL, [data_url(b"plain text, not pixels")], "could not be read"),
        "too large": (VL, [data_url(noisy_png(120))], f"larger than {MAX_IMAGE_BYTES} bytes"),
        "too many": (VL, [ok] * (MAX_IMAGES + 1), f"at most {MAX_IMAGES}"),
        "url not allowed": (VL, [_elsewhere(image_server, "x")], "not allowed"),
        "no vision": (MODEL, [ok], "does not take images"),
    }


@pytest.mark.parametrize("case", BAD_CASES)
async def test_bad_images_are_a_400_naming_the_part_in_openai_s_body(
    oai: openai.AsyncOpenAI, image_server: str, case: str
) -> None:
    model, urls, says = _bad_cases(image_server)[case]
    part = f"messages[1].content[{len(urls)}]" if case != "no vision" else "messages[1].content[1]"
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.chat.completions.create(
            model=model,
            messages=user(*urls),  # type: ignore[arg-type]
            max_tokens=4,
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == part, error
    assert says in error["message"], error
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("case", BAD_CASES)
async def test_bad_images_are_a_400_naming_the_block_in_anthropic_s_body(
    claude: anthropic.AsyncAnthropic, image_server: str, case: str
) -> None:
    model, urls, says = _bad_cases(image_server)[case]
    blocks: list[Any] = [{"type": "text", "text": "Describe."}]
    for url in urls:
        if url.startswith("data:"):
            data = url.split(",", 1)[1]
            source = {"type": "base64", "media_type": "image/png", "data": data}
        else:
            source = {"type": "url", "url": url}
        blocks.append({"type": "image", "source": source})
    at_fault = len(urls) if case != "no vision" else 1
    with pytest.raises(anthropic.BadRequestError) as caught:
        await claude.messages.create(
            model=model, max_tokens=4, messages=[{"role": "user", "content": blocks}]
        )
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert f"`messages[0].content[{at_fault}]`" in body["error"]["message"], body
    assert says in body["error"]["message"], body


async def test_a_url_not_allowed_is_refused_without_a_fetch(
    oai: openai.AsyncOpenAI, image_server: str
) -> None:
    url = _elsewhere(image_server, "never")
    with pytest.raises(openai.BadRequestError):
        await oai.chat.completions.create(
            model=VL,
            messages=user(url),  # type: ignore[arg-type]
            max_tokens=4,
        )
    assert not [p for p in _Images.seen if p.endswith("?never")]


def _elsewhere(image_server: str, tag: str) -> str:
    """The test server's image under a host name the preprocessor does not allow."""
    return image_server.replace("127.0.0.1", "localhost") + f"/cat.png?{tag}"


# --- the command line --------------------------------------------------------------------------


def test_jetserve_up_vision_workers_serves_the_vision_model(
    model_dir: Path, image_server: str
) -> None:
    """``--vision-workers 1`` serves the vision model; ``--preprocessor-image-url-domains``
    lets the preprocessor fetch from the test's server."""
    script = Path(sys.executable).parent / "jetserve"
    launcher = [str(script)] if script.is_file() else [sys.executable, "-m", "services.cli"]
    cmd = [
        *launcher,
        *("up", "--http-port", "0", "--grpc-port", "0", "--mocker-speedup-ratio", "0"),
        *("--workers", "1", "--embedders", "0", "--model-path", str(model_dir)),
        *("--vision-workers", "1", "--preprocessor-image-url-domains", "127.0.0.1"),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("JetServe is up: http://127.0.0.1:"), line or proc.communicate()
        assert f"vision model {VL} on 1 mocker workers" in line, line
        client = openai.OpenAI(base_url=line.split()[3], api_key="x", max_retries=0, timeout=30)
        chat = client.chat.completions.create(
            model=VL,
            messages=user(data_url(png(224, 224))),  # type: ignore[arg-type]
            max_tokens=3,
        )
        plain = client.chat.completions.create(
            model=VL,
            messages=user(),  # type: ignore[arg-type]
            max_tokens=3,
        )
        assert chat.usage is not None
        assert plain.usage is not None
        assert chat.usage.prompt_tokens - plain.usage.prompt_tokens == 2 + tokens_of(224, 224)
        fetched = client.chat.completions.create(
            model=VL,
            messages=user(f"{image_server}/cat.png?up"),  # type: ignore[arg-type]
            max_tokens=3,
        )
        assert "/cat.png?up" in _Images.seen
        assert fetched.usage is not None
        assert fetched.usage.prompt_tokens - plain.usage.prompt_tokens == 2 + tokens_of(224, 112)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
