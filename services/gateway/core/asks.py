"""The request/reply uses of the exchange: embeddings (their batches in parallel, each a request
to the preprocessors) and media (a worker of the model in turn). The API's own shapes are in
``apis/embeddings.py`` and ``apis/media.py``; the bus id and deadline come from the envelope.
"""

from __future__ import annotations

import asyncio

from services.gateway.apis import embeddings, media
from services.gateway.core.exchange import Envelope, Exchanges
from shared.messages import Embed, EmbedResult, MediaGenerate, MediaResult

CONCURRENT_BATCHES = 8
"""Embedding batches of one request in flight at once."""


async def embed(
    exchanges: Exchanges, request: embeddings.EmbeddingRequest, envelope: Envelope
) -> bytes:
    """Check the model, embed every input (batches in parallel), build the response body."""
    bus = exchanges.bus
    inputs = embeddings.inputs_of(request.input)
    embeddings.check_card(request.model, await bus.model_card(request.model))
    await bus.check_model(request.model)
    spans = embeddings.batches(inputs.units())
    limit = asyncio.Semaphore(CONCURRENT_BATCHES)
    request_id = envelope.request_id

    async def one(index: int, span: range) -> EmbedResult:
        part = inputs.part(span)
        message = Embed(
            request_id=request_id if len(spans) == 1 else f"{request_id}-{index}",
            model=request.model,
            reply_to="",
            texts=part.texts,
            token_ids=part.token_ids,
            dimensions=request.dimensions,
            deadline_ms=envelope.deadline_ms,
        )
        async with limit:
            return await bus.embed(message, envelope.timeout_s)

    results = await asyncio.gather(*(one(i, span) for i, span in enumerate(spans)))
    return embeddings.response_body(request.model, results, request.encoding_format or "float")


async def generate_media(
    exchanges: Exchanges, message: MediaGenerate, envelope: Envelope
) -> MediaResult:
    """Check the model's card, then ask its workers in turn until one answers (bounded by the
    envelope's limit over all the attempts)."""
    bus = exchanges.bus
    media.check_card(message.model, await bus.model_card(message.model), message.kind)
    return await exchanges.in_turn(
        message.model,
        envelope,
        lambda worker_id, timeout_s: bus.generate_media(message, worker_id, timeout_s),
    )
