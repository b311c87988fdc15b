"""JetServe sampling → vLLM ``SamplingParams`` kwargs and the ``/v1/completions`` body.

Field names follow ``vllm/sampling_params.py`` (commit 00388f6573ccfcffad607b8c9ecdf341a4669ceb)
and vLLM's ``CompletionRequest`` (``return_token_ids``, ``return_tokens_as_token_ids``,
``structured_outputs``, ``cache_salt``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.vllm_worker.sampling import (
    SALT_PREFIX,
    cache_salt,
    completions_body,
    engine_kwargs,
    features_for_version,
    structured_outputs,
)
from shared.messages import Guided, SamplingParams
from shared.worker.records import EngineError


def test_defaults_map_to_delta_token_only_output() -> None:
    kwargs = engine_kwargs(SamplingParams())
    assert kwargs == {
        "n": 1,
        "max_tokens": 16,
        "min_tokens": 0,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": False,
        "stop_token_ids": [],
        "output_kind": "DELTA",
        "detokenize": False,
        "skip_special_tokens": False,
    }


def test_every_field_is_carried() -> None:
    sampling = SamplingParams(
        max_tokens=7,
        min_tokens=2,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=11,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        ignore_eos=True,
        stop_token_ids=(2, 3),
        n=3,
        logprobs=4,
        min_p=0.05,
        repetition_penalty=1.1,
        logit_bias={5: -100.0},
    )
    kwargs = engine_kwargs(sampling)
    expected = {
        "max_tokens": 7,
        "min_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 11,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "ignore_eos": True,
        "stop_token_ids": [2, 3],
        "n": 3,
        "logprobs": 4,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "logit_bias": {5: -100.0},
    }
    assert {k: kwargs[k] for k in expected} == expected


def test_greedy_is_temperature_zero_without_truncation() -> None:
    kwargs = engine_kwargs(SamplingParams(greedy=True, temperature=0.8, top_k=5, top_p=0.5))
    assert (kwargs["temperature"], kwargs["top_k"], kwargs["top_p"]) == (0.0, 0, 1.0)


def test_guided_json_schema_and_object_become_structured_outputs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    kwargs = engine_kwargs(SamplingParams(guided=Guided(json_schema=schema)))
    assert kwargs["structured_outputs"] == {"json": schema}
    assert structured_outputs(Guided(json_object=True)) == {"json_object": True}
    assert structured_outputs(Guided(tools=({"name": "f"},))) is None  # auto: free text
    assert structured_outputs(None) is None


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = ({"name": "get_weather", "parameters": WEATHER}, {"name": "search", "strict": False})


def _tag(guided: Guided) -> dict[str, Any]:
    structured = structured_outputs(guided)
    assert structured is not None
    assert set(structured) == {"structural_tag"}  # StructuredOutputsParams.structural_tag
    tag: dict[str, Any] = json.loads(structured["structural_tag"])
    return tag


class TestToolChoice:
    """``tool_choice`` required / named → ``structured_outputs.structural_tag``, the shape of
    vLLM's hermes builder (``vllm/tool_parsers/structural_tag_registry.py``
    ``get_hermes_structural_tag``: ``StructuralTag(format=TagsWithSeparatorFormat(...))``)."""

    def test_required_is_one_or_more_calls_in_the_model_syntax(self) -> None:
        tag = _tag(Guided(tools=TOOLS, tool_choice="required", tool_syntax="hermes"))
        assert tag["type"] == "structural_tag"
        fmt = tag["format"]
        assert fmt["type"] == "tags_with_separator"
        assert (fmt["at_least_one"], fmt["stop_after_first"]) == (True, False)
        begins = [t["begin"] for t in fmt["tags"]]
        assert begins == [
            '<tool_call>\n{"name": "get_weather", "arguments": ',
            '<tool_call>{"name": "get_weather", "arguments": ',
            '<tool_call>\n{"name": "search", "arguments": ',
            '<tool_call>{"name": "search", "arguments": ',
        ]
        assert fmt["tags"][0]["content"] == {"type": "json_schema", "json_schema": WEATHER}
        assert fmt["tags"][0]["end"] == "}\n</tool_call>"
        # strict: false → any JSON arguments (vLLM's get_function_parameters)
        assert fmt["tags"][2]["content"]["json_schema"] is True

    def test_parallel_false_stops_after_the_first_call(self) -> None:
        guided = Guided(
            tools=TOOLS, tool_choice="required", tool_syntax="hermes", parallel_tool_calls=False
        )
        assert _tag(guided)["format"]["stop_after_first"] is True

    def test_named_function_is_one_call_to_it(self) -> None:
        fmt = _tag(Guided(tools=TOOLS, tool_choice="search", tool_syntax="hermes"))["format"]
        assert fmt["stop_after_first"] is True
        assert {t["begin"].split('"')[3] for t in fmt["tags"]} == {"search"}

    def test_forced_calls_replace_the_response_format(self) -> None:
        guided = Guided(
            tools=TOOLS, tool_choice="required", tool_syntax="llama3_json", json_object=True
        )
        assert set(structured_outputs(guided) or {}) == {"structural_tag"}

    @pytest.mark.parametrize("syntax", ["mistral", ""])
    def test_a_syntax_without_a_tag_is_a_400_naming_it(self, syntax: str) -> None:
        guided = Guided(tools=TOOLS, tool_choice="required", tool_syntax=syntax)
        with pytest.raises(EngineError, match=syntax or "no tool-call parser"):
            engine_kwargs(SamplingParams(guided=guided))

    def test_auto_stays_free_text(self) -> None:
        assert structured_outputs(Guided(tools=TOOLS, tool_syntax="hermes")) is None

    def test_an_old_vllm_is_a_400_naming_the_version_needed(self) -> None:
        guided = Guided(tools=TOOLS, tool_choice="required", tool_syntax="hermes")
        with pytest.raises(EngineError, match=r"0\.11 or newer; the worker runs vLLM 0\.10\.2"):
            engine_kwargs(SamplingParams(guided=guided), features=features_for_version("0.10.2"))


class TestThinking:
    """``max_thinking_tokens`` → ``thinking_token_budget`` (``vllm/sampling_params.py``)."""

    def test_budget_is_thinking_token_budget_in_both_shapes(self) -> None:
        sampling = SamplingParams(guided=Guided(max_thinking_tokens=64, reasoning_syntax="qwen3"))
        assert engine_kwargs(sampling)["thinking_token_budget"] == 64
        assert completions_body((1,), sampling, model="m")["thinking_token_budget"] == 64

    def test_a_model_that_does_not_reason_needs_no_budget(self) -> None:
        kwargs = engine_kwargs(SamplingParams(guided=Guided(max_thinking_tokens=64)))
        assert "thinking_token_budget" not in kwargs

    def test_json_with_reasoning_is_constrained_after_the_reasoning(self) -> None:
        guided = Guided(json_object=True, thinking=True, reasoning_syntax="qwen3")
        assert engine_kwargs(SamplingParams(guided=guided))["structured_outputs"] == {
            "json_object": True
        }

    def test_an_old_vllm_is_a_400(self) -> None:
        sampling = SamplingParams(guided=Guided(max_thinking_tokens=8, reasoning_syntax="qwen3"))
        with pytest.raises(EngineError, match=r"max_thinking_tokens needs vLLM 0\.20"):
            completions_body((1,), sampling, model="m", features=features_for_version("0.19.1"))


@pytest.mark.parametrize(
    ("version", "tags", "budget"),
    [
        ("0.10.2", False, False),
        ("0.11.0", True, False),
        ("v0.20.1", True, True),
        (None, True, True),
    ],
)
def test_features_follow_the_version(version: str | None, tags: bool, budget: bool) -> None:
    features = features_for_version(version)
    assert (features.tool_tags, features.thinking_budget) == (tags, budget)


@pytest.mark.parametrize(
    "sampling", [SamplingParams(n=0), SamplingParams(max_tokens=0), SamplingParams(logprobs=-1)]
)
def test_impossible_values_are_refused(sampling: SamplingParams) -> None:
    with pytest.raises(EngineError):
        engine_kwargs(sampling)
    with pytest.raises(EngineError):
        completions_body((1,), sampling, model="m")


def test_completions_body_is_token_in_token_out() -> None:
    sampling = SamplingParams(max_tokens=3, logprobs=2, logit_bias={7: 1.5}, n=2, seed=4)
    body = completions_body((5, 6, 7), sampling, model="m", salt="s")
    assert body["model"] == "m"
    assert body["prompt"] == [5, 6, 7]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True
    assert body["return_tokens_as_token_ids"] is True
    assert body["logit_bias"] == {"7": 1.5}  # JSON object keys
    assert (body["n"], body["seed"], body["logprobs"], body["max_tokens"]) == (2, 4, 2, 3)
    assert body["cache_salt"] == "s"
    assert "output_kind" not in body
    assert "detokenize" not in body


def test_completions_body_without_logprobs_or_salt() -> None:
    body = completions_body((1,), SamplingParams(), model="m")
    assert "return_tokens_as_token_ids" not in body
    assert "cache_salt" not in body
    assert "logprobs" not in body


def test_cache_salt_only_for_salted_seeds() -> None:
    assert cache_salt(1337, 1337) is None
    assert cache_salt(0xABC, 1337) == f"{SALT_PREFIX}abc"
