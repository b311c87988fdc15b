"""What an agent needs from any engine, as checks over the official clients (decision 028):
``tool_choice`` required and named give valid calls, ``parallel_tool_calls: false`` gives one
(OpenAI chat, Responses, Anthropic ``any``/``tool`` with ``disable_parallel_tool_use``), and a
thinking budget bounds the reasoning. The same checks run against the mocker
(``tests/e2e/test_agent_controls.py``) and the transformers engine on a tiny random model
(``tests/engines/test_hf_agent_controls.py``): the tools take only enums and booleans, so even
random weights must finish a call that the grammar allows."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import jsonschema  # type: ignore[import-untyped]
import openai
from openai.types.chat import ChatCompletionMessageToolCall

WEATHER_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "detailed": {"type": "boolean"},
    },
    "required": ["unit", "detailed"],
    "additionalProperties": False,
}
TIME_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
SCHEMAS = {"get_weather": WEATHER_PARAMETERS, "get_time": TIME_PARAMETERS}
OPENAI_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": n, "parameters": p}} for n, p in SCHEMAS.items()
]
ANTHROPIC_TOOLS: list[Any] = [{"name": n, "input_schema": p} for n, p in SCHEMAS.items()]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris, and the time there?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_time"}}
NO_THINKING: dict[str, Any] = {"enable_thinking": False}
MAX_TOKENS = 400


def valid(name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    """The call's arguments, checked against its tool's schema."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert isinstance(args, dict)
    jsonschema.validate(args, SCHEMAS[name])
    return args


async def forced_chat_call(
    client: openai.AsyncOpenAI, model: str, tool_choice: Any, *, stream: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a chat answer with ``tool_choice`` and ``parallel_tool_calls: false``,
    whole or streamed (fragments joined by index), each checked against its schema."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": ASK,
        "tools": OPENAI_TOOLS,
        "tool_choice": tool_choice,
        "parallel_tool_calls": False,
        "max_tokens": MAX_TOKENS,
        "extra_body": {"chat_template_kwargs": NO_THINKING},
    }
    if not stream:
        resp = await client.chat.completions.create(**kwargs)
        choice = resp.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        calls = [
            c
            for c in choice.message.tool_calls or []
            if isinstance(c, ChatCompletionMessageToolCall)
        ]
        return [(c.function.name, valid(c.function.name, c.function.arguments)) for c in calls]
    parts: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in await client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            for fragment in choice.delta.tool_calls or []:
                part = parts.setdefault(fragment.index, {"name": "", "arguments": ""})
                if fragment.function is not None:
                    part["name"] += fragment.function.name or ""
                    part["arguments"] += fragment.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    return [(p["name"], valid(p["name"], p["arguments"])) for _, p in sorted(parts.items())]


async def forced_responses_call(client: openai.AsyncOpenAI, model: str) -> list[str]:
    """The function calls of a Responses answer with ``tool_choice: required`` and
    ``parallel_tool_calls: false``."""
    response = await client.responses.create(
        model=model,
        input="Weather in Paris, and the time there?",
        tools=[
            {"type": "function", "name": n, "parameters": p, "strict": True}
            for n, p in SCHEMAS.items()
        ],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=MAX_TOKENS,
        reasoning={"effort": "none"},
    )
    calls = [item for item in response.output if item.type == "function_call"]
    for call in calls:
        valid(call.name, call.arguments)
    return [call.name for call in calls]


async def forced_anthropic_call(
    claude: anthropic.AsyncAnthropic, model: str, tool_choice: dict[str, Any], *, stream: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The ``tool_use`` blocks of a Messages answer with ``tool_choice`` (``any`` or ``tool``)
    and ``disable_parallel_tool_use``."""
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": ASK,
        "tools": ANTHROPIC_TOOLS,
        "tool_choice": {**tool_choice, "disable_parallel_tool_use": True},
    }
    if stream:
        async with claude.messages.stream(**kwargs) as events:
            message = await events.get_final_message()
    else:
        message = await claude.messages.create(**kwargs)
    assert message.stop_reason == "tool_use", message
    uses = [b for b in message.content if b.type == "tool_use"]
    return [(u.name, valid(u.name, dict(u.input))) for u in uses]


def reasoning_of(message: Any) -> str:
    """``reasoning_content`` of a chat message (an extra field to the SDK's models)."""
    return str((message.model_extra or {}).get("reasoning_content") or "")


async def budgeted_reasoning(
    client: openai.AsyncOpenAI, model: str, budget: int, *, tools: bool
) -> tuple[str, Any]:
    """``(reasoning, message)`` of a chat answer that asked for thinking with
    ``nvext.max_thinking_tokens`` ``budget`` (and a named tool call after it when ``tools``)."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": ASK,
        "max_tokens": MAX_TOKENS,
        "extra_body": {
            "chat_template_kwargs": {"enable_thinking": True},
            "nvext": {"max_thinking_tokens": budget},
        },
    }
    if tools:
        kwargs |= {"tools": OPENAI_TOOLS, "tool_choice": NAMED}
    resp = await client.chat.completions.create(**kwargs)
    message = resp.choices[0].message
    return reasoning_of(message), message
