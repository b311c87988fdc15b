"""``jetserve chat``'s pure parts: the conversation, the event stream, the model choice."""

from __future__ import annotations

import json

import pytest

from services.cli.__main__ import build_parser
from services.cli.chat import (
    ChatConfig,
    ChatError,
    Conversation,
    Endpoint,
    chat_settings,
    choose_model,
    chunk_texts,
    stream_chunks,
)
from shared.model_dir import DEFAULT_MODEL_NAME


class TestConversation:
    def test_each_request_carries_the_whole_conversation(self) -> None:
        chat = Conversation("m", "Be brief.", {"max_tokens": 5})
        chat.ask("hi")
        chat.answered("hello")
        body = json.loads(chat.ask("again"))
        assert body == {
            "model": "m",
            "stream": True,
            "max_tokens": 5,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"},
            ],
        }

    def test_a_turn_that_showed_nothing_leaves_no_trace(self) -> None:
        chat = Conversation("m")
        chat.ask("hi")
        chat.answered("")
        assert chat.messages == []

    def test_a_cancelled_answer_keeps_what_was_shown(self) -> None:
        chat = Conversation("m")
        chat.ask("hi")
        chat.answered("hel")
        assert chat.messages[-1] == {"role": "assistant", "content": "hel"}


def test_stream_chunks_reads_data_lines_up_to_done() -> None:
    lines = [b'data: {"a": 1}\n', b"\n", b": keep-alive\n", b"data: [DONE]\n", b'data: {"b": 2}\n']
    assert list(stream_chunks(lines)) == [{"a": 1}]


def test_chunk_texts_gives_reasoning_and_content() -> None:
    chunk = {"choices": [{"delta": {"reasoning_content": "hmm", "content": "yes"}}]}
    assert chunk_texts(chunk) == ("hmm", "yes")
    assert chunk_texts({"choices": [{"delta": {}, "finish_reason": "stop"}]}) == ("", "")
    assert chunk_texts({"choices": [], "usage": {}}) == ("", "")


def test_an_error_chunk_is_a_chat_error() -> None:
    with pytest.raises(ChatError, match="worker lost"):
        chunk_texts({"error": {"message": "worker lost", "code": 503}})


class TestChooseModel:
    def test_the_given_model_wins(self) -> None:
        assert choose_model(["a", "b"], "b") == "b"

    def test_the_only_model(self) -> None:
        assert choose_model(["a"], "") == "a"

    def test_the_default_model_of_several(self) -> None:
        assert choose_model(["emb", DEFAULT_MODEL_NAME], "") == DEFAULT_MODEL_NAME

    def test_several_others_need_a_choice(self) -> None:
        with pytest.raises(ChatError, match="--model"):
            choose_model(["a", "b"], "")

    def test_none_served(self) -> None:
        with pytest.raises(ChatError, match="no model"):
            choose_model([], "")


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("http://h:1/v1/", "http://h:1"),
        ("https://h/prefix/v1", "https://h/prefix"),
    ],
)
def test_the_url_may_name_the_v1_path_or_not(url: str, base: str) -> None:
    endpoint = Endpoint.of(url)
    assert endpoint.base_url == base
    assert endpoint.path("/v1/models").endswith("/v1/models")


def test_a_url_that_is_no_http_address_is_refused() -> None:
    with pytest.raises(ChatError, match="--url"):
        Endpoint.of("127.0.0.1:8000")


def test_options_come_from_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JETSERVE_CHAT_API_KEY", "k")
    args = build_parser().parse_args(["chat", "--url", "http://h:1", "--max-tokens", "9"])
    config = ChatConfig(**chat_settings().values(args))
    assert (config.url, config.max_tokens, config.api_key) == ("http://h:1", 9, "k")
    assert chat_settings()["api_key"].secret
