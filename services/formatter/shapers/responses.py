"""OpenAI Responses API bytes for one request (``output.format == "responses"``). Pure.

Not streaming: one ``response`` object. Its ``output`` holds, in the order the model wrote them,
``reasoning`` items (the text as ``reasoning_text`` content), one ``message`` item per stretch
of answer text (``output_text`` content) and ``function_call`` items (``call_id``, ``name``,
``arguments``). ``status`` is ``completed``, or ``incomplete`` with ``incomplete_details.reason
= "max_output_tokens"`` when the token limit cut it.

Streaming: named SSE events (``event: <type>`` + ``data:``), each with its ``sequence_number``
from 0, as OpenAI sends them: ``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, then for a message ``response.content_part.added``,
``response.output_text.delta``… ``response.output_text.done``, ``response.content_part.done``;
for reasoning the same with ``reasoning_text`` parts and ``response.reasoning_text.delta`` /
``.done``; for a function call ``response.function_call_arguments.delta``… ``.done``; then
``response.output_item.done``. Last, ``response.completed`` (``response.incomplete`` when cut
by the token limit, ``response.failed`` when the worker failed). No ``[DONE]``: Responses
streams end with their last event.

The response repeats the request's parameters (``tools``, ``instructions``, ``temperature``…)
that the gateway sent in ``OutputOptions.response_fields``. Nothing is stored (``store: false``).
Every field the OpenResponses schema requires is present in every ``response`` object, streamed
or not (``null`` or the API's default when there is no value: ``completed_at`` until completed,
``presence_penalty`` 0, ``safety_identifier`` and ``prompt_cache_key`` null).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

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
from services.formatter.shapers.openai_chat import MIN_LOGPROB
from services.formatter.shaping import Nvext, Usage
from shared import sse
from shared.messages import StreamOpen


def responses_usage(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The Responses API's ``usage``."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.prompt_tokens_details.cached_tokens,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def call_item_id(call_id: str) -> str:
    """A function-call item's ``id`` (``fc_…``), from its ``call_id``."""
    return "fc_" + call_id.removeprefix("call_")


def text_logprobs(logprobs: Sequence[TokenLogprobs], *, with_bytes: bool) -> list[dict[str, Any]]:
    """``output_text`` log-probabilities (with ``bytes`` in the finished part, as OpenAI)."""
    out: list[dict[str, Any]] = []
    for lp in logprobs:
        top = [
            {"token": t.token, "bytes": list(t.bytes), "logprob": max(t.logprob, MIN_LOGPROB)}
            if with_bytes
            else {"token": t.token, "logprob": max(t.logprob, MIN_LOGPROB)}
            for t in lp.top
        ]
        entry: dict[str, Any] = {"token": lp.token}
        if with_bytes:
            entry["bytes"] = list(lp.bytes)
        entry["logprob"] = max(lp.logprob, MIN_LOGPROB)
        entry["top_logprobs"] = top
        out.append(entry)
    return out


@dataclass(slots=True)
class _Item:
    """One output item while it is being written."""

    kind: str
    """``message``, ``reasoning`` or ``function_call``."""
    id: str
    output_index: int
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    call_id: str = ""
    name: str = ""

    def done(self, status: str) -> dict[str, Any]:
        """The finished item, as ``output`` shows it."""
        text = "".join(self.text)
        if self.kind == "message":
            return {
                "id": self.id,
                "type": "message",
                "status": status,
                "content": [_output_text(text, self.logprobs)],
                "role": "assistant",
            }
        if self.kind == "reasoning":
            return {
                "id": self.id,
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
                "status": status,
            }
        return {
            "id": self.id,
            "type": "function_call",
            "status": status,
            "arguments": text,
            "call_id": self.call_id,
            "name": self.name,
        }


def _output_text(text: str, logprobs: Sequence[TokenLogprobs]) -> dict[str, Any]:
    return {
        "type": "output_text",
        "annotations": [],
        "logprobs": text_logprobs(logprobs, with_bytes=True),
        "text": text,
    }


class ResponsesShaper:
    """``response`` objects and Responses stream events for one request."""

    __slots__ = ("_echo", "_end", "_id", "_item", "_items", "_open", "_sequence")

    def __init__(self, open_: StreamOpen) -> None:
        self._open = open_
        self._id = f"resp_{open_.request_id}"
        self._sequence = 0
        self._item: _Item | None = None
        """The output item being written (streaming)."""
        self._items: list[dict[str, Any]] = []
        """The finished output items (streaming)."""
        self._end: ChoiceEnd | None = None
        self._echo = open_.output.response_fields or {}
        """The request's parameters the response repeats (none when the gateway sent none)."""

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        nvext: Nvext | None = None,
    ) -> dict[str, Any]:
        """The ``response`` object, fields in OpenAI's order."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        out: dict[str, Any] = {
            "id": self._id,
            "object": "response",
            "created_at": self._open.created,
            "status": status,
            "background": False,
            "completed_at": self._open.created if status == "completed" else None,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": None,
            "max_output_tokens": None,
            "max_tool_calls": None,
            "model": self._open.model,
            "output": output,
            "parallel_tool_calls": True,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "previous_response_id": None,
            "prompt_cache_key": None,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": None,
            "service_tier": "default",
            "store": False,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto",
            "tools": [],
            "top_logprobs": self._open.output.logprobs or 0,
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }
        out.update(self._echo)
        if nvext is not None:
            out["nvext"] = msgspec.to_builtins(nvext)
        return out

    # --- streaming -------------------------------------------------------------------------------

    def opening(self, usage: Usage | None = None) -> bytes:
        response = self.response("in_progress", [])
        return self._event("response.created", {"response": response}) + self._event(
            "response.in_progress", {"response": response}
        )

    def delta(
        self,
        choice: int,
        pieces: Sequence[Piece],
        logprobs: Sequence[TokenLogprobs] = (),
        usage: Usage | None = None,
    ) -> bytes:
        out = bytearray()
        pending = list(logprobs)
        for piece in pieces:
            if isinstance(piece, Content | Reasoning):
                if not piece.text:
                    continue
                kind = "message" if isinstance(piece, Content) else "reasoning"
                item = self._item
                if item is None or item.kind != kind:
                    out += self._finish_item("completed")
                    item = self._start_item(kind, out)
                item.text.append(piece.text)
                if kind == "message":
                    item.logprobs.extend(pending)
                    out += self._event(
                        "response.output_text.delta",
                        {
                            "item_id": item.id,
                            "output_index": item.output_index,
                            "content_index": 0,
                            "delta": piece.text,
                            "logprobs": text_logprobs(pending, with_bytes=False),
                        },
                    )
                    pending = []
                else:
                    out += self._event(
                        "response.reasoning_text.delta",
                        {
                            "item_id": item.id,
                            "output_index": item.output_index,
                            "content_index": 0,
                            "delta": piece.text,
                        },
                    )
            elif isinstance(piece, ToolCallStart):
                out += self._finish_item("completed")
                index = len(self._items)
                self._item = _Item(
                    "function_call",
                    call_item_id(piece.id),
                    index,
                    call_id=piece.id,
                    name=piece.name,
                )
                out += self._event(
                    "response.output_item.added",
                    {"output_index": index, "item": self._item.done("in_progress")},
                )
            elif piece.text and self._item is not None:  # ToolCallArgs of the open call
                item = self._item
                item.text.append(piece.text)
                out += self._event(
                    "response.function_call_arguments.delta",
                    {"item_id": item.id, "output_index": item.output_index, "delta": piece.text},
                )
        return bytes(out)

    def choice_end(self, choice: int, end: ChoiceEnd, usage: Usage | None = None) -> bytes:
        self._end = end
        return self._finish_item("incomplete" if end.finish_reason == "length" else "completed")

    def closing(self, usage: Usage, nvext: Nvext | None = None) -> bytes:
        end = self._end or ChoiceEnd(finish_reason="stop")
        out = self._finish_item("completed")
        if end.finish_reason in ("error", "cancelled"):
            error = {"code": "server_error", "message": f"Generation ended: {end.finish_reason}."}
            response = self.response("failed", self._items, error=error, nvext=nvext)
            return out + self._event("response.failed", {"response": response})
        status = "incomplete" if end.finish_reason == "length" else "completed"
        response = self.response(status, self._items, responses_usage(usage), nvext=nvext)
        return out + self._event(f"response.{status}", {"response": response})

    def _event(self, name: str, fields: dict[str, Any]) -> bytes:
        payload = {"type": name, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return sse.event(name, encode(payload))

    def _start_item(self, kind: str, out: bytearray) -> _Item:
        index = len(self._items)
        prefix = "msg" if kind == "message" else "rs"
        item = self._item = _Item(kind, f"{prefix}_{self._open.request_id}_{index}", index)
        added = {**item.done("in_progress"), "content": []}
        out += self._event("response.output_item.added", {"output_index": index, "item": added})
        part = (
            {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            if kind == "message"
            else {"type": "reasoning_text", "text": ""}
        )
        out += self._event(
            "response.content_part.added",
            {"item_id": item.id, "output_index": index, "content_index": 0, "part": part},
        )
        return item

    def _finish_item(self, status: str) -> bytes:
        item = self._item
        if item is None:
            return b""
        self._item = None
        done = item.done(status)
        self._items.append(done)
        text = "".join(item.text)
        where = {"item_id": item.id, "output_index": item.output_index}
        out = b""
        if item.kind == "function_call":
            out += self._event(
                "response.function_call_arguments.done", {**where, "arguments": text}
            )
        else:
            part = done["content"][0]
            if item.kind == "message":
                out += self._event(
                    "response.output_text.done",
                    {**where, "content_index": 0, "text": text, "logprobs": part["logprobs"]},
                )
            else:
                out += self._event(
                    "response.reasoning_text.done", {**where, "content_index": 0, "text": text}
                )
            out += self._event(
                "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
        return out + self._event(
            "response.output_item.done", {"output_index": item.output_index, "item": done}
        )

    # --- not streaming ---------------------------------------------------------------------------

    def body(
        self, choices: Sequence[ChoiceResult], usage: Usage, nvext: Nvext | None = None
    ) -> bytes:
        choice = choices[0]
        collected = choice.message
        status = "incomplete" if choice.end.finish_reason == "length" else "completed"
        output: list[dict[str, Any]] = []
        rid = self._open.request_id
        if collected.reasoning:
            item = _Item("reasoning", f"rs_{rid}_{len(output)}", len(output))
            item.text.append(collected.reasoning)
            output.append(item.done("completed"))
        if collected.content:
            item = _Item("message", f"msg_{rid}_{len(output)}", len(output))
            item.text.append(collected.content)
            item.logprobs.extend(choice.logprobs or ())
            output.append(item.done(status))
        for call in collected.tool_calls:
            item = _Item(
                "function_call",
                call_item_id(call.id),
                len(output),
                call_id=call.id,
                name=call.name,
            )
            item.text.append(call.arguments)
            output.append(item.done("completed"))
        response = self.response(status, output, responses_usage(usage), nvext=nvext)
        return encode(response)
