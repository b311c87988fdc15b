"""OpenAI response shapes, checked against the openai SDK's own types."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from services.formatter.pieces import Content
from services.formatter.request import RequestFormatter
from services.formatter.shapers import openai_chat, openai_completion, shaper_for
from shared import sse
from shared.errors import InternalError
from shared.messages import Api, OutputOptions, StreamOpen, TokenBatch

IM_END = 151645


def stream_open(api: Api = "chat", **output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api=api,
        model="Qwen/Qwen3-0.6B",
        reply_to="gw.r1",
        created=1_700_000_000,
        prompt_tokens=11,
        output=OutputOptions(**output),
        max_tokens=64,
        prompt_text="Say hi:",
    )


def batches(tokenizer: Any, texts: list[str], *, finish: str = "length") -> list[TokenBatch]:
    """One TokenBatch per text; the last one finishes the request."""
    out, index = [], 0
    for n, text in enumerate(texts):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        last = n == len(texts) - 1
        out.append(
            TokenBatch(
                request_id="r1",
                token_ids=ids,
                index=index,
                finish_reason=finish if last else None,  # type: ignore[arg-type]
                cached_tokens=4 if n == 0 else 0,
            )
        )
        index += len(ids)
    return out


def run(formatter: RequestFormatter, items: list[TokenBatch]) -> list[bytes]:
    return [formatter.on_batch(b, now=0.0) for b in items]


def frames(data: bytes) -> list[bytes]:
    """Split SSE bytes into frame payloads (``data: `` removed)."""
    parts = data.split(b"\n\n")
    assert parts[-1] == b""
    assert all(p.startswith(b"data: ") for p in parts[:-1])
    return [p[len(b"data: ") :] for p in parts[:-1]]


class TestStreamingChat:
    def test_role_content_finish_usage_done(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True, include_usage=True), tokenizer, now=0)
        payloads = frames(b"".join(run(fmt, batches(tokenizer, ["Hello", " world"]))))
        assert payloads[-1] == b"[DONE]"
        parsed = [ChatCompletionChunk.model_validate_json(p) for p in payloads[:-1]]
        assert [c.choices[0].delta.role if c.choices else None for c in parsed] == [
            "assistant",
            None,
            None,
            None,
            None,
        ]
        assert [c.choices[0].delta.content for c in parsed[:3]] == ["", "Hello", " world"]
        assert parsed[3].choices[0].finish_reason == "length"
        assert parsed[4].choices == []
        assert parsed[4].usage is not None
        assert parsed[4].usage.model_dump(include={"prompt_tokens", "completion_tokens"}) == {
            "prompt_tokens": 11,
            "completion_tokens": 2,
        }
        assert parsed[4].usage.prompt_tokens_details is not None
        assert parsed[4].usage.prompt_tokens_details.cached_tokens == 4

    def test_every_chunk_but_the_last_has_null_usage(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True, include_usage=True), tokenizer, now=0)
        payloads = frames(b"".join(run(fmt, batches(tokenizer, ["Hello", " world"]))))
        objects = [json.loads(p) for p in payloads[:-1]]
        assert all("usage" in o and o["usage"] is None for o in objects[:-1])

    def test_exact_shape_of_a_content_chunk(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True), tokenizer, now=0)
        data = run(fmt, batches(tokenizer, ["Hi", " there", "!"]))
        assert json.loads(frames(data[1])[0]) == {
            "id": "chatcmpl-r1",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "Qwen/Qwen3-0.6B",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": " there"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }

    def test_final_chunk_has_an_empty_delta(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True), tokenizer, now=0)
        last = frames(run(fmt, batches(tokenizer, ["Hi", "!"], finish="stop"))[-1])
        assert json.loads(last[-2])["choices"][0] == {
            "index": 0,
            "delta": {},
            "logprobs": None,
            "finish_reason": "stop",
        }

    def test_without_include_usage_there_is_no_usage_at_all(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True), tokenizer, now=0)
        payloads = frames(b"".join(run(fmt, batches(tokenizer, ["Hello", " world"]))))
        assert len(payloads) == 5  # role, 2 contents, finish, [DONE]
        assert all(b"usage" not in p for p in payloads)

    def test_role_and_first_content_travel_together(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True), tokenizer, now=0)
        first = run(fmt, batches(tokenizer, ["Hello", " world"]))[0]
        assert len(frames(first)) == 2

    def test_a_batch_without_visible_text_sends_nothing(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stream=True, stop=(" xyz",)), tokenizer, now=0)
        data = run(fmt, batches(tokenizer, ["Hello", " x", "y", " world"]))
        assert data[1:3] == [b"", b""]
        assert b'"content":" xy world"' in data[3]

    def test_continuous_usage_puts_usage_on_every_chunk(self, tokenizer: Any) -> None:
        open_ = stream_open(stream=True, include_usage=True, continuous_usage=True)
        fmt = RequestFormatter(open_, tokenizer, now=0)
        payloads = frames(b"".join(run(fmt, batches(tokenizer, ["Hello", " world"]))))
        usages = [json.loads(p)["usage"]["completion_tokens"] for p in payloads[:-1]]
        assert usages == [1, 1, 2, 2, 2]


class TestNonStreamingChat:
    def test_body_parses_as_a_chat_completion(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(), tokenizer, now=0)
        data = run(fmt, batches(tokenizer, ["Hello", " world"], finish="stop"))
        assert data[0] == b""
        body = ChatCompletion.model_validate_json(data[-1])
        assert body.id == "chatcmpl-r1"
        assert body.choices[0].message.content == "Hello world"
        assert body.choices[0].message.role == "assistant"
        assert body.choices[0].finish_reason == "stop"

    def test_usage_always_has_cached_tokens(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(), tokenizer, now=0)
        data = run(fmt, batches(tokenizer, ["Hello", " world"]))
        assert json.loads(data[-1])["usage"] == {
            "prompt_tokens": 11,
            "completion_tokens": 2,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": 4},
        }

    def test_stop_token_is_counted_and_hidden(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(), tokenizer, now=0)
        ids = (*tokenizer.encode("Hi").ids, IM_END)
        batch = TokenBatch(
            request_id="r1", token_ids=ids, finish_reason="stop", stop_token_id=IM_END
        )
        body = ChatCompletion.model_validate_json(fmt.on_batch(batch, now=0))
        assert body.choices[0].message.content == "Hi"
        assert body.usage is not None
        assert body.usage.completion_tokens == len(ids)

    def test_a_worker_error_becomes_a_typed_failure(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(), tokenizer, now=0)
        with pytest.raises(InternalError, match="worker failed"):
            run(fmt, batches(tokenizer, ["Hello"], finish="error"))

    def test_stop_string_finishes_with_stop(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open(stop=("wor",)), tokenizer, now=0)
        data = run(fmt, batches(tokenizer, ["Hello", " world", " again"]))
        body = ChatCompletion.model_validate_json(data[1])
        assert (body.choices[0].message.content, body.choices[0].finish_reason) == (
            "Hello ",
            "stop",
        )
        assert fmt.stopped_by_string


class TestCompletions:
    def test_streaming_chunks_and_final_parse_as_completions(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(
            stream_open("completion", stream=True, include_usage=True), tokenizer, now=0
        )
        payloads = frames(b"".join(run(fmt, batches(tokenizer, ["Hello", " world"]))))
        assert payloads[-1] == b"[DONE]"
        objects = [json.loads(p) for p in payloads[:-1]]
        assert [o["choices"][0]["text"] for o in objects[:-1]] == ["Hello", " world", ""]
        assert objects[0]["object"] == "text_completion"
        assert objects[0]["id"] == "cmpl-r1"
        # The SDK types finish_reason as non-null, so only the finished ones validate strictly.
        assert Completion.model_validate_json(payloads[-3]).choices[0].finish_reason == "length"
        usage = Completion.model_validate_json(payloads[-2]).usage
        assert usage is not None
        assert usage.total_tokens == 13

    def test_echo_prepends_the_prompt_when_streaming(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open("completion", stream=True, echo=True), tokenizer, now=0)
        first = run(fmt, batches(tokenizer, [" Hi", "!"]))[0]
        assert json.loads(frames(first)[0])["choices"][0]["text"] == "Say hi: Hi"

    def test_non_streaming_body_with_echo(self, tokenizer: Any) -> None:
        fmt = RequestFormatter(stream_open("completion", echo=True), tokenizer, now=0)
        body = Completion.model_validate_json(run(fmt, batches(tokenizer, [" Hi", "!"]))[-1])
        assert body.choices[0].text == "Say hi: Hi!"
        assert body.object == "text_completion"


@pytest.mark.parametrize("text", ['a "quoted"\nline', "tab\t\\ back", "héllo 🙂 世界", "\x01"])
@pytest.mark.parametrize("api", ["chat", "completion"])
def test_content_frame_template_matches_the_struct_path(text: str, api: Api) -> None:
    open_ = stream_open(api, stream=True, include_usage=True)
    shaper = shaper_for(open_)
    if api == "chat":
        obj: msgspec.Struct = openai_chat.ChatCompletionChunk(
            id="chatcmpl-r1",
            created=open_.created,
            model=open_.model,
            choices=[openai_chat.ChunkChoice(delta=openai_chat.Delta(content=text))],
            usage=None,
        )
    else:
        obj = openai_completion.Completion(
            id="cmpl-r1",
            created=open_.created,
            model=open_.model,
            choices=[openai_completion.CompletionChoice(text=text)],
            usage=None,
        )
    assert shaper.delta(0, [Content(text)]) == sse.frame(msgspec.json.encode(obj))
