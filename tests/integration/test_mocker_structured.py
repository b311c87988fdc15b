"""A real mocker worker on a real nats-server writes structured output (decision 019): a hermes
tool call whose arguments validate, ``n`` choices each with its own finish, one logprob per
token; and its model card names the model's parsers."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import jsonschema
from nats.aio.client import Client
from nats.errors import NoRespondersError

from services.mocker.service import ModelInfo
from shared import codec
from shared.messages import Generate, Guided, SamplingParams, TokenBatch
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.registry import ModelFiles
from shared.subjects import Subjects
from tests.integration.mocker_support import running_mocker
from tests.support import eventually_awaited

PROMPT = tuple(range(100, 140))
WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


async def _ready(nc: Client, subjects: Subjects, worker_id: str) -> None:
    async def answers() -> bool:
        try:
            await nc.request(subjects.worker_ping(worker_id), b"", timeout=1)
        except NoRespondersError:
            return False
        return True

    await eventually_awaited(answers, message="the worker never answered its ping")


async def _generate(nc: Client, subjects: Subjects, sampling: SamplingParams) -> list[TokenBatch]:
    """One request straight to worker ``w``; its batches until every choice finished."""
    request_id = uuid.uuid4().hex
    stream_to = subjects.stream("f1", request_id)
    sub = await nc.subscribe(stream_to)
    gen = Generate(
        request_id=request_id,
        model=DEFAULT_MODEL_NAME,
        token_ids=PROMPT,
        sampling=sampling,
        stream_to=stream_to,
    )
    await nc.publish(subjects.generate("w"), codec.encode(gen))
    batches: list[TokenBatch] = []
    finished: set[int] = set()
    while len(finished) < sampling.n:
        msg = await sub.next_msg(timeout=5)
        batch = codec.decode(msg.data, TokenBatch)
        batches.append(batch)
        if batch.finish_reason is not None:
            finished.add(batch.choice)
    await sub.unsubscribe()
    return batches


def _ids(batches: list[TokenBatch], choice: int = 0) -> list[int]:
    return [t for b in batches if b.choice == choice for t in b.token_ids]


async def test_required_tool_call_is_a_valid_hermes_call(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    guided = Guided(tools=(WEATHER,), tool_choice="required", tool_syntax="hermes")
    sampling = SamplingParams(max_tokens=300, guided=guided)
    async with running_mocker(nats_url, subjects, model_info, worker_id="w"):
        await _ready(nc, subjects, "w")
        batches = await _generate(nc, subjects, sampling)
        card = await ModelFiles(nc.jetstream(), subjects).card(DEFAULT_MODEL_NAME)
    last = batches[-1]
    assert (last.finish_reason, last.stop_token_id) == ("stop", last.token_ids[-1])
    assert model_info.tokenizer is not None
    text = model_info.tokenizer.decode(_ids(batches)[:-1], skip_special_tokens=True)
    match = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call>", text, re.S)
    assert match is not None, text
    call: dict[str, Any] = json.loads(match.group(1))
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER["parameters"])
    assert card is not None
    assert (card.tool_parser, card.reasoning_parser) == ("hermes", "qwen3")


async def test_n_choices_each_finish_and_logprobs_come_one_per_token(
    nats_url: str, subjects: Subjects, nc: Client, model_info: ModelInfo
) -> None:
    sampling = SamplingParams(n=3, max_tokens=12, logprobs=2, ignore_eos=True)
    async with running_mocker(nats_url, subjects, model_info, worker_id="w") as mocker:
        await _ready(nc, subjects, "w")
        batches = await _generate(nc, subjects, sampling)
        assert not mocker.workers[0].engine.has_work
    finishes = {b.choice: b.finish_reason for b in batches if b.finish_reason is not None}
    assert finishes == {0: "length", 1: "length", 2: "length"}
    texts = {c: tuple(_ids(batches, c)) for c in range(3)}
    assert all(len(ids) == 12 for ids in texts.values())
    assert len(set(texts.values())) == 3
    for c in range(3):
        indexes = [b.index for b in batches if b.choice == c]
        assert indexes == sorted(indexes)
        assert indexes[0] == 0
    for batch in batches:
        assert len(batch.logprobs) == len(batch.token_ids)
        for token, logprob in zip(batch.token_ids, batch.logprobs, strict=True):
            assert logprob.logprob <= 0
            assert len(logprob.top) == 2
            assert token in (t for t, _ in logprob.top) or logprob.logprob <= logprob.top[-1][1]
    first = [b for b in batches if b.index == 0]
    assert all(b.prompt_tokens == len(PROMPT) for b in first)
