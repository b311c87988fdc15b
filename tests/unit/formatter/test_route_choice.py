"""A query-only request's answer (``RouteChoice`` on the stream, issue 24) shaped as an OpenAI
chat or completion response: empty content, ``finish_reason`` ``"stop"``, the prompt counted,
and ``nvext`` naming the workers and ranks the router would choose and the token ids."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.formatter.request import RequestFormatter
from shared.messages import Api, RouteChoice
from tests.unit.formatter.test_chunks import frames, stream_open

TOKEN_IDS = (151644, 872, 198, 9707, 151645)
DISAGGREGATED = RouteChoice(
    request_id="r1",
    worker_id="d1",
    dp_rank=1,
    prefill_worker_id="p1",
    prefill_dp_rank=2,
    token_ids=TOKEN_IDS,
    prompt_tokens=len(TOKEN_IDS),
)
AGGREGATED = RouteChoice(
    request_id="r1", worker_id="w1", token_ids=TOKEN_IDS, prompt_tokens=len(TOKEN_IDS)
)
DISAGGREGATED_NVEXT = {
    "worker_id": {
        "prefill_worker_id": "p1",
        "prefill_dp_rank": 2,
        "decode_worker_id": "d1",
        "decode_dp_rank": 1,
    },
    "token_ids": list(TOKEN_IDS),
}
AGGREGATED_NVEXT = {
    "worker_id": {
        "prefill_worker_id": None,
        "prefill_dp_rank": None,
        "decode_worker_id": "w1",
        "decode_dp_rank": 0,
    },
    "token_ids": list(TOKEN_IDS),
}
USAGE = {
    "prompt_tokens": len(TOKEN_IDS),
    "completion_tokens": 0,
    "total_tokens": len(TOKEN_IDS),
    "prompt_tokens_details": {"cached_tokens": 0},
}


def answer(tokenizer: Any, choice: RouteChoice, api: Api = "chat", **output: Any) -> bytes:
    """What the formatter sends for ``choice``: the bytes of every batch it ends with."""
    open_ = msgspec.structs.replace(stream_open(api, **output), prompt_tokens=len(TOKEN_IDS))
    fmt = RequestFormatter(open_, tokenizer, now=0)
    out = b"".join(fmt.on_batch(b, now=0.0) for b in fmt.answer_query(choice))
    assert fmt.finish_reason == "stop"  # the request has ended
    return out


@pytest.mark.parametrize(
    ("choice", "nvext"), [(DISAGGREGATED, DISAGGREGATED_NVEXT), (AGGREGATED, AGGREGATED_NVEXT)]
)
def test_chat_body_names_where_the_request_would_go(
    tokenizer: Any, choice: RouteChoice, nvext: dict[str, Any]
) -> None:
    body = json.loads(answer(tokenizer, choice))
    ChatCompletion.model_validate(body)
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == USAGE
    assert body["nvext"] == nvext


def test_completion_body_names_where_the_request_would_go(tokenizer: Any) -> None:
    body = json.loads(answer(tokenizer, DISAGGREGATED, "completion"))
    Completion.model_validate(body)
    assert body["object"] == "text_completion"
    [choice] = body["choices"]
    assert (choice["text"], choice["finish_reason"]) == ("", "stop")
    assert body["usage"] == USAGE
    assert body["nvext"] == DISAGGREGATED_NVEXT


@pytest.mark.parametrize("api", ["chat", "completion"])
def test_streamed_answer_is_one_nvext_chunk_then_usage_and_done(tokenizer: Any, api: Api) -> None:
    payloads = frames(answer(tokenizer, AGGREGATED, api, stream=True, include_usage=True))
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    with_nvext = [c for c in chunks if "nvext" in c]
    assert len(with_nvext) == 1
    [carrier] = with_nvext
    assert carrier["nvext"] == AGGREGATED_NVEXT
    assert carrier["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == USAGE
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" if api == "chat" else c["choices"][0]["text"]
        for c in chunks
        if c["choices"]
    )
    assert text == ""
    if api == "chat":
        for c in chunks:
            ChatCompletionChunk.model_validate(c)
    else:
        for c in chunks:
            Completion.model_validate(c)


def test_streamed_answer_without_usage_ends_on_the_nvext_chunk(tokenizer: Any) -> None:
    payloads = frames(answer(tokenizer, DISAGGREGATED, stream=True))
    assert payloads[-1] == b"[DONE]"
    last = json.loads(payloads[-2])
    assert last["nvext"] == DISAGGREGATED_NVEXT
    assert last["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_every_choice_ends_when_n_is_above_1(tokenizer: Any, stream: bool) -> None:
    out = answer(tokenizer, AGGREGATED, n=3, stream=stream)
    if stream:
        chunks = [json.loads(p) for p in frames(out)[:-1]]
        finished = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
        assert finished == {0, 1, 2}
        assert sum("nvext" in c for c in chunks) == 1
    else:
        body = json.loads(out)
        assert [(c["index"], c["finish_reason"]) for c in body["choices"]] == [
            (0, "stop"),
            (1, "stop"),
            (2, "stop"),
        ]
        assert body["nvext"] == AGGREGATED_NVEXT


def test_the_answer_replaces_extra_fields(tokenizer: Any) -> None:
    """A query generates nothing: there is no worker that served it nor any timing."""
    body = json.loads(answer(tokenizer, DISAGGREGATED, extra_fields=("timing", "worker_id")))
    assert body["nvext"] == DISAGGREGATED_NVEXT
