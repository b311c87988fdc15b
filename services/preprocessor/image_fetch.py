"""Read a request's images: ``data:`` URLs decoded, allowed http(s) URLs fetched with a size, a
time and a count limit (decision 032).

Everything that can be refused without reading (a text-only model, too many images, a URL not
allowed) is refused before any fetch (``images.check_refs``). A fetch follows no redirect (its
target would escape the host check), stops reading past ``max_bytes``, and gives up after
``timeout_s`` for all of a request's images together; each failure is a 400 naming the part.
"""

from __future__ import annotations

import asyncio

import httpx

from services.preprocessor.images import (
    ImageLimits,
    ImageRef,
    LoadedImage,
    check_refs,
    decode_data_url,
    image_refs,
    measure,
    refused,
    too_large,
)
from shared.messages import Preprocess, VisionSpec


class ImageLoader:
    """A request's images, read and measured; one HTTP client for the fetches of all requests."""

    def __init__(
        self,
        limits: ImageLimits,
        *,
        timeout_s: float,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._limits = limits
        self._timeout_s = timeout_s
        self._client = client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def load(self, req: Preprocess, vision: VisionSpec | None) -> tuple[LoadedImage, ...]:
        """The request's images in prompt order (none: ``()``), every refusal a 400."""
        refs = image_refs(req.messages) if req.api == "chat" else []
        if not refs:
            return ()
        if req.use_raw_prompt or req.prompt_token_ids is not None:
            raise refused(refs[0].param, "images need the chat template (no raw prompt or tokens).")
        check_refs(refs, model=req.model, vision=vision, limits=self._limits)
        assert vision is not None  # check_refs refuses images for a model without vision
        try:
            async with asyncio.timeout(self._timeout_s):
                blobs = await asyncio.gather(*(self._read(ref) for ref in refs))
        except TimeoutError:
            slow = next(r for r in refs if not r.url.startswith("data:"))
            raise refused(
                slow.param, f"the image URL was not fetched within {self._timeout_s:g} s."
            ) from None
        return tuple(measure(ref, data, vision) for ref, data in zip(refs, blobs, strict=True))

    async def _read(self, ref: ImageRef) -> bytes:
        if ref.url.startswith("data:"):
            return decode_data_url(ref, self._limits.max_bytes)
        return await self._fetch(ref)

    async def _fetch(self, ref: ImageRef) -> bytes:
        if self._client is None:
            self._client = httpx.AsyncClient(follow_redirects=False)
        limit = self._limits.max_bytes
        try:
            async with self._client.stream("GET", ref.url) as response:
                if response.status_code != 200:
                    raise refused(
                        ref.param,
                        f"fetching the image URL answered HTTP {response.status_code} "
                        "(redirects are not followed).",
                    )
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limit:
                    raise too_large(ref.param, limit)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > limit:
                        raise too_large(ref.param, limit)
                return bytes(body)
        except httpx.HTTPError as exc:
            raise refused(ref.param, f"the image URL could not be fetched: {exc!r}.") from None
