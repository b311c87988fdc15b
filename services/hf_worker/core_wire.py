"""What the worker and its engine process say to each other over their socket pair, and how.

Frames are a 4-byte big-endian length and one msgpack-encoded message (msgspec, tagged union).
Worker → engine: ``CoreAdd``, ``CoreCancel``, ``CoreStop``. Engine → worker: ``CoreReady`` once
the model is loaded (or ``CoreStartFailed``), then ``CoreOutputs`` per manager step. The engine
process gets its ``HfEngineOptions`` on its command line as JSON (``encode_options``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec

from services.hf_worker.grammar import GrammarSpec
from services.hf_worker.options import HfEngineOptions

__all__ = [
    "HEADER",
    "CoreAdd",
    "CoreCancel",
    "CoreFacts",
    "CoreOutput",
    "CoreOutputs",
    "CoreReady",
    "CoreStartFailed",
    "CoreStop",
    "FromCore",
    "ToCore",
    "decode_from_core",
    "decode_options",
    "decode_to_core",
    "encode_options",
    "frame",
]

HEADER = struct.Struct(">I")
"""A frame's length prefix."""
MAX_FRAME = 64 * 1024 * 1024
"""A frame longer than this is a broken stream, not a message."""


class CoreAdd(msgspec.Struct, tag="add", frozen=True, array_like=True):
    """Start one request (``sampling.cb_request``'s arguments)."""

    request_id: str
    token_ids: tuple[int, ...]
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    temperature: float
    top_k: int
    top_p: float
    grammar: GrammarSpec | None = None
    """What the output must look like (``grammar.Grammars``; None: unconstrained)."""
    resumed: tuple[int, ...] = ()
    """After a migration, the tokens an earlier worker generated (the grammar reads them first)."""


class CoreCancel(msgspec.Struct, tag="cancel", frozen=True, array_like=True):
    request_id: str


class CoreStop(msgspec.Struct, tag="stop", frozen=True, array_like=True):
    """Stop the manager and exit."""


class CoreFacts(msgspec.Struct, frozen=True):
    """What the loaded engine is."""

    device: str
    dtype: str
    vocab_size: int
    context_length: int
    kv_blocks: int
    guided: bool
    """Guided decoding is on (xgrammar is installed and its processor attached)."""


class CoreReady(msgspec.Struct, tag="ready", frozen=True, array_like=True):
    facts: CoreFacts


class CoreStartFailed(msgspec.Struct, tag="start_failed", frozen=True, array_like=True):
    error: str


class CoreOutput(msgspec.Struct, frozen=True, array_like=True):
    """One request's progress in one step: its new tokens and how many it has in all."""

    request_id: str
    new_tokens: tuple[int, ...]
    total: int
    status: int
    """transformers' ``RequestStatus``: 3 finished, 4 failed (``outputs.FINISHED``)."""
    error: str | None = None
    refused: bool = False
    """The engine refused the request (its constraint does not compile): a 400, not a failure."""


class CoreOutputs(msgspec.Struct, tag="outputs", frozen=True, array_like=True):
    """One manager step's outputs, and how many outputs the engine has dropped so far (for
    requests no longer there: a cancelled one's steps in flight)."""

    outputs: list[CoreOutput]
    dropped: int


ToCore = CoreAdd | CoreCancel | CoreStop
FromCore = CoreReady | CoreStartFailed | CoreOutputs

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)


def frame(message: ToCore | FromCore) -> bytes:
    """One message with its length prefix."""
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


def decode_to_core(body: bytes) -> ToCore:
    message: ToCore = _to_core.decode(body)
    return message


def decode_from_core(body: bytes) -> FromCore:
    message: FromCore = _from_core.decode(body)
    return message


def encode_options(options: HfEngineOptions) -> str:
    return msgspec.json.encode(options, enc_hook=_enc).decode()


def decode_options(text: str) -> HfEngineOptions:
    return msgspec.json.decode(text, type=HfEngineOptions, dec_hook=_dec)


def _enc(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise NotImplementedError(type(value))


def _dec(kind: type, value: Any) -> Any:
    if kind is Path:
        return Path(value)
    raise NotImplementedError(kind)
