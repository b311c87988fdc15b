"""The preprocessor's image fetches against a real HTTP server on 127.0.0.1 (decision 032): an
allowed URL is read, a disallowed one is refused without a request, and the size, time, status
and redirect limits each end in a 400 naming the part."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from PIL import Image

from services.cli.stack import free_port
from services.preprocessor.image_fetch import ImageLoader
from services.preprocessor.images import ImageLimits
from shared.errors import InvalidRequest
from shared.messages import Preprocess, VisionSpec

VISION = VisionSpec(image_token_id=151655)
LIMIT = 4096


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (9, 9, 9)).save(out, "PNG")
    return out.getvalue()


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[str]] = []
    release: ClassVar[threading.Event] = threading.Event()

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        if self.path == "/cat.png":
            self._send(200, _png(56, 84))
        elif self.path == "/big-declared.png":
            self._send(200, b"\0" * (LIMIT + 1))
        elif self.path == "/big-chunked.png":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(4):
                chunk = b"\0" * 2048
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/moved.png":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/stall.png":
            type(self).release.wait(timeout=30)
        else:
            self._send(404, b"no")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        _Handler.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture
async def loader() -> Any:
    limits = ImageLimits(max_bytes=LIMIT, url_domains=frozenset({"127.0.0.1"}))
    images = ImageLoader(limits, timeout_s=1.0)
    try:
        yield images
    finally:
        await images.close()


def _request(url: str) -> Preprocess:
    part = {"type": "image_url", "image_url": {"url": url}, "param": "messages[0].content[0]"}
    return Preprocess(
        request_id="r",
        api="chat",
        model="vl",
        reply_to="x",
        created=0,
        messages=({"role": "user", "content": [part]},),
    )


async def test_an_allowed_url_is_fetched_and_measured(loader: ImageLoader, server: str) -> None:
    (image,) = await loader.load(_request(f"{server}/cat.png"), VISION)
    assert (image.format, image.width, image.height, image.tokens) == ("png", 56, 84, 2 * 3)


async def test_a_host_not_allowed_is_refused_without_a_request(
    loader: ImageLoader, server: str
) -> None:
    url = server.replace("127.0.0.1", "localhost") + "/cat.png?not-asked"
    with pytest.raises(InvalidRequest, match="`localhost` are not allowed") as caught:
        await loader.load(_request(url), VISION)
    assert caught.value.param == "messages[0].content[0]"
    assert not [p for p in _Handler.seen if p.endswith("not-asked")]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/big-declared.png", f"larger than {LIMIT} bytes"),
        ("/big-chunked.png", f"larger than {LIMIT} bytes"),
        ("/moved.png", "HTTP 302 (redirects are not followed)"),
        ("/missing.png", "HTTP 404"),
        ("/stall.png", "not fetched within 1 s"),
    ],
)
async def test_each_fetch_limit_is_a_400_naming_the_part(
    loader: ImageLoader, server: str, path: str, says: str
) -> None:
    with pytest.raises(InvalidRequest, match=r"^`messages\[0\].content\[0\]`: ") as caught:
        await loader.load(_request(f"{server}{path}"), VISION)
    assert says in caught.value.message


async def test_a_server_that_is_not_there_is_a_400(loader: ImageLoader) -> None:
    with pytest.raises(InvalidRequest, match="could not be fetched"):
        await loader.load(_request(f"http://127.0.0.1:{free_port()}/x.png"), VISION)
