"""Every API's image parts reach the preprocessor as one shape, an OpenAI ``image_url`` part
with the ``param`` naming it in the client's own body (decision 032)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from services.gateway.apis import anthropic, openai_responses_api
from services.gateway.apis.openai import chat_to_preprocess, parse_chat
from shared.errors import InvalidRequest
from shared.messages import Preprocess

IDS: dict[str, Any] = {"request_id": "r", "reply_to": "x", "created": 1}
URL = "data:image/png;base64,iVBORw0KGgo="


def _image(url: str, param: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}, "param": param}


def _anthropic(messages: list[dict[str, Any]], **fields: Any) -> Preprocess:
    body = {"model": "m", "max_tokens": 8, "messages": messages, **fields}
    request = anthropic.parse_messages(msgspec.json.encode(body))
    return anthropic.messages_to_preprocess(anthropic.to_chat(request), **IDS)


def _responses(content: list[dict[str, Any]]) -> Preprocess:
    body = {"model": "m", "input": [{"role": "user", "content": content}]}
    request = openai_responses_api.parse_responses(msgspec.json.encode(body))
    return openai_responses_api.responses_to_preprocess(
        openai_responses_api.to_chat(request), **IDS
    )


def test_openai_text_only_parts_still_join_into_one_string() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    assert chat_to_preprocess(parse_chat(msgspec.json.encode(body)), **IDS).messages[0][
        "content"
    ] == ("a\nb")


def test_an_anthropic_base64_source_becomes_a_data_url_named_by_its_block() -> None:
    source = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    blocks = [{"type": "text", "text": "hi"}, {"type": "image", "source": source}]
    pre = _anthropic([{"role": "user", "content": blocks}], system="be brief")
    assert pre.messages[1]["content"] == [
        {"type": "text", "text": "hi"},
        _image(URL, "messages[0].content[1]"),
    ]


def test_an_anthropic_url_source_stays_a_url() -> None:
    block = {"type": "image", "source": {"type": "url", "url": "https://a.test/x.png"}}
    pre = _anthropic([{"role": "user", "content": [block]}])
    assert pre.messages[0]["content"] == [_image("https://a.test/x.png", "messages[0].content[0]")]


def test_an_anthropic_image_before_a_tool_result_stays_in_its_own_user_message() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://a.test/x.png"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "done"}
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    pre = _anthropic(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [image, result]},
        ]
    )
    assert pre.messages[2]["content"] == [_image("https://a.test/x.png", "messages[2].content[0]")]
    assert pre.messages[3]["role"] == "tool"


def test_an_anthropic_image_of_another_media_type_is_refused() -> None:
    source = {"type": "base64", "media_type": "image/bmp", "data": "Qk0="}
    with pytest.raises(InvalidRequest) as caught:
        _anthropic([{"role": "user", "content": [{"type": "image", "source": source}]}])
    assert caught.value.param == "messages[0].content[0].source.media_type"


def test_an_assistant_image_is_refused() -> None:
    block = {"type": "image", "source": {"type": "url", "url": "https://a.test/x.png"}}
    with pytest.raises(InvalidRequest, match="cannot hold `image` blocks"):
        _anthropic([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [block]}])


def test_a_responses_input_image_is_named_by_its_input_item() -> None:
    pre = _responses(
        [{"type": "input_text", "text": "what?"}, {"type": "input_image", "image_url": URL}]
    )
    assert pre.messages[0]["content"] == [
        {"type": "text", "text": "what?"},
        _image(URL, "input[0].content[1]"),
    ]


def test_a_responses_file_id_image_cannot_be_resolved() -> None:
    with pytest.raises(InvalidRequest, match="`file_id` cannot be resolved") as caught:
        _responses([{"type": "input_image", "file_id": "file-1"}])
    assert caught.value.param == "input[0].content[0]"
