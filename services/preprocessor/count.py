"""How many prompt tokens a request makes: the answer to ``CountTokens`` (Anthropic's
``/v1/messages/count_tokens``).

``count_tokens`` is pure: the chat template is rendered and the text tokenized by the same two
calls ``prepare`` makes for a chat request (tools, system prompt and template kwargs included),
so the count is the ``input_tokens`` the same request would report when generating.
``Counter`` answers the request/reply subscription: each request in a task of its own (a
model's first tokenizer load must not hold up others), a long prompt tokenized off the loop,
every failure answered as ``RequestFailed`` so the gateway never waits for its timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

import nats.errors
import structlog
from nats.aio.msg import Msg

from services.preprocessor.image_fetch import ImageLoader
from services.preprocessor.images import LoadedImage, expand_placeholders
from services.preprocessor.prepare import prompt_chars, rendered_chat
from services.preprocessor.tokenizer import ModelAssets
from shared import codec
from shared.errors import InternalError, InvalidRequest, ServiceError, UpstreamTimeout
from shared.messages import CountTokens, Preprocess, TokenCount
from shared.tasks import TaskSet

log = structlog.get_logger(__name__)

OFFLOAD_CHARS = 8_000
"""Prompts with at least this much text are tokenized on a worker thread (as ``service``)."""

_DECODER = codec.decoder(CountTokens)


def count_tokens(req: Preprocess, assets: ModelAssets, images: Sequence[LoadedImage] = ()) -> int:
    """The prompt tokens of a chat request, rendered and tokenized as for generation (each
    image's placeholder expanded to its token count, decision 032)."""
    if req.api != "chat":
        raise InvalidRequest("Only chat requests can be counted.", param="messages")
    rendered = rendered_chat(req, assets)
    ids = assets.encode(rendered, add_special_tokens=False)
    if images and assets.vision is not None:
        return len(expand_placeholders(ids, images, assets.vision.image_token_id)[0])
    return len(ids)


class Counter:
    """The ``subjects.count_tokens`` handler: ``CountTokens`` in, ``TokenCount`` out."""

    __slots__ = ("_assets", "_clock", "_images", "_tasks")

    def __init__(
        self,
        assets: Callable[[str], Awaitable[ModelAssets]],
        tasks: TaskSet,
        *,
        clock: Callable[[], float] = time.time,
        images: ImageLoader | None = None,
    ) -> None:
        self._assets = assets
        self._tasks = tasks
        self._clock = clock
        self._images = images

    async def on_message(self, msg: Msg) -> None:
        """The subscription callback: answer in a task of its own."""
        self._tasks.spawn(self._answer(msg))

    async def _answer(self, msg: Msg) -> None:
        request_id = ""
        try:
            ask = _DECODER.decode(msg.data)
            request_id = ask.request_id
            tokens = await self.count(ask.request)
            data = codec.encode(TokenCount(request_id=request_id, input_tokens=tokens))
        except codec.DecodeError as exc:
            log.warning(
                "message_undecodable", subject=msg.subject, kind="count_tokens", error=str(exc)
            )
            data = codec.encode(InvalidRequest(str(exc)).to_message(request_id))
        except ServiceError as exc:
            log.info("count_failed", request_id=request_id, code=exc.code)
            data = codec.encode(exc.to_message(request_id))
        except Exception:  # the handler boundary: log once with the traceback, answer
            log.exception("count_crashed", request_id=request_id)
            data = codec.encode(InternalError("Token counting failed.").to_message(request_id))
        if not msg.reply:
            return
        try:
            await msg.respond(data)
        except nats.errors.Error as exc:  # the asker is gone: nothing to do
            log.debug("count_reply_failed", request_id=request_id, error=str(exc))

    async def count(self, req: Preprocess) -> int:
        """``count_tokens`` for ``req`` with the model's assets (loaded on first use)."""
        if req.deadline_ms and self._clock() * 1000 > req.deadline_ms:
            raise UpstreamTimeout("the request expired before its tokens were counted")
        assets = await self._assets(req.model)
        images = await self._images.load(req, assets.vision) if self._images is not None else ()
        if images or prompt_chars(req) >= OFFLOAD_CHARS:
            return await asyncio.to_thread(count_tokens, req, assets, images)
        return count_tokens(req, assets)
