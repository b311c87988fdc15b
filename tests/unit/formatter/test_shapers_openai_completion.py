"""The completions shaper: ``n`` choices, ``echo``, and log-probabilities in the legacy form."""

from __future__ import annotations

import json
from typing import Any

from openai.types import Completion

from services.formatter.pieces import (
    ChoiceEnd,
    ChoiceResult,
    Collected,
    Content,
    TokenLogprobs,
    TopLogprob,
)
from services.formatter.shapers import CompletionShaper
from services.formatter.shaping import Nvext, usage
from shared.messages import OutputOptions, StreamOpen
from tests.unit.formatter.test_shapers_openai_chat import payloads

USAGE = usage(3, 4, 0)


def completion_open(**output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api="completion",
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=3,
        output=OutputOptions(**output),
        max_tokens=16,
        prompt_text="Say:",
    )


def lp(token: str, logprob: float, *top: tuple[str, float]) -> TokenLogprobs:
    return TokenLogprobs(
        token,
        logprob,
        tuple(token.encode()),
        tuple(TopLogprob(t, v, tuple(t.encode())) for t, v in top),
    )


def test_legacy_log_probabilities_with_offsets_across_deltas() -> None:
    shaper = CompletionShaper(completion_open(stream=True, logprobs=1))
    first = payloads(shaper.delta(0, [Content(" Hi")], [lp(" Hi", -0.5, (" Hi", -0.5))]))[0]
    second = payloads(shaper.delta(0, [Content("!")], [lp("!", -1.5, ("?", -1.0))]))[0]
    assert first["choices"][0]["logprobs"] == {
        "tokens": [" Hi"],
        "token_logprobs": [-0.5],
        "top_logprobs": [{" Hi": -0.5}],
        "text_offset": [0],
    }
    # The sampled token is always in top_logprobs (up to logprobs + 1 entries, as OpenAI says).
    assert second["choices"][0]["logprobs"] == {
        "tokens": ["!"],
        "token_logprobs": [-1.5],
        "top_logprobs": [{"?": -1.0, "!": -1.5}],
        "text_offset": [3],
    }


def test_streaming_n_choices_echo_each_and_end_with_nvext() -> None:
    shaper = CompletionShaper(completion_open(stream=True, n=2, echo=True, include_usage=True))
    data = (
        shaper.opening()
        + shaper.delta(1, [Content(" b")])
        + shaper.choice_end(0, ChoiceEnd("length"))
        + shaper.choice_end(1, ChoiceEnd("stop"))
        + shaper.closing(USAGE, Nvext(worker_id="w"))
    )
    objects = payloads(data)
    assert objects[-1] == "[DONE]"
    rows = [
        (o["choices"][0]["index"], o["choices"][0]["text"], o["choices"][0]["finish_reason"])
        for o in objects[:-2]
    ]
    assert rows == [(1, "Say: b", None), (0, "Say:", None), (0, "", "length"), (1, "", "stop")]
    assert objects[-3]["nvext"] == {"worker_id": "w"}
    final = Completion.model_validate(objects[-2])
    assert (final.choices, final.usage and final.usage.completion_tokens) == ([], 4)


def test_body_has_every_choice_with_echo_and_log_probabilities() -> None:
    shaper = CompletionShaper(completion_open(echo=True, n=2, logprobs=0))
    results = [
        ChoiceResult(0, Collected(" a"), ChoiceEnd("stop"), [lp(" a", -0.1)]),
        ChoiceResult(1, Collected(" b"), ChoiceEnd("length"), [lp(" b", -0.2)]),
    ]
    body = Completion.model_validate_json(shaper.body(results, USAGE))
    assert [(c.index, c.text, c.finish_reason) for c in body.choices] == [
        (0, "Say: a", "stop"),
        (1, "Say: b", "length"),
    ]
    logprobs = body.choices[1].logprobs
    assert logprobs is not None
    assert (logprobs.tokens, logprobs.text_offset, logprobs.top_logprobs) == (
        [" b"],
        [4],
        [{" b": -0.2}],
    )


def test_without_log_probabilities_the_body_says_null() -> None:
    body = CompletionShaper(completion_open()).body(
        [ChoiceResult(0, Collected("x"), ChoiceEnd("stop"))], USAGE
    )
    assert json.loads(body)["choices"][0]["logprobs"] is None
