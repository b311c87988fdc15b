"""``count``: a request's prompt tokens, as generation counts them, and the ``CountTokens``
answers (``TokenCount`` or a typed ``RequestFailed``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.preprocessor.count import Counter, count_tokens
from services.preprocessor.prepare import prepare
from services.preprocessor.tokenizer import ModelAssets
from shared import codec
from shared.errors import InvalidRequest, ModelNotFound
from shared.messages import CountTokens, Preprocess, RequestFailed, TokenCount
from shared.tasks import TaskSet

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _request(**fields: Any) -> Preprocess:
    base: dict[str, Any] = {
        "request_id": "r1",
        "api": "chat",
        "model": "m",
        "reply_to": "x",
        "created": 1,
        "messages": (
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
        ),
    }
    return Preprocess(**{**base, **fields})


@dataclass
class FakeMsg:
    data: bytes
    reply: str = "inbox"
    subject: str = "count"
    answers: list[bytes] = field(default_factory=list)

    async def respond(self, data: bytes) -> None:
        self.answers.append(data)


Assets = Callable[[str], Awaitable[ModelAssets]]


async def _answer(assets: Assets, data: bytes) -> TokenCount | RequestFailed:
    """What a ``Counter`` answers to one message (it handles it in a task of its own)."""
    tasks = TaskSet()
    msg = FakeMsg(data)
    await Counter(assets, tasks, clock=lambda: 100.0).on_message(msg)  # type: ignore[arg-type]
    await tasks.close(grace_s=5)
    [answer] = msg.answers
    decoded: TokenCount | RequestFailed = codec.Decoder(TokenCount | RequestFailed).decode(answer)
    return decoded


def test_count_is_the_prompt_generation_would_use(qwen_assets: ModelAssets) -> None:
    for request in (_request(), _request(tools=(TOOL,))):
        assert count_tokens(request, qwen_assets) == prepare(request, qwen_assets).prompt_tokens
    assert count_tokens(_request(tools=(TOOL,)), qwen_assets) > count_tokens(
        _request(), qwen_assets
    )


async def test_the_counter_answers_token_count(qwen_assets: ModelAssets) -> None:
    async def assets(model: str) -> ModelAssets:
        return qwen_assets

    request = _request()
    answer = await _answer(assets, codec.encode(CountTokens(request_id="r1", request=request)))
    assert answer == TokenCount(
        request_id="r1", input_tokens=prepare(request, qwen_assets).prompt_tokens
    )


async def test_failures_are_answered_typed() -> None:
    async def unknown(model: str) -> ModelAssets:
        raise ModelNotFound(model)

    ask = CountTokens(request_id="r1", request=_request())
    missing = await _answer(unknown, codec.encode(ask))
    assert isinstance(missing, RequestFailed)
    assert (missing.status, missing.code) == (404, "model_not_found")
    expired = CountTokens(request_id="r2", request=_request(deadline_ms=1))
    late = await _answer(unknown, codec.encode(expired))
    assert isinstance(late, RequestFailed)
    assert late.code == "timeout"
    garbage = await _answer(unknown, b"\x00not msgpack")
    assert isinstance(garbage, RequestFailed)
    assert garbage.status == 400


def test_only_chat_requests_are_counted(qwen_assets: ModelAssets) -> None:
    with pytest.raises(InvalidRequest):
        count_tokens(_request(api="completion", messages=(), prompt="hi"), qwen_assets)
