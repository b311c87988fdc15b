"""``n`` choices in one request: each detokenized on its own, streamed with its index, the
request finished (and its ``finish_reason`` the first choice's) once every choice has."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from services.formatter import request
from services.formatter.pieces import ChoiceEnd
from services.formatter.request import RequestFormatter
from shared.errors import InternalError
from shared.messages import OutputOptions, StreamOpen, TokenBatch
from tests.unit.formatter.test_shapers_openai_chat import payloads


def n_open(n: int = 2, **output: Any) -> StreamOpen:
    return StreamOpen(
        request_id="r1",
        api="chat",
        model="m",
        reply_to="gw",
        created=1,
        prompt_tokens=4,
        output=OutputOptions(n=n, **output),
        max_tokens=64,
    )


def batch(
    tokenizer: Any, choice: int, text: str, index: int, finish: str | None = None
) -> TokenBatch:
    return TokenBatch(
        request_id="r1",
        token_ids=tuple(tokenizer.encode(text, add_special_tokens=False).ids),
        index=index,
        choice=choice,
        finish_reason=finish,  # type: ignore[arg-type]
    )


def test_streaming_interleaved_choices(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(stream=True, include_usage=True), tokenizer, now=0)
    out = [
        fmt.on_batch(batch(tokenizer, 1, "Hello", 0), now=0),
        fmt.on_batch(batch(tokenizer, 0, "Hi", 0), now=0),
        fmt.on_batch(batch(tokenizer, 1, " there", 1, "length"), now=0),
    ]
    assert fmt.finish_reason is None  # choice 0 goes on
    out.append(fmt.on_batch(batch(tokenizer, 0, "!", 1, "stop"), now=0))
    objects = payloads(b"".join(out))
    assert objects[-1] == "[DONE]"
    rows = [
        (c["index"], c["delta"], c["finish_reason"]) for o in objects[:-1] for c in o["choices"]
    ]
    assert rows == [
        (0, {"role": "assistant", "content": ""}, None),
        (1, {"role": "assistant", "content": ""}, None),
        (1, {"content": "Hello"}, None),
        (0, {"content": "Hi"}, None),
        (1, {"content": " there"}, None),
        (1, {}, "length"),
        (0, {"content": "!"}, None),
        (0, {}, "stop"),
    ]
    assert objects[-2]["usage"]["completion_tokens"] == 4 == fmt.completion_tokens
    assert fmt.finish_reason == "stop"  # the first choice's


def test_not_streaming_one_body_once_every_choice_finished(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(3), tokenizer, now=0)
    first = [
        fmt.on_batch(batch(tokenizer, 2, "C", 0, "stop"), now=0),
        fmt.on_batch(batch(tokenizer, 0, "A", 0, "length"), now=0),
    ]
    body = fmt.on_batch(batch(tokenizer, 1, "B", 0, "stop"), now=0)
    assert first == [b"", b""]
    parsed = ChatCompletion.model_validate_json(body)
    assert [(c.index, c.message.content, c.finish_reason) for c in parsed.choices] == [
        (0, "A", "length"),
        (1, "B", "stop"),
        (2, "C", "stop"),
    ]
    assert fmt.finish_reason == "length"


def test_a_stop_string_ends_one_choice_and_its_later_tokens_are_ignored(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(stop=("STOP",)), tokenizer, now=0)
    fmt.on_batch(batch(tokenizer, 0, "Go STOP more", 0), now=0)
    fmt.on_batch(batch(tokenizer, 0, " and more", 3), now=0)  # the worker goes on
    assert fmt.finish_reason is None
    assert fmt.stopped_by_string
    body = json.loads(fmt.on_batch(batch(tokenizer, 1, "Fine", 0, "stop"), now=0))
    assert [(c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        ("Go ", "stop"),
        ("Fine", "stop"),
    ]


def test_a_failed_choice_fails_a_non_streaming_request(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(), tokenizer, now=0)
    with pytest.raises(InternalError):
        fmt.on_batch(batch(tokenizer, 1, "x", 0, "error"), now=0)


def test_positions_are_counted_per_choice(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(), tokenizer, now=0)
    fmt.on_batch(batch(tokenizer, 1, "Hello world", 0), now=0)
    later = batch(tokenizer, 0, "x", 0)
    assert (fmt.expected_index(later), fmt.next_index) == (0, 0)
    gap = batch(tokenizer, 1, "x", 5)
    assert (fmt.position(gap), fmt.expected_index(gap)) == (5, 2)


def test_a_batch_of_an_unknown_choice_is_dropped(tokenizer: Any) -> None:
    fmt = RequestFormatter(n_open(stream=True), tokenizer, now=0)
    stray = batch(tokenizer, 7, "x", 3, "stop")
    assert fmt.position(stray) == fmt.expected_index(stray)  # never "out of turn"
    assert (fmt.on_batch(stray, now=0), fmt.finish_reason, fmt.completion_tokens) == (b"", None, 0)


class Recorder:
    """A shaper that records the calls the formatter makes (the ``Shaper`` contract)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def opening(self, usage: Any = None) -> bytes:
        self.calls.append(("opening",))
        return b""

    def delta(self, choice: int, pieces: Any, logprobs: Any = (), usage: Any = None) -> bytes:
        self.calls.append(("delta", choice, [p.text for p in pieces]))
        return b""

    def choice_end(self, choice: int, end: Any, usage: Any = None) -> bytes:
        self.calls.append(("choice_end", choice, end))
        return b""

    def closing(self, usage: Any, nvext: Any = None) -> bytes:
        self.calls.append(("closing", usage.completion_tokens))
        return b""

    def body(self, choices: Any, usage: Any, nvext: Any = None) -> bytes:
        raise AssertionError("streaming")


def test_the_shaper_contract_order_and_the_stop_string(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(request, "shaper_for", lambda open_: recorder)
    fmt = RequestFormatter(n_open(stream=True, stop=("END",), format="anthropic"), tokenizer, now=0)
    fmt.on_batch(batch(tokenizer, 1, "Hi", 0, "length"), now=0)
    fmt.on_batch(batch(tokenizer, 0, "Go END", 0), now=0)
    assert recorder.calls == [
        ("opening",),
        ("delta", 1, ["Hi"]),
        ("choice_end", 1, ChoiceEnd("length")),
        ("delta", 0, ["Go "]),
        ("choice_end", 0, ChoiceEnd("stop", stop_string="END")),
        ("closing", fmt.completion_tokens),
    ]
