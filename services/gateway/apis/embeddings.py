"""Pure: OpenAI's embeddings API (``POST /v1/embeddings``) -> ``Embed`` batches, and back
(``core/asks.py`` sends them).

The body is validated here (``input``: a string, strings, token ids or lists of token ids,
1..2048 of them, none empty; ``encoding_format`` ``float`` / ``base64``; ``dimensions`` ≥ 1);
the model must be a registered embedding model (404 unknown, 400 another kind, 503 no live
worker). Inputs go out in batches (``batches``: at most ``BATCH_INPUTS`` inputs and about
``BATCH_UNITS`` tokens each, so every bus message stays far below NATS's 1 MB payload limit)
sent concurrently, each routed on its own; the answers are put back in input order.
``base64`` is each vector's little-endian float32 bytes, as OpenAI sends them (the SDKs decode
it); ``float`` is the same float32 values as JSON numbers.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from services.gateway.apis.bodies import Decoders
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import EmbedResult, ModelCard

JSON = "application/json"
PATH = "/v1/embeddings"
MAX_INPUTS = 2048
"""As OpenAI: at most 2048 inputs per request."""
BATCH_INPUTS = 32
"""Inputs per bus request: 32 vectors of 4096 float32 are 512 KiB."""
BATCH_UNITS = 65_536
"""Per bus request, at most about this many tokens (a text counts its UTF-8 bytes, an upper
bound of its tokens): ids travel as MessagePack integers of up to 5 bytes."""
CONCURRENT_BATCHES = 8

TokenId = Annotated[int, Meta(ge=0, le=2**32 - 1)]
Dimensions = Annotated[int, Meta(ge=1)]
EncodingFormat = Literal["float", "base64"]


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """OpenAI's ``CreateEmbeddingRequest``; unknown fields are ignored (see ``Strict...``)."""

    model: str
    input: str | list[str | TokenId | list[TokenId]]
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    encoding_format: EncodingFormat | None = None
    dimensions: Dimensions | None = None
    """Truncate each vector to this many dimensions (then renormalize)."""
    user: str | None = None
    """Accepted, not acted on (an end-user id for abuse monitoring)."""


class StrictEmbeddingRequest(EmbeddingRequest, kw_only=True, forbid_unknown_fields=True):
    """``EmbeddingRequest`` with unknown top-level fields refused (the gateway's default)."""


class EmbeddingData(msgspec.Struct, kw_only=True):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(msgspec.Struct, kw_only=True):
    """OpenAI's ``CreateEmbeddingResponse``."""

    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class Inputs(msgspec.Struct, frozen=True):
    """A request's inputs, one kind: texts or token-id lists (never both, never empty)."""

    texts: tuple[str, ...] = ()
    token_ids: tuple[tuple[int, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.texts) or len(self.token_ids)

    def units(self) -> list[int]:
        """Each input's size in batch units (UTF-8 bytes of a text, ids of a token list)."""
        if self.texts:
            return [len(t.encode()) for t in self.texts]
        return [len(ids) for ids in self.token_ids]

    def part(self, span: range) -> Inputs:
        if self.texts:
            return Inputs(texts=self.texts[span.start : span.stop])
        return Inputs(token_ids=self.token_ids[span.start : span.stop])


_DECODERS = Decoders(StrictEmbeddingRequest, EmbeddingRequest, "embeddings request")


def parse(body: bytes, *, allow_unknown: bool = False) -> EmbeddingRequest:
    """Decode and validate an embeddings body (unknown fields: 400 unless allowed)."""
    return _DECODERS.decode(body, allow_unknown=allow_unknown)


def inputs_of(value: str | Sequence[Any]) -> Inputs:
    """``input`` as texts or token-id lists; 400 for an empty, mixed or too long one."""
    items: Sequence[Any] = [value] if isinstance(value, str) else value
    if not items:
        raise InvalidRequest("`input` must not be empty.", param="input")
    if all(isinstance(v, int) for v in items):  # one input, pre-tokenized
        return Inputs(token_ids=(tuple(items),))
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(
            f"`input` has {len(items)} items; at most {MAX_INPUTS} are allowed.", param="input"
        )
    if all(isinstance(v, str) for v in items):
        if any(not v for v in items):
            raise InvalidRequest("`input` must not contain an empty string.", param="input")
        return Inputs(texts=tuple(items))
    if all(isinstance(v, list) for v in items):
        if any(not v for v in items):
            raise InvalidRequest("`input` must not contain an empty token list.", param="input")
        return Inputs(token_ids=tuple(tuple(v) for v in items))
    raise InvalidRequest(
        "`input` must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids, not a mix.",
        param="input",
    )


def batches(units: Sequence[int], *, max_inputs: int = BATCH_INPUTS) -> list[range]:
    """Consecutive spans of inputs, each at most ``max_inputs`` long and ``BATCH_UNITS`` in
    size (an input larger than that alone in its span)."""
    spans: list[range] = []
    start, size = 0, 0
    for i, unit in enumerate(units):
        if i > start and (i - start >= max_inputs or size + unit > BATCH_UNITS):
            spans.append(range(start, i))
            start, size = i, 0
        size += unit
    if units:
        spans.append(range(start, len(units)))
    return spans


def check_card(model: str, card: ModelCard | None) -> None:
    """404 for a model never registered, 400 for one that is not an embedding model."""
    if card is None:
        raise ModelNotFound(model)
    if card.kind != "embedding":
        raise InvalidRequest(
            f"The model `{model}` is not an embedding model (it is a `{card.kind}` model); "
            "/v1/embeddings needs an embedding model.",
            param="model",
        )


def response_body(
    model: str, results: Sequence[EmbedResult], encoding_format: EncodingFormat
) -> bytes:
    """The OpenAI response for ``results`` (one per batch, in input order)."""
    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for result in results:
        prompt_tokens += result.prompt_tokens
        step = 4 * result.dimensions
        unpack = struct.Struct(f"<{result.dimensions}f").unpack_from
        for offset in range(0, len(result.vectors), step):
            if encoding_format == "base64":
                vector: list[float] | str = base64.b64encode(
                    result.vectors[offset : offset + step]
                ).decode("ascii")
            else:
                vector = list(unpack(result.vectors, offset))
            data.append({"object": "embedding", "index": len(data), "embedding": vector})
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
    body = {"object": "list", "data": data, "model": model, "usage": usage}
    return msgspec.json.encode(body)
