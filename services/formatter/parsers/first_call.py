"""``parallel_tool_calls: false`` after the engine: a tool parser that answers only the first
call of a choice. Pure.

As vLLM's ``maybe_filter_parallel_tool_calls`` (``vllm/entrypoints/serve/utils/
tool_calls_utils.py``, streaming and not): whatever the engine wrote, calls after the first are
dropped; the text around them stays content. It holds on every engine, for ``tool_choice: auto``
too, where no grammar limits the calls.
"""

from __future__ import annotations

from services.formatter.pieces import Content, ToolParser, ToolPiece


class FirstCallOnly:
    """Wraps a tool parser; keeps its pieces of call index 0 and its content."""

    __slots__ = ("_inner",)

    def __init__(self, inner: ToolParser) -> None:
        self._inner = inner

    def push(self, text: str) -> list[ToolPiece]:
        return _first(self._inner.push(text))

    def flush(self) -> list[ToolPiece]:
        return _first(self._inner.flush())


def _first(pieces: list[ToolPiece]) -> list[ToolPiece]:
    return [p for p in pieces if isinstance(p, Content) or p.index == 0]
