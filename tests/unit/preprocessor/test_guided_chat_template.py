"""Multi-turn tool conversations through the real Qwen3 chat template: an assistant's
``tool_calls`` (arguments as OpenAI clients send them, a JSON string) and ``role: "tool"``
results render as Qwen3 was trained on them."""

from __future__ import annotations

from typing import Any

from services.preprocessor import chat_template

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": '{"temp": 9}'},
]

EXPECTED_TAIL = (
    "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
    "<|im_start|>assistant\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    "<|im_end|>\n"
    "<|im_start|>user\n<tool_response>\n"
    '{"temp": 21}\n</tool_response>\n<tool_response>\n{"temp": 9}\n</tool_response>'
    "<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_tool_calls_and_results_render_as_qwen3_writes_them(qwen_template: str) -> None:
    messages = chat_template.normalize_messages(CONVERSATION)
    text = chat_template.render(qwen_template, messages, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_weather"' in text.split("</tools>\n")[0]
    # String arguments become objects, re-serialized as the model writes them (hermes), so a
    # model's earlier call renders byte for byte as it was generated (prefix-cache friendly).
    assert text.endswith(EXPECTED_TAIL)


def test_string_arguments_are_parsed_to_objects() -> None:
    (_, assistant, *_) = chat_template.normalize_messages(CONVERSATION)
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert assistant["content"] == ""
