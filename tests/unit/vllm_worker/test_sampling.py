"""JetServe sampling → vLLM ``SamplingParams`` kwargs and the ``/v1/completions`` body.

Field names follow ``vllm/sampling_params.py`` (commit 00388f6573ccfcffad607b8c9ecdf341a4669ceb)
and vLLM's ``CompletionRequest`` (``return_token_ids``, ``return_tokens_as_token_ids``,
``structured_outputs``, ``cache_salt``).
"""

from __future__ import annotations

import pytest

from services.vllm_worker.sampling import (
    SALT_PREFIX,
    cache_salt,
    completions_body,
    engine_kwargs,
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


@pytest.mark.parametrize(
    ("guided", "words"),
    [
        (Guided(tools=({"name": "f"},), tool_choice="required"), "tool_choice"),
        (Guided(tools=({"name": "f"},), tool_choice="f"), "tool_choice"),
        (Guided(json_object=True, thinking=True), "reasoning"),
        (Guided(max_thinking_tokens=10), "max_thinking_tokens"),
    ],
)
def test_what_vllm_cannot_express_is_a_typed_400(guided: Guided, words: str) -> None:
    with pytest.raises(EngineError, match=words):
        engine_kwargs(SamplingParams(guided=guided))


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
