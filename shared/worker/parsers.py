"""Which tool-call and reasoning syntax a model writes, from its name (pure).

A worker puts them on the model's card (``ModelCard.tool_parser`` / ``reasoning_parser``),
where the preprocessor and formatter read them; ``--tool-call-parser`` and
``--reasoning-parser`` override the guess (``auto``: guess; ``none``: the model has none).
"""

from __future__ import annotations

TOOL_PARSERS = ("hermes", "llama3_json", "mistral", "qwen3_coder")
REASONING_PARSERS = ("qwen3", "deepseek_r1")
NONE = "none"
"""A setting's value for "this model has no such syntax"."""
AUTO = "auto"
"""A setting's value for "guess it from the model name"."""


def default_parsers(model_name: str) -> tuple[str, str]:
    """``(tool parser, reasoning parser)`` for a model name (empty: none), as vLLM users
    configure them for that family."""
    name = model_name.lower().replace("_", "-")
    if "deepseek-r1" in name:
        return "", "deepseek_r1"
    if "qwen3-coder" in name:
        return "qwen3_coder", ""
    if "qwen3" in name or "qwq" in name:
        return "hermes", "qwen3"
    if "qwen2.5" in name or "qwen2-5" in name:
        return "hermes", ""
    if "llama-3" in name or "llama3" in name:
        return "llama3_json", ""
    if "mistral" in name or "mixtral" in name:
        return "mistral", ""
    return "", ""


def resolve_parsers(model_name: str, tool_parser: str, reasoning_parser: str) -> tuple[str, str]:
    """The configured parsers, each guessed from the name when ``auto`` (or empty); ``none``
    → empty."""
    guessed_tool, guessed_reasoning = default_parsers(model_name)
    tool = guessed_tool if tool_parser in ("", AUTO) else tool_parser
    reasoning = guessed_reasoning if reasoning_parser in ("", AUTO) else reasoning_parser
    return ("" if tool == NONE else tool), ("" if reasoning == NONE else reasoning)
