"""``output.format == "text"``: bare UTF-8 deltas (streaming) or the whole text (not), exactly."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.formatter.request import RequestFormatter
from services.formatter.shapers import TextShaper, shaper_for
from shared.errors import InternalError, ServiceUnavailable
from shared.messages import Api, OutputOptions, StreamOpen, TokenBatch

IM_END = 151645


def stream_open(api: Api = "completion", **output: Any) -> StreamOpen:
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


def text_formatter(tokenizer: Any, api: Api = "completion", **output: Any) -> RequestFormatter:
    return RequestFormatter(stream_open(api, format="text", **output), tokenizer, now=0)


def batches(tokenizer: Any, texts: list[str], *, finish: str = "length") -> list[TokenBatch]:
    """One TokenBatch per text; the last one finishes the request."""
    out, index = [], 0
    for n, text in enumerate(texts):
        ids = tuple(tokenizer.encode(text, add_special_tokens=False).ids)
        out.append(
            TokenBatch(
                request_id="r1",
                token_ids=ids,
                index=index,
                finish_reason=finish if n == len(texts) - 1 else None,  # type: ignore[arg-type]
            )
        )
        index += len(ids)
    return out


def run(formatter: RequestFormatter, items: list[TokenBatch]) -> list[bytes]:
    return [formatter.on_batch(b, now=0.0) for b in items]


def token_count(tokenizer: Any, texts: list[str]) -> int:
    return sum(len(tokenizer.encode(t, add_special_tokens=False).ids) for t in texts)


@pytest.mark.parametrize("api", ["chat", "completion"])
def test_shaper_for_text_format_is_text_chunks_for_either_api(api: Api) -> None:
    shaper = shaper_for(stream_open(api, format="text"))
    assert isinstance(shaper, TextShaper)


class TestStreaming:
    def test_each_batch_is_its_text_delta_as_utf8(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        out = run(fmt, batches(tokenizer, ["Hello", " wörld", " 🙂"]))
        assert out == [b"Hello", " wörld".encode(), " 🙂".encode()]

    def test_chat_streams_the_same_bare_text_without_a_role_frame(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, "chat", stream=True)
        assert run(fmt, batches(tokenizer, ["Hello", " world"])) == [b"Hello", b" world"]

    def test_finish_adds_no_bytes_and_records_reason_and_counts(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        texts = ["Hello", " world"]
        last = run(fmt, batches(tokenizer, texts, finish="length"))[-1]
        assert (last, fmt.finish_reason, fmt.completion_tokens) == (
            b" world",
            "length",
            token_count(tokenizer, texts),
        )

    def test_a_final_batch_with_no_text_gives_empty_bytes(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        fmt.on_batch(TokenBatch(request_id="r1", token_ids=(9707,)), now=0.0)
        last = fmt.on_batch(
            TokenBatch(
                request_id="r1",
                token_ids=(IM_END,),
                index=1,
                finish_reason="stop",
                stop_token_id=IM_END,
            ),
            now=0.0,
        )
        assert (last, fmt.finish_reason, fmt.completion_tokens) == (b"", "stop", 2)

    def test_a_batch_without_visible_text_sends_nothing_even_first(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        emoji = tokenizer.encode("🦜", add_special_tokens=False).ids
        assert len(emoji) > 1  # a byte-level split: the first id alone decodes to nothing
        first = fmt.on_batch(TokenBatch(request_id="r1", token_ids=(emoji[0],)), now=0.0)
        rest = fmt.on_batch(
            TokenBatch(request_id="r1", token_ids=tuple(emoji[1:]), index=1), now=0.0
        )
        assert (first, rest) == (b"", "🦜".encode())

    def test_stop_string_truncates_and_finishes_with_stop(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True, stop=("STOP",))
        out = run(fmt, batches(tokenizer, ["Go go", " ST", "OP now", " more"]))
        assert (b"".join(out), fmt.finish_reason, fmt.stopped_by_string) == (
            b"Go go ",
            "stop",
            True,
        )

    def test_stop_string_held_back_then_released_at_the_finish(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True, stop=("STOP",))
        out = run(fmt, batches(tokenizer, ["Go", " ST"], finish="length"))
        assert out == [b"Go", b" ST"]

    def test_include_stop_str_in_output_keeps_the_stop_string(self, tokenizer: Any) -> None:
        fmt = text_formatter(
            tokenizer, stream=True, stop=("STOP",), include_stop_str_in_output=True
        )
        out = run(fmt, batches(tokenizer, ["Go go", " STOP", " more"]))
        assert b"".join(out) == b"Go go STOP"

    def test_stop_token_is_counted_and_hidden(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        ids = (*tokenizer.encode("Hi").ids, IM_END)
        batch = TokenBatch(
            request_id="r1", token_ids=ids, finish_reason="stop", stop_token_id=IM_END
        )
        assert (fmt.on_batch(batch, now=0.0), fmt.completion_tokens) == (b"Hi", len(ids))

    def test_a_worker_error_finishes_the_stream_with_error(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True)
        out = run(fmt, batches(tokenizer, ["Hello"], finish="error"))
        assert (out, fmt.finish_reason) == ([b"Hello"], "error")

    def test_echo_puts_the_prompt_before_the_first_delta(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True, echo=True)
        assert run(fmt, batches(tokenizer, ["Hello", " world"])) == [b"Say hi:Hello", b" world"]

    def test_usage_options_add_nothing(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, stream=True, include_usage=True, continuous_usage=True)
        assert run(fmt, batches(tokenizer, ["Hello", " world"])) == [b"Hello", b" world"]


class TestNonStreaming:
    def test_one_body_with_the_whole_text_at_the_finish(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer)
        out = run(fmt, batches(tokenizer, ["Hello", " wörld", " 🙂"], finish="stop"))
        assert (out, fmt.finish_reason) == ([b"", b"", "Hello wörld 🙂".encode()], "stop")

    def test_stop_string_truncates_the_body(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, "chat", stop=("STOP",))
        out = run(fmt, batches(tokenizer, ["Go go", " ST", "OP now", " more"]))
        assert (out[-2], fmt.finish_reason) == (b"Go go ", "stop")

    def test_token_counts_include_the_stop_token(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer)
        ids = (*tokenizer.encode("Hi there").ids, IM_END)
        batch = TokenBatch(
            request_id="r1", token_ids=ids, finish_reason="stop", stop_token_id=IM_END
        )
        assert (fmt.on_batch(batch, now=0.0), fmt.completion_tokens) == (b"Hi there", len(ids))

    def test_echo_prepends_the_prompt(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer, echo=True)
        assert run(fmt, batches(tokenizer, ["Hello"]))[-1] == b"Say hi:Hello"

    def test_a_worker_error_is_a_typed_failure(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer)
        with pytest.raises(InternalError, match="worker failed"):
            run(fmt, batches(tokenizer, ["Hello"], finish="error"))

    def test_a_cancelled_request_is_a_typed_failure(self, tokenizer: Any) -> None:
        fmt = text_formatter(tokenizer)
        with pytest.raises(ServiceUnavailable, match="cancelled"):
            run(fmt, batches(tokenizer, ["Hello"], finish="cancelled"))


@pytest.mark.parametrize(
    ("texts", "stop"),
    [
        (["Hello", " wörld", " 🙂", "!"], ()),
        (["Go go", " ST", "OP now", " more"], ("STOP",)),
        (["a\n", 'b"c', "\\d\t"], ("zz",)),
    ],
)
def test_text_equals_the_openai_content_of_the_same_tokens(
    tokenizer: Any, texts: list[str], stop: tuple[str, ...]
) -> None:
    openai = RequestFormatter(stream_open("chat", stream=True, stop=stop), tokenizer, now=0)
    frames = b"".join(run(openai, batches(tokenizer, texts))).split(b"\n\n")
    content = "".join(
        json.loads(f.removeprefix(b"data: "))["choices"][0]["delta"].get("content", "")
        for f in frames
        if f and f != b"data: [DONE]"
    )
    text = text_formatter(tokenizer, "chat", stream=True, stop=stop)
    assert b"".join(run(text, batches(tokenizer, texts))).decode() == content
    assert (text.finish_reason, text.completion_tokens) == (
        openai.finish_reason,
        openai.completion_tokens,
    )
