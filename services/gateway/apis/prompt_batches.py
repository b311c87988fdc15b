"""Pure: legacy completions with several prompts in one request (``prompt`` as a list of strings
or of token-id lists), as OpenAI's API allows (decision 030).

Each prompt is one request on the bus (``n`` choices each); their answers are merged into one:
the choices of prompt ``i`` are numbered ``i * n + j`` (OpenAI's order), the ``id`` and
``created`` are the first answer's, and ``usage`` is summed. Streaming, every chunk is renumbered
as it passes (``BatchStream``); each prompt's ``[DONE]`` is held back, and so is its usage chunk
(``stream_options.include_usage``), which goes out summed, once, before the one ``[DONE]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from shared import sse

_DONE_PAYLOAD = b"[DONE]"


def merged_body(bodies: Sequence[bytes], n: int) -> bytes:
    """One completion body from the bodies of every prompt, in prompt order."""
    merged: dict[str, Any] | None = None
    for i, data in enumerate(bodies):
        body = msgspec.json.decode(data)
        for choice in body.get("choices") or ():
            choice["index"] = i * n + choice.get("index", 0)
        if merged is None:
            merged = body
            continue
        merged["choices"] += body.get("choices") or []
        merged["usage"] = summed(merged.get("usage"), body.get("usage"))
    return msgspec.json.encode(merged)


def summed(a: Any, b: Any) -> Any:
    """Two usage objects added up field by field (numbers summed, objects recursively)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: summed(a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b])}
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a + b
    return a if b is None else b


class BatchStream:
    """Renumbers the chunks of ``count`` prompts' streams into one stream."""

    __slots__ = ("_id", "_n", "_usage")

    def __init__(self, n: int) -> None:
        self._n = n
        self._id: str | None = None
        self._usage: Any = None

    def rewrite(self, index: int, data: bytes) -> bytes:
        """Prompt ``index``'s SSE bytes, its choices renumbered, its ``[DONE]`` and usage
        chunk held back."""
        out = bytearray()
        for frame in data.split(sse.END):
            if not frame:
                continue
            if not frame.startswith(sse.PREFIX):
                out += frame + sse.END  # a comment (keep-alive)
                continue
            payload = frame[len(sse.PREFIX) :]
            if payload == _DONE_PAYLOAD:
                continue
            chunk = msgspec.json.decode(payload)
            if not isinstance(chunk, dict) or "choices" not in chunk:
                out += frame + sse.END  # an error event: as it is
                continue
            if self._id is None:
                self._id = chunk.get("id")
            chunk["id"] = self._id
            if not chunk["choices"] and chunk.get("usage") is not None:
                self._usage = chunk if self._usage is None else self._add_usage(chunk)
                continue
            for choice in chunk["choices"]:
                choice["index"] = index * self._n + choice.get("index", 0)
            out += sse.frame(msgspec.json.encode(chunk))
        return bytes(out)

    def _add_usage(self, chunk: dict[str, Any]) -> dict[str, Any]:
        held = dict(self._usage)
        held["usage"] = summed(held.get("usage"), chunk.get("usage"))
        return held

    def closing(self) -> bytes:
        """The summed usage chunk (when the prompts sent one), then ``[DONE]``."""
        usage = b"" if self._usage is None else sse.frame(msgspec.json.encode(self._usage))
        return usage + sse.DONE
