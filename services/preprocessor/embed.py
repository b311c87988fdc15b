"""``Embed`` (gateway, request/reply, queue group) → token ids → ``EmbedTokens`` to the routers.

Every input is tokenized with the model's own tokenizer from the registry (as the model's
pooling runner would: ``add_special_tokens=True``); pre-tokenized inputs are checked against
the vocabulary; each input must fit the model's context (400 ``context_length_exceeded``).

Routing: the tokenized request goes to the routers' queue group (``subjects.embed_route``),
which pick a live worker of the model as for any request (``services.router.embeds``: least
loaded by the workers' load reports, round robin among equals; no KV scoring, since pooling
keeps no cache to reuse). Routers, not this service, because they already follow the registry,
know which workers were lost, and retry another worker on "no responders"; the preprocessor
stays a stateless text → tokens stage. With no router running the publish bounces and the
gateway gets a 503 (``shared.bounce``), as for chat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from services.preprocessor.assets import AssetCache
from services.preprocessor.tokenizer import ModelAssets
from shared import codec
from shared.bounce import Bounces
from shared.errors import ContextLengthExceeded, InvalidRequest, UpstreamTimeout
from shared.handlers import Boundary
from shared.messages import Embed, EmbedTokens
from shared.subjects import Subjects
from shared.tasks import TaskSet

QUEUE = "preprocessor"
OFFLOAD_CHARS = 8_000
"""Inputs with this much text in all are tokenized on a worker thread (``encode_batch_fast``
releases the GIL)."""

TokenIds = tuple[tuple[int, ...], ...]


class InputTooLong(ContextLengthExceeded):
    """One input has more tokens than the model's context (``context_length_exceeded``)."""

    def __init__(self, *, index: int, limit: int, tokens: int) -> None:
        InvalidRequest.__init__(
            self,
            f"This model's maximum context length is {limit} tokens. However, input {index} "
            f"has {tokens} tokens. Please reduce the length of the input.",
            param="input",
        )
        self.limit = limit
        self.requested = tokens


def tokenize(req: Embed, assets: ModelAssets) -> TokenIds:
    """The token ids of every input of ``req``, checked; texts are tokenized.

    Raises:
        InvalidRequest: no input, an input with no tokens, or a token id outside the vocabulary.
        InputTooLong: an input longer than the model's context.
    """
    if req.texts and req.token_ids:
        raise InvalidRequest("input is either texts or token ids, not both", param="input")
    if req.texts:
        encoded = assets.tokenizer.encode_batch_fast(list(req.texts), add_special_tokens=True)
        ids: TokenIds = tuple(tuple(e.ids) for e in encoded)
    else:
        vocab = assets.vocab_size
        ids = tuple(check_vocabulary(i, row, vocab) for i, row in enumerate(req.token_ids))
    if not ids:
        raise InvalidRequest("input must not be empty", param="input")
    limit = assets.context_length
    for index, row in enumerate(ids):
        if not row:
            raise InvalidRequest(f"input {index} has no tokens", param="input")
        if len(row) > limit:
            raise InputTooLong(index=index, limit=limit, tokens=len(row))
    return ids


def check_vocabulary(index: int, row: Sequence[int], vocab_size: int) -> tuple[int, ...]:
    """``row`` as a tuple, or 400 naming the input and the first id outside the vocabulary."""
    for token_id in row:
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(
                f"input {index}: token id {token_id} is out of vocabulary (0..{vocab_size - 1})",
                param="input",
            )
    return tuple(row)


def _reply_to(req: Embed) -> str:
    return req.reply_to


class EmbedHandler:
    """The preprocessor's ``Embed`` subscription: tokenize, check, forward to the routers."""

    def __init__(
        self,
        nc: Client,
        subjects: Subjects,
        assets: AssetCache,
        bounces: Bounces[str],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._nc = nc
        self._subjects = subjects
        self._assets = assets
        self._bounces = bounces
        self._clock = clock

    async def on_embed(self, req: Embed) -> None:
        """Tokenize ``req`` and publish it to the routers; failures go to ``req.reply_to``."""
        if req.deadline_ms and self._clock() * 1000 > req.deadline_ms:
            raise UpstreamTimeout("the request expired before it was preprocessed")
        assets = await self._assets.get(req.model)
        if sum(map(len, req.texts)) >= OFFLOAD_CHARS:
            ids = await asyncio.to_thread(tokenize, req, assets)
        else:
            ids = tokenize(req, assets)
        routed = EmbedTokens(
            request_id=req.request_id,
            model=req.model,
            reply_to=req.reply_to,
            token_ids=ids,
            dimensions=req.dimensions,
            deadline_ms=req.deadline_ms,
        )
        # With no router the server bounces this to us at once; the bounce handler answers 503.
        reply = self._bounces.reply_for(req.request_id, req.reply_to)
        await self._nc.publish(self._subjects.embed_route, codec.encode(routed), reply=reply)


async def subscribe(
    nc: Client,
    subjects: Subjects,
    assets: AssetCache,
    boundary: Boundary,
    bounces: Bounces[str],
    tasks: TaskSet,
) -> Subscription:
    """Join the ``preprocessor`` queue group on ``subjects.embed`` (each request in a task of
    ``tasks``, so a model's first tokenizer load holds up nothing else)."""
    handler = EmbedHandler(nc, subjects, assets, bounces)
    callback = boundary.handler(
        codec.decoder(Embed), "embed", handler.on_embed, reply_to=_reply_to, tasks=tasks
    )
    return await nc.subscribe(subjects.embed, queue=QUEUE, cb=callback)
