"""The pure halves of decision 030: stored turns and the conversation they make (``Turns`` on the
in-process store), ``input_file`` parts, compaction items, WebSocket events, and completions
batches merged and renumbered."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import msgspec
import pytest

from services.gateway.apis import compaction, socket_events
from services.gateway.apis.input_files import file_text
from services.gateway.apis.openai_responses_api import parse_responses
from services.gateway.apis.prompt_batches import BatchStream, merged_body, summed
from services.gateway.apis.stored_turns import (
    InvalidId,
    ListQuery,
    PreviousResponseNotFound,
    StoredTurn,
    check_response_id,
    final_response,
    input_items_page,
    input_record,
)
from services.gateway.core.turn_store import MemoryTurns
from services.gateway.core.turns import Turns
from shared import sse
from shared.errors import InvalidRequest, ServiceUnavailable


def _ids() -> Any:
    counter = itertools.count()
    return lambda prefix: f"{prefix}_{next(counter)}"


def _response(rid: str, text: str) -> dict[str, Any]:
    item = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return {"id": rid, "object": "response", "output": [item]}


def _request(**fields: Any) -> Any:
    return parse_responses(msgspec.json.encode({"model": "m", **fields}))


class TestIds:
    @pytest.mark.parametrize("value", ["msg_1", "resp_a.b", "resp_a b", "r" * 200])
    def test_what_cannot_be_a_response_id_is_invalid(self, value: str) -> None:
        with pytest.raises(InvalidId) as caught:
            check_response_id(value, "previous_response_id")
        assert caught.value.param == "previous_response_id"

    def test_a_response_id_passes(self) -> None:
        assert check_response_id("resp_0a-Z", "response_id") == "resp_0a-Z"


class TestFinalResponse:
    def test_a_body_is_the_response(self) -> None:
        body = msgspec.json.encode(_response("resp_1", "hi"))
        assert final_response(body, stream=False) == _response("resp_1", "hi")

    def test_a_stream_gives_the_last_event_that_carries_it(self) -> None:
        done = {"type": "response.incomplete", "response": _response("resp_1", "hi")}
        data = sse.event("response.output_text.done", b'{"type":"x"}') + sse.event(
            "response.incomplete", msgspec.json.encode(done)
        )
        assert final_response(data, stream=True) == _response("resp_1", "hi")

    def test_an_error_event_gives_none(self) -> None:
        assert final_response(sse.event("error", b'{"type":"error"}'), stream=True) is None


def test_input_items_get_a_type_an_id_and_content_parts() -> None:
    items = input_record("Hi", _ids())
    assert items == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Hi"}],
            "status": "completed",
            "id": "msg_0",
        }
    ]


def test_input_items_pages_go_newest_first_after_an_id() -> None:
    items = [{"id": f"i{n}"} for n in range(5)]
    page = msgspec.json.decode(input_items_page(items, ListQuery(limit=2, after="i3")))
    assert [i["id"] for i in page["data"]] == ["i2", "i1"]
    assert page["has_more"] is True


class TestTurns:
    async def test_a_continuation_sees_every_earlier_turn_in_order(self) -> None:
        turns = Turns(MemoryTurns(), _ids())
        first = await turns.begin(_request(input="one"))
        await turns.keep(
            first, msgspec.json.encode(_response(first.response_id, "A")), stream=False
        )
        second = await turns.begin(_request(input="two", previous_response_id=first.response_id))
        await turns.keep(
            second, msgspec.json.encode(_response(second.response_id, "B")), stream=False
        )
        third = await turns.begin(_request(input="three", previous_response_id=second.response_id))
        request = third.to_preprocess(request_id="r", reply_to="x", created=1)
        assert [m["content"] for m in request.messages] == ["one", "A", "two", "B", "three"]
        assert third.ancestors == [first.response_id, second.response_id]

    async def test_an_unknown_or_deleted_turn_cannot_be_continued(self) -> None:
        store = MemoryTurns()
        turns = Turns(store, _ids())
        first = await turns.begin(_request(input="one"))
        await turns.keep(
            first, msgspec.json.encode(_response(first.response_id, "A")), stream=False
        )
        second = await turns.begin(_request(input="two", previous_response_id=first.response_id))
        await turns.keep(
            second, msgspec.json.encode(_response(second.response_id, "B")), stream=False
        )
        await store.delete(first.response_id)
        with pytest.raises(PreviousResponseNotFound, match="earlier turn"):
            await turns.begin(_request(input="x", previous_response_id=second.response_id))

    async def test_store_false_continues_only_on_its_connection(self) -> None:
        turns = Turns(MemoryTurns(), _ids())
        first = await turns.begin(_request(input="one", store=False))
        await turns.keep(
            first, msgspec.json.encode(_response(first.response_id, "A")), stream=False
        )
        assert first.kept is not None
        with pytest.raises(PreviousResponseNotFound):
            await turns.begin(_request(input="two", previous_response_id=first.response_id))
        second = await turns.begin(
            _request(input="two", previous_response_id=first.response_id), recent=first.kept
        )
        assert second.ancestors is None  # its record will hold the whole conversation
        await turns.keep(
            second, msgspec.json.encode(_response(second.response_id, "B")), stream=False
        )
        third = await turns.begin(_request(input="3", previous_response_id=second.response_id))
        request = third.to_preprocess(request_id="r", reply_to="x", created=1)
        assert [m["content"] for m in request.messages] == ["one", "A", "two", "B", "3"]

    async def test_a_record_over_the_limit_is_a_marker_that_says_so(self) -> None:
        turns = Turns(MemoryTurns(limit_bytes=600), _ids())
        first = await turns.begin(_request(input="one"))
        await turns.keep(
            first, msgspec.json.encode(_response(first.response_id, "A" * 600)), stream=False
        )
        with pytest.raises(PreviousResponseNotFound, match="was not stored"):
            await turns.begin(_request(input="two", previous_response_id=first.response_id))
        with pytest.raises(InvalidRequest, match="store: false") as big:
            await turns.begin(_request(input="x" * 700))
        assert big.value.param == "input"

    async def test_a_store_that_fails_leaves_the_answer_alone(self) -> None:
        class Down(MemoryTurns):
            async def put(self, turn: StoredTurn) -> None:
                raise ServiceUnavailable("down")

        turns = Turns(Down(), _ids())
        first = await turns.begin(_request(input="one"))
        await turns.keep(
            first, msgspec.json.encode(_response(first.response_id, "A")), stream=False
        )
        assert first.kept is not None
        assert first.kept.ancestors is None  # not stored: a continuation must not name it


class TestInputFiles:
    def test_a_data_url_text_file_is_read_with_its_name(self) -> None:
        data = "data:text/markdown;base64," + base64.b64encode(b"# Title").decode()
        text = file_text(param="p", file_data=data, filename="a.md")
        assert text == "<file name='a.md'>\n# Title\n</file>"

    def test_bare_base64_is_read_by_its_extension(self) -> None:
        data = base64.b64encode(b"x = 1").decode()
        assert "x = 1" in file_text(param="p", file_data=data, filename="a.py")

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"file_data": "data:image/png;base64,AA==", "filename": "a.png"}, "p"),
            ({"file_data": base64.b64encode(b"x").decode(), "filename": "a.bin"}, "p"),
            ({"file_data": "data:text/plain,abc", "filename": "a.txt"}, "p.file_data"),
            ({"file_data": None, "filename": "a.txt"}, "p.file_data"),
        ],
        ids=["image", "unknown-extension", "not-base64-url", "no-data"],
    )
    def test_what_is_not_inline_text_is_refused(self, fields: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            file_text(param="p", **fields)
        assert caught.value.param == param


class TestCompaction:
    def test_a_summary_round_trips_through_its_item(self) -> None:
        content = compaction.encode_summary("we planned a trip")
        assert compaction.decode_summary(content, "p") == "we planned a trip"

    def test_the_output_is_the_user_messages_then_one_compaction_item(self) -> None:
        items = [
            {"role": "user", "content": "a"},
            {"type": "message", "role": "assistant", "content": "b"},
            {"type": "function_call_output", "call_id": "c", "output": "d"},
        ]
        body = msgspec.json.decode(
            compaction.compacted_body(
                compaction_id="resp_c",
                item_id=_ids(),
                created_at=1,
                items=items,
                summary="s",
                usage=None,
            )
        )
        assert body["object"] == "response.compaction"
        assert [(i["type"], i.get("role")) for i in body["output"]] == [
            ("message", "user"),
            ("compaction", None),
        ]


class TestSocketEvents:
    def test_a_create_event_is_a_streaming_body(self) -> None:
        body = socket_events.create_body('{"type": "response.create", "model": "m", "input": "x"}')
        assert msgspec.json.decode(body) == {"model": "m", "input": "x", "stream": True}

    @pytest.mark.parametrize(
        ("event", "param"),
        [
            ('{"type": "response.cancel"}', "type"),
            ("[1]", "type"),
            ('{"type": "response.create", "generate": false}', "generate"),
        ],
    )
    def test_other_events_are_refused(self, event: str, param: str) -> None:
        with pytest.raises(InvalidRequest) as caught:
            socket_events.create_body(event)
        assert caught.value.param == param

    def test_sse_frames_become_one_message_each(self) -> None:
        data = sse.event("a", b'{"x":1}') + b": keep-alive\n\n" + sse.event("b", b'{"x":2}')
        assert socket_events.server_events(data) == [b'{"x":1}', b'{"x":2}']


class TestPromptBatches:
    def test_bodies_merge_with_openai_numbering_and_summed_usage(self) -> None:
        def body(text: str) -> bytes:
            choices = [{"index": j, "text": f"{text}{j}"} for j in range(2)]
            usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
            return msgspec.json.encode({"id": f"cmpl-{text}", "choices": choices, "usage": usage})

        merged = msgspec.json.decode(merged_body([body("a"), body("b")], 2))
        assert merged["id"] == "cmpl-a"
        assert [(c["index"], c["text"]) for c in merged["choices"]] == [
            (0, "a0"),
            (1, "a1"),
            (2, "b0"),
            (3, "b1"),
        ]
        assert merged["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}

    def test_a_stream_is_renumbered_and_ends_once(self) -> None:
        stream = BatchStream(n=1)

        def chunk(rid: str, choices: list[Any], usage: Any = None) -> bytes:
            return sse.frame(msgspec.json.encode({"id": rid, "choices": choices, "usage": usage}))

        one = stream.rewrite(1, chunk("b", [{"index": 0, "text": "x"}]) + sse.DONE)
        usage = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}
        held = stream.rewrite(0, chunk("a", [], usage) + sse.DONE)
        stream.rewrite(1, chunk("b", [], usage))
        assert held == b""
        decoded = msgspec.json.decode(one.removeprefix(sse.PREFIX).removesuffix(sse.END))
        assert decoded["choices"][0]["index"] == 1
        end = stream.closing()
        assert end.endswith(sse.DONE)
        assert msgspec.json.decode(end.split(sse.END)[0].removeprefix(sse.PREFIX))["usage"] == {
            "prompt_tokens": 2,
            "completion_tokens": 4,
            "total_tokens": 6,
        }

    def test_summed_adds_nested_numbers(self) -> None:
        assert summed({"a": 1, "d": {"c": 2}}, {"a": 2, "d": {"c": 3}}) == {"a": 3, "d": {"c": 5}}
