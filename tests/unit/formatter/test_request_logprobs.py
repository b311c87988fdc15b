"""Token log-probabilities: the worker's ids become text and UTF-8 bytes with the request's real
tokenizer, ``output.logprobs`` alternatives each, in the chat or the legacy completions form."""

from __future__ import annotations

import json
from typing import Any

from openai.types import Completion

from services.formatter.detokenizer import TokenTexts, token_texts
from services.formatter.request import RequestFormatter
from shared.messages import Api, OutputOptions, StreamOpen, TokenBatch, TokenLogprob
from tests.unit.formatter.test_shapers_openai_chat import payloads

IM_END = 151645


def lp_open(api: Api = "chat", **output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api=api,
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=4,
        output=OutputOptions(**output),
        max_tokens=64,
        prompt_text="Q:",
    )


def with_logprobs(tokenizer: Any, text: str, *, eos: bool = False) -> TokenBatch:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids) + ((IM_END,) if eos else ())
    alternatives = ((ids[0], -0.1), (11, -2.0), (12, -3.0))
    logprobs = tuple(TokenLogprob(-0.1 * (n + 1), alternatives) for n in range(len(ids)))
    return TokenBatch(
        request_id="r1",
        token_ids=ids,
        finish_reason="stop",
        stop_token_id=IM_END if eos else None,
        logprobs=logprobs,
    )


def test_token_texts_give_exact_bytes_even_for_part_of_a_character(tokenizer: Any) -> None:
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("🦜 héllo", add_special_tokens=False).ids
    pieces = [texts.get(i) for i in ids]
    assert bytes(b for _, raw in pieces for b in raw) == "🦜 héllo".encode()
    assert pieces[0][0] == "\ufffd"  # the parrot's first bytes alone are no character
    assert texts.get(IM_END) == ("<|im_end|>", tuple(b"<|im_end|>"))
    assert token_texts(tokenizer) is token_texts(tokenizer)  # one cache per tokenizer


def test_streaming_chat_logprobs_with_top_alternatives(tokenizer: Any) -> None:
    fmt = RequestFormatter(lp_open(stream=True, logprobs=2), tokenizer, now=0)
    objects = payloads(fmt.on_batch(with_logprobs(tokenizer, "Hello world"), now=0))
    content = objects[1]["choices"][0]["logprobs"]["content"]
    assert [(c["token"], c["logprob"], bytes(c["bytes"])) for c in content] == [
        ("Hello", -0.1, b"Hello"),
        (" world", -0.2, b" world"),
    ]
    assert [t["token"] for t in content[0]["top_logprobs"]] == ["Hello", ","]  # 2 of 3


def test_the_hidden_stop_token_has_no_logprob_but_is_counted(tokenizer: Any) -> None:
    fmt = RequestFormatter(lp_open(logprobs=0), tokenizer, now=0)
    body = json.loads(fmt.on_batch(with_logprobs(tokenizer, "Hi there", eos=True), now=0))
    content = body["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == ["Hi", " there"]
    assert all(c["top_logprobs"] == [] for c in content)
    assert body["usage"]["completion_tokens"] == 3


def test_completion_logprobs_offsets_point_into_the_text(tokenizer: Any) -> None:
    fmt = RequestFormatter(lp_open("completion", echo=True, logprobs=1), tokenizer, now=0)
    body = Completion.model_validate_json(
        fmt.on_batch(with_logprobs(tokenizer, " Paris is big"), now=0)
    )
    choice = body.choices[0]
    assert choice.logprobs is not None
    offsets, tokens = choice.logprobs.text_offset or [], choice.logprobs.tokens or []
    assert [choice.text[o : o + len(t)] for o, t in zip(offsets, tokens, strict=True)] == [
        " Paris",
        " is",
        " big",
    ]
    assert choice.text == "Q: Paris is big"


def test_without_asking_there_are_no_logprobs(tokenizer: Any) -> None:
    fmt = RequestFormatter(lp_open(), tokenizer, now=0)
    body = json.loads(fmt.on_batch(with_logprobs(tokenizer, "Hi"), now=0))
    assert body["choices"][0]["logprobs"] is None
