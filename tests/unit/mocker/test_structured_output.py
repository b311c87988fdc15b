"""Structured output as a real model writes it: reasoning blocks, tool calls in each syntax with
arguments valid against the tool's schema, JSON documents; tokenized with the real Qwen3
tokenizer so that it decodes back to the same text."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from tokenizers import Tokenizer

from services.mocker import structured
from services.mocker.corpus import CORPUS, load_tokenizer
from shared.messages import Guided
from shared.model_dir import ensure_default_model_dir

WEATHER: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 3},
            "details": {"type": "object", "properties": {"wind": {"type": "boolean"}}},
        },
        "required": ["city", "unit"],
    },
}
SEARCH: dict[str, Any] = {
    "type": "function",  # OpenAI's wrapped form is read too
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 3}},
            "required": ["query"],
        },
    },
}
SCHEMAS = {"get_weather": WEATHER["parameters"], "search": SEARCH["function"]["parameters"]}
PROSE = " ".join(CORPUS.split())


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    model_dir: Path = ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))
    return load_tokenizer(model_dir)


def _encode(tokenizer: Tokenizer) -> structured.Encode:
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def _parse_calls(syntax: str, text: str) -> list[tuple[str, Any]]:
    """An independent reading of each syntax (as the formatter's parsers read it)."""
    if syntax == "hermes":
        bodies = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, re.S)
        return [(c["name"], c["arguments"]) for c in map(json.loads, bodies)]
    if syntax == "llama3_json":
        return [(c["name"], c["parameters"]) for c in map(json.loads, text.split("; "))]
    if syntax == "mistral":
        assert text.startswith("[TOOL_CALLS]")
        return [(c["name"], c["arguments"]) for c in json.loads(text[len("[TOOL_CALLS]") :])]
    calls = []
    for name, body in re.findall(r"<tool_call>\n<function=(\w+)>\n(.*?)</function>", text, re.S):
        params = re.findall(r"<parameter=(\w+)>\n(.*?)\n</parameter>", body, re.S)
        schema = SCHEMAS[name]["properties"]
        args = {
            key: value if schema[key].get("type") == "string" else json.loads(value)
            for key, value in params
        }
        calls.append((name, args))
    return calls


@pytest.mark.parametrize("syntax", structured.SYNTAXES)
def test_required_tool_calls_parse_and_validate_in_every_syntax(syntax: str) -> None:
    guided = Guided(tools=(WEATHER, SEARCH), tool_choice="required", tool_syntax=syntax)
    for seed in range(5):
        written = structured.write(guided, seed)
        assert written.reasoning is None
        assert written.answer is not None
        calls = _parse_calls(syntax, written.answer)
        assert sorted(name for name, _ in calls) == ["get_weather", "search"]  # parallel: two
        for name, args in calls:
            jsonschema.validate(args, SCHEMAS[name])


def test_hermes_is_exactly_the_qwen_format() -> None:
    guided = Guided(tools=(WEATHER,), tool_choice="get_weather", tool_syntax="hermes")
    answer = structured.write(guided, 1).answer or ""
    assert answer.startswith('<tool_call>\n{"name": "get_weather", "arguments": {"city": ')
    assert answer.endswith("}}\n</tool_call>")
    assert answer.count("<tool_call>") == 1


def test_named_tool_choice_calls_that_tool_once() -> None:
    guided = Guided(tools=(WEATHER, SEARCH), tool_choice="search", tool_syntax="hermes")
    for seed in range(5):
        calls = _parse_calls("hermes", structured.write(guided, seed).answer or "")
        assert [name for name, _ in calls] == ["search"]


def test_one_call_without_parallel_tool_calls() -> None:
    guided = Guided(tools=(WEATHER, SEARCH), tool_choice="required", parallel_tool_calls=False)
    assert len(_parse_calls("hermes", structured.write(guided, 2).answer or "")) == 1


def test_auto_calls_tools_only_on_the_users_turn() -> None:
    auto = Guided(tools=(WEATHER,), tool_choice="auto")
    assert structured.write(auto, 0).answer is not None
    after_result = Guided(tools=(WEATHER,), tool_choice="auto", tool_turn=False)
    assert structured.write(after_result, 0).answer is None  # answers the tool result in prose
    none = Guided(tools=(WEATHER,), tool_choice="none")
    assert structured.write(none, 0).answer is None


def test_json_schema_document_validates() -> None:
    schema = WEATHER["parameters"]
    for seed in range(5):
        answer = structured.write(Guided(json_schema=schema), seed).answer or ""
        jsonschema.validate(json.loads(answer), schema)


def test_json_object_is_an_object() -> None:
    answer = structured.write(Guided(json_object=True), 3).answer or ""
    assert isinstance(json.loads(answer), dict)


def test_tools_win_over_a_response_format() -> None:
    guided = Guided(tools=(WEATHER,), tool_choice="required", json_object=True)
    assert "<tool_call>" in (structured.write(guided, 0).answer or "")


def test_reasoning_block_is_corpus_prose_then_the_answer() -> None:
    guided = Guided(tools=(WEATHER,), tool_choice="required", thinking=True)
    text = structured.write(guided, 4).text()
    match = re.fullmatch(r"<think>\n(.+)\n</think>\n\n(<tool_call>\n.*)", text, re.S)
    assert match is not None
    assert match.group(1) in PROSE


def test_thinking_opened_leaves_out_the_opening_tag() -> None:
    text = structured.write(Guided(thinking=True, thinking_opened=True), 4).text()
    assert not text.startswith("<think>")
    assert text.endswith("\n</think>\n\n")


def test_same_seed_same_text_and_seeds_differ() -> None:
    guided = Guided(tools=(WEATHER, SEARCH), tool_choice="required", thinking=True)
    assert structured.write(guided, "a").text() == structured.write(guided, "a").text()
    assert len({structured.write(guided, s).text() for s in range(10)}) > 1


def test_nothing_structured_is_no_script(tokenizer: Tokenizer) -> None:
    assert structured.script(Guided(), 0, _encode(tokenizer)) is None
    assert (
        structured.script(Guided(tools=(WEATHER,), tool_turn=False), 0, _encode(tokenizer)) is None
    )


def test_script_decodes_to_the_text_with_single_tag_tokens(tokenizer: Tokenizer) -> None:
    guided = Guided(tools=(WEATHER,), tool_choice="required", thinking=True)
    script = structured.script(guided, 5, _encode(tokenizer))
    assert script is not None
    assert script.ends
    assert (
        tokenizer.decode(list(script.ids), skip_special_tokens=True)
        == structured.write(guided, 5).text()
    )
    for tag in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
        assert tokenizer.token_to_id(tag) in script.ids  # one added token each


def test_reasoning_only_script_is_followed_by_prose(tokenizer: Tokenizer) -> None:
    script = structured.script(Guided(thinking=True), 5, _encode(tokenizer))
    assert script is not None
    assert not script.ends


def test_max_thinking_tokens_bounds_the_reasoning(tokenizer: Tokenizer) -> None:
    encode = _encode(tokenizer)
    guided = Guided(thinking=True, json_object=True, max_thinking_tokens=3)
    script = structured.script(guided, 5, encode)
    assert script is not None
    text = tokenizer.decode(list(script.ids), skip_special_tokens=True)
    inner = text.split("<think>\n", 1)[1].split("\n</think>", 1)[0]
    assert len(encode(inner)) <= 3
    assert json.loads(text.split("</think>\n\n", 1)[1])
