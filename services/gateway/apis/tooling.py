"""Pure: a chat request's ``tools`` / ``tool_choice`` / ``response_format`` -> ``Guided``.

OpenAI's rules, checked here (each a 400 naming the field): ``tool_choice`` ``required`` or a
function name needs ``tools``; a named function must be one of them; function names are unique.
The deprecated ``functions`` / ``function_call`` are read as ``tools`` / ``tool_choice`` (sending
both forms is refused), with one call at most, answered as ``function_call``
(``OutputOptions.legacy_functions``). ``tool_choice="none"`` sends no tools to the chat
template nor to the engine; with no ``tool_choice``, tools mean ``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from services.gateway.apis.openai_types import (
    ChatCompletionRequest,
    LegacyFunctionCall,
    NamedToolChoice,
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    Tool,
)
from shared.errors import InvalidRequest
from shared.messages import Guided

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class Tooling:
    """The resolved tool settings of one chat request."""

    tools: tuple[Tool, ...] = ()
    choice: str = "none"
    """``none``, ``auto``, ``required``, or the name of the function that must be called."""
    parallel: bool = True

    @property
    def active(self) -> bool:
        """Whether tools go to the template and the engine."""
        return bool(self.tools) and self.choice != "none"


def resolve(request: ChatCompletionRequest) -> Tooling:
    """Check and resolve the tool fields (raises ``InvalidRequest``)."""
    tools = _tools(request)
    choice = _choice(request)
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise InvalidRequest(
                f"Function names must be unique; `{name}` is defined twice.",
                param=f"tools[{i}].function.name",
            )
    if choice is None:
        choice = "auto" if tools else "none"
    elif choice not in ("none", "auto") and not tools:
        raise InvalidRequest(
            f"`tool_choice` {_shown(choice)} needs `tools`; none were sent.", param="tool_choice"
        )
    elif choice not in ("none", "auto", "required") and choice not in names:
        raise InvalidRequest(
            f"`tool_choice` names the function `{choice}`, which is not in `tools` "
            f"({', '.join(f'`{n}`' for n in names)}).",
            param="tool_choice",
        )
    parallel = True if request.parallel_tool_calls is None else request.parallel_tool_calls
    if request.functions is not None:
        parallel = False  # `function_call` holds one call
    return Tooling(tools=tuple(tools), choice=choice, parallel=parallel)


def template_tools(tooling: Tooling) -> tuple[dict[str, Any], ...] | None:
    """``Preprocess.tools``: the OpenAI tools as the chat template gets them, or ``None``."""
    if not tooling.active:
        return None
    return tuple({"type": "function", "function": _function(t)} for t in tooling.tools)


def guided(
    request: ChatCompletionRequest, tooling: Tooling, max_thinking_tokens: int | None
) -> Guided | None:
    """``SamplingParams.guided``: ``None`` when the request constrains nothing."""
    fmt = request.response_format
    json_schema: dict[str, Any] | None = None
    json_object = isinstance(fmt, ResponseFormatJsonObject)
    if isinstance(fmt, ResponseFormatJsonSchema):
        if fmt.json_schema.schema is None:
            json_object = True  # no schema: any JSON document, as vLLM
        else:
            json_schema = fmt.json_schema.schema
    constrains = tooling.active or json_schema is not None or json_object
    if not constrains and max_thinking_tokens is None:
        return None
    functions: tuple[dict[str, Any], ...] = ()
    choice = "auto"
    if tooling.active:
        functions = tuple(_function(t) for t in tooling.tools)
        choice = tooling.choice
    return Guided(
        json_schema=json_schema,
        json_object=json_object,
        tools=functions,
        tool_choice=choice,
        parallel_tool_calls=tooling.parallel,
        max_thinking_tokens=max_thinking_tokens,
    )


def guided_thinking(max_thinking_tokens: int) -> Guided:
    """``SamplingParams.guided`` of a request that only bounds its reasoning."""
    return Guided(max_thinking_tokens=max_thinking_tokens)


def _function(tool: Tool) -> dict[str, Any]:
    """A function definition as a dict; no ``parameters`` means none (OpenAI: "an empty
    parameter list"), written out so templates and engines need not know that rule."""
    function: dict[str, Any] = msgspec.to_builtins(tool.function)
    function.setdefault("parameters", dict(NO_PARAMETERS))
    return function


def _tools(request: ChatCompletionRequest) -> list[Tool]:
    if request.functions is not None:
        if request.tools is not None:
            raise InvalidRequest(
                "Send `tools` or the deprecated `functions`, not both.", param="functions"
            )
        return [Tool(type="function", function=f) for f in request.functions]
    return list(request.tools or ())


def _choice(request: ChatCompletionRequest) -> str | None:
    legacy = request.function_call
    choice = request.tool_choice
    if legacy is not None:
        if choice is not None:
            raise InvalidRequest(
                "Send `tool_choice` or the deprecated `function_call`, not both.",
                param="function_call",
            )
        return legacy.name if isinstance(legacy, LegacyFunctionCall) else legacy
    if isinstance(choice, NamedToolChoice):
        return choice.function.name
    return choice


def _shown(choice: str) -> str:
    return f"`{choice}`" if choice == "required" else f"naming `{choice}`"
