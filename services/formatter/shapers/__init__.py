"""The shapers: one per output format, each turning a request's pieces into its protocol's bytes
(the ``shaping.Shaper`` contract). ``shaper_for`` picks the request's.

- ``openai_chat``: ``chat.completion`` (``api == "chat"``, ``format == "openai"``)
- ``openai_completion``: ``text_completion`` (``api == "completion"``)
- ``grpc``: bare text (``format == "text"``) and KServe stream responses (``"kserve"``)
- ``anthropic``: Messages API (``"anthropic"``), ``responses``: Responses API (``"responses"``),
  imported when first asked for.
"""

from __future__ import annotations

from services.formatter.shapers.grpc import KServeShaper, TextShaper
from services.formatter.shapers.openai_chat import ChatShaper
from services.formatter.shapers.openai_completion import CompletionShaper
from services.formatter.shaping import Shaper
from shared.messages import StreamOpen

__all__ = ["ChatShaper", "CompletionShaper", "KServeShaper", "TextShaper", "shaper_for"]


def shaper_for(open_: StreamOpen) -> Shaper:
    """The shaper for the request's output format, then its API (chat or completions)."""
    fmt = open_.output.format
    if fmt == "text":
        return TextShaper(open_)
    if fmt == "kserve":
        return KServeShaper(open_)
    if fmt == "anthropic":
        from services.formatter.shapers.anthropic import (  # type: ignore[import-not-found,unused-ignore]
            AnthropicShaper,
        )

        shaper: Shaper = AnthropicShaper(open_)
        return shaper
    if fmt == "responses":
        from services.formatter.shapers.responses import (  # type: ignore[import-not-found,unused-ignore]
            ResponsesShaper,
        )

        shaper = ResponsesShaper(open_)
        return shaper
    return ChatShaper(open_) if open_.api == "chat" else CompletionShaper(open_)
