"""The preprocessor completes ``Guided`` and the output options from the model's card: syntaxes,
thinking, a prompt that opened the reasoning block, the tool turn; ``n`` > 1 never migrates."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from services.preprocessor.guided import opens_reasoning, thinking_enabled, tool_turn
from services.preprocessor.prepare import prepare, stream_open
from services.preprocessor.tokenizer import ModelAssets, load_assets
from shared.messages import Guided, ModelCard, OutputOptions, Preprocess, SamplingParams

from .conftest import QWEN, QWEN_EOS

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
USER = ({"role": "user", "content": "Weather in Paris?"},)
TOOL_TURN = (
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
)
R1_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|><think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def qwen3(qwen_files: dict[str, bytes]) -> ModelAssets:
    """Qwen3 as the mocker publishes it: hermes tool calls, qwen3 reasoning."""
    card = ModelCard(
        model=QWEN,
        context_length=40960,
        eos_token_ids=QWEN_EOS,
        tool_parser="hermes",
        reasoning_parser="qwen3",
    )
    return load_assets(card, qwen_files)


def _req(**fields: Any) -> Preprocess:
    base: dict[str, Any] = {
        "request_id": "r1",
        "api": "chat",
        "model": QWEN,
        "reply_to": "gw.r1",
        "created": 1,
        "messages": USER,
        "max_tokens": 64,
    }
    return Preprocess(**{**base, **fields})


def _tools(choice: str = "auto", **fields: Any) -> dict[str, Any]:
    guided = Guided(tools=(TOOL,), tool_choice=choice)
    return {"tools": (TOOL,), "sampling": SamplingParams(guided=guided), **fields}


def test_card_parsers_reach_the_assets(qwen3: ModelAssets) -> None:
    assert (qwen3.tool_parser, qwen3.reasoning_parser) == ("hermes", "qwen3")


def test_tools_and_reasoning_are_completed_from_the_card(qwen3: ModelAssets) -> None:
    req = _req(chat_template_kwargs={"enable_thinking": True}, **_tools("required"))
    prepared = prepare(req, qwen3)
    guided = prepared.sampling.guided
    assert guided is not None
    assert (guided.tool_syntax, guided.reasoning_syntax) == ("hermes", "qwen3")
    assert (guided.thinking, guided.thinking_opened, guided.tool_turn) == (True, False, True)
    assert (guided.tool_choice, guided.tools) == ("required", (TOOL,))
    assert stream_open(req, prepared).tools == (TOOL,)  # the parsers may need the schemas
    output = stream_open(req, prepared).output
    assert (output.tool_parser, output.reasoning_parser, output.reasoning_open) == (
        "hermes",
        "qwen3",
        False,
    )


def test_a_tool_result_last_is_not_a_tool_turn(qwen3: ModelAssets) -> None:
    prepared = prepare(_req(messages=TOOL_TURN, **_tools()), qwen3)
    assert prepared.sampling.guided is not None
    assert prepared.sampling.guided.tool_turn is False


def test_enable_thinking_false_turns_reasoning_off(qwen3: ModelAssets) -> None:
    req = _req(chat_template_kwargs={"enable_thinking": False}, **_tools())
    prepared = prepare(req, qwen3)
    assert prepared.sampling.guided is not None
    assert prepared.sampling.guided.thinking is False
    assert stream_open(req, prepared).output.reasoning_parser == ""


def test_tool_choice_none_parses_no_tool_calls(qwen3: ModelAssets) -> None:
    req = _req(**_tools("none"))
    assert stream_open(req, prepare(req, qwen3)).output.tool_parser == ""
    assert stream_open(req, prepare(req, qwen3)).tools == ()


def test_a_thinking_model_writes_reasoning_only_when_asked(qwen3: ModelAssets) -> None:
    plain = _req()
    prepared = prepare(plain, qwen3)
    assert prepared.sampling.guided is None  # the mocker answers plainly...
    assert (
        stream_open(plain, prepared).output.reasoning_parser == "qwen3"
    )  # ...a real model may not
    asked = prepare(_req(chat_template_kwargs={"enable_thinking": True}), qwen3)
    assert asked.sampling.guided == Guided(
        tool_syntax="hermes", reasoning_syntax="qwen3", thinking=True
    )


def test_a_model_without_parsers_leaves_plain_requests_alone(qwen_assets: ModelAssets) -> None:
    req = _req(output=OutputOptions(stream=True))
    prepared = prepare(req, qwen_assets)
    assert prepared.sampling.guided is None
    assert stream_open(req, prepared).output == OutputOptions(stream=True)


def test_a_template_that_opens_the_block(qwen_assets: ModelAssets) -> None:
    r1 = dataclasses.replace(
        qwen_assets, chat_templates={"default": R1_TEMPLATE}, reasoning_parser="deepseek_r1"
    )
    req = _req()
    output = stream_open(req, prepare(req, r1)).output
    assert (output.reasoning_parser, output.reasoning_open) == ("deepseek_r1", True)
    asked = prepare(_req(chat_template_kwargs={"thinking": True}), r1)
    assert asked.sampling.guided is not None
    assert asked.sampling.guided.thinking_opened is True


def test_completions_do_not_think(qwen3: ModelAssets) -> None:
    plain = prepare(_req(api="completion", messages=(), prompt="Once upon a time"), qwen3)
    assert plain.sampling.guided is None
    schema = {"type": "object"}
    req = _req(
        api="completion",
        messages=(),
        prompt="Once",
        sampling=SamplingParams(guided=Guided(json_schema=schema)),
    )
    guided = prepare(req, qwen3).sampling.guided
    assert guided is not None
    assert (guided.json_schema, guided.thinking, guided.tool_syntax) == (schema, False, "hermes")


def test_n_greater_than_one_never_migrates(qwen3: ModelAssets) -> None:
    one = _req()
    assert stream_open(one, prepare(one, qwen3), migration_limit=3).migration_limit == 3
    three = _req(sampling=SamplingParams(n=3), output=OutputOptions(n=3))
    opened = stream_open(three, prepare(three, qwen3), migration_limit=3)
    assert (opened.migration_limit, opened.generate) == (0, None)


def test_helpers() -> None:
    assert opens_reasoning("<|Assistant|><think>\n")
    assert not opens_reasoning("<think>\nx\n</think>\n\n<|im_start|>assistant\n")
    assert not opens_reasoning("")
    assert thinking_enabled({})
    assert not thinking_enabled({"enable_thinking": False})
    assert not thinking_enabled({"thinking": False})
    assert tool_turn(USER)
    assert not tool_turn(TOOL_TURN)
