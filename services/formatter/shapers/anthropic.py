"""Anthropic Messages API bytes for one request (``output.format == "anthropic"``). Pure.

Not streaming: one ``message`` object whose ``content`` holds, in the order the model wrote them,
``thinking`` blocks (with an opaque ``signature``), ``text`` blocks and ``tool_use`` blocks (the
arguments as an ``input`` object).

Streaming: named SSE events (``event: <type>`` + ``data:``), as Anthropic sends them:
``message_start`` (the message with empty ``content``), ``ping``, then per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``, then one
``signature_delta`` before the thinking block stops, ``input_json_delta`` with ``partial_json``)
/ ``content_block_stop``, then ``message_delta`` (``stop_reason``, ``stop_sequence`` and the
cumulative ``usage``) and ``message_stop``. A generation the worker ended with an error ends
with Anthropic's ``error`` event instead.

``stop_reason``: ``end_turn``, ``max_tokens``, ``stop_sequence`` (a stop string ended it; it is
named in ``stop_sequence``) or ``tool_use``. ``usage.input_tokens`` counts the prompt tokens not
read from the prefix cache, ``cache_read_input_tokens`` those that were, as Anthropic counts.
Anthropic requests have ``n == 1``: every piece belongs to choice 0.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Content,
    Piece,
    Reasoning,
    TokenLogprobs,
    ToolCallStart,
)
from services.formatter.shapers.frames import encode
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.messages import StreamOpen


class AnthropicUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    output_tokens: int


class Message(msgspec.Struct, kw_only=True):
    id: str
    type: str = "message"
    role: str = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: AnthropicUsage
    nvext: Nvext | UnsetType = UNSET


def anthropic_usage(usage: Usage) -> AnthropicUsage:
    """Anthropic's ``usage``: input tokens not read from the cache, and those that were."""
    cached = usage.prompt_tokens_details.cached_tokens
    return AnthropicUsage(
        input_tokens=usage.prompt_tokens - cached,
        cache_read_input_tokens=cached,
        output_tokens=usage.completion_tokens,
    )


def stop_reason(end: ChoiceEnd) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for how a choice ended."""
    if end.finish_reason == "length":
        return "max_tokens", None
    if end.stop_string is not None:
        return "stop_sequence", end.stop_string
    if end.has_tool_calls:
        return "tool_use", None
    return "end_turn", None


def signature(thinking: str) -> str:
    """The opaque ``signature`` of a thinking block (a digest of its text; clients pass it back
    as received and it is not checked)."""
    return base64.b64encode(hashlib.sha256(b"jetserve:" + thinking.encode()).digest()).decode()


def tool_use_id(call_id: str) -> str:
    """Anthropic's form of a tool-call id (``toolu_…``)."""
    return call_id if call_id.startswith("toolu_") else "toolu_" + call_id.removeprefix("call_")


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object (``{}`` when they are not a JSON object)."""
    try:
        value = msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def event(name: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event; ``payload`` carries the same ``type``."""
    return sse.event(name, encode(payload))


class AnthropicShaper:
    """``message`` objects and Messages stream events for one request."""

    __slots__ = ("_block", "_end", "_id", "_index", "_open", "_thinking")

    def __init__(self, open_: StreamOpen) -> None:
        self._open = open_
        self._id = f"msg_{open_.request_id}"
        self._block: str | None = None
        """The kind of the open content block (``text``, ``thinking``, ``tool_use``), if any."""
        self._index = -1
        """Index of the last content block started."""
        self._thinking: list[str] = []
        """The open thinking block's text, for its signature."""
        self._end: ChoiceEnd | None = None

    # --- streaming -------------------------------------------------------------------------------

    def opening(self, usage: Usage | None = None) -> bytes:
        prompt = self._open.prompt_tokens
        start_usage = (
            anthropic_usage(usage)
            if usage is not None
            else AnthropicUsage(input_tokens=prompt, output_tokens=0)
        )
        message = Message(
            id=self._id,
            model=self._open.model,
            content=[],
            stop_reason=None,
            stop_sequence=None,
            usage=start_usage,
        )
        start = {"type": "message_start", "message": msgspec.to_builtins(message)}
        return event("message_start", start) + event("ping", {"type": "ping"})

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        out = bytearray()
        for piece in pieces:
            if isinstance(piece, Content | Reasoning):
                if not piece.text:
                    continue
                kind = "text" if isinstance(piece, Content) else "thinking"
                if self._block != kind:
                    out += self._stop_block()
                    empty = {"type": "text", "text": ""}
                    if kind == "thinking":
                        empty = {"type": "thinking", "thinking": "", "signature": ""}
                    out += self._start_block(kind, empty)
                if kind == "text":
                    delta = {"type": "text_delta", "text": piece.text}
                else:
                    self._thinking.append(piece.text)
                    delta = {"type": "thinking_delta", "thinking": piece.text}
                out += self._block_delta(delta)
            elif isinstance(piece, ToolCallStart):
                out += self._stop_block()
                block = {
                    "type": "tool_use",
                    "id": tool_use_id(piece.id),
                    "name": piece.name,
                    "input": {},
                }
                out += self._start_block("tool_use", block)
            elif piece.text:  # ToolCallArgs of the open tool_use block
                out += self._block_delta({"type": "input_json_delta", "partial_json": piece.text})
        return bytes(out)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        self._end = end
        return self._stop_block()

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        end = self._end or ChoiceEnd(finish_reason="stop")
        if end.finish_reason in ("error", "cancelled"):
            error = {"type": "api_error", "message": f"Generation ended: {end.finish_reason}."}
            return self._stop_block() + event("error", {"type": "error", "error": error})
        reason, sequence = stop_reason(end)
        delta: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": msgspec.to_builtins(anthropic_usage(usage)),
        }
        if nvext is not None:
            delta["nvext"] = msgspec.to_builtins(nvext)
        return (
            self._stop_block()
            + event("message_delta", delta)
            + event("message_stop", {"type": "message_stop"})
        )

    def _start_block(self, kind: str, block: dict[str, Any]) -> bytes:
        self._index += 1
        self._block = kind
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return event("content_block_start", start)

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        return event("content_block_delta", payload)

    def _stop_block(self) -> bytes:
        if self._block is None:
            return b""
        out = b""
        if self._block == "thinking":
            text = "".join(self._thinking)
            self._thinking.clear()
            out = self._block_delta({"type": "signature_delta", "signature": signature(text)})
        self._block = None
        stop = {"type": "content_block_stop", "index": self._index}
        return out + event("content_block_stop", stop)

    # --- not streaming ---------------------------------------------------------------------------

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        choice = choices[0]
        collected = choice.message
        content: list[dict[str, Any]] = []
        if collected.reasoning:
            thinking = collected.reasoning
            content.append(
                {"type": "thinking", "thinking": thinking, "signature": signature(thinking)}
            )
        if collected.content:
            content.append({"type": "text", "text": collected.content})
        content.extend(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id),
                "name": call.name,
                "input": tool_input(call.arguments),
            }
            for call in collected.tool_calls
        )
        reason, sequence = stop_reason(choice.end)
        message = Message(
            id=self._id,
            model=self._open.model,
            content=content,
            stop_reason=reason,
            stop_sequence=sequence,
            usage=anthropic_usage(usage),
            nvext=UNSET if nvext is None else nvext,
        )
        return encode(message)
