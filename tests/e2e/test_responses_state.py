"""Stateful Responses API end to end (decision 030): stored turns in JetStream shared by two
gateway replicas, ``GET`` / ``DELETE`` / ``input_items``, ``store: false``, compaction,
``input_file`` parts and the bad-input cases, through the official ``openai`` client."""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import openai
import pytest
from nats.js.api import DiscardPolicy

from services.cli.stack import Stack
from shared.subjects import Subjects
from tests.e2e.conftest import MODEL
from tests.e2e.gateway_replica import Replica, gateway_on, gateway_replica
from tests.support import nats_server

pytestmark = pytest.mark.timeout(240)

BRIEF: dict[str, Any] = {"max_output_tokens": 16, "reasoning": {"effort": "none"}}


@pytest.fixture(scope="module")
def replica(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    """A second gateway on the shared stack's bus."""
    with gateway_replica(stack, tmp_path_factory.mktemp("replica") / "gateway.log") as r:
        yield r


@pytest.fixture
async def other(replica: Replica) -> AsyncIterator[openai.AsyncOpenAI]:
    c = openai.AsyncOpenAI(base_url=f"{replica.base_url}/v1", api_key="unused", max_retries=0)
    try:
        yield c
    finally:
        await c.close()


def _items(response: Any) -> list[dict[str, Any]]:
    """A response's output as input items for a stateless request (without the SDK's warnings:
    its output models expect assistant messages, a compaction's are the user's)."""
    return [item.model_dump(exclude_none=True, warnings=False) for item in response.output]


async def test_a_three_turn_conversation_goes_on_through_either_gateway(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    """Each turn sees the conversation before it: its prompt is exactly the one the whole
    conversation sent at once makes."""
    first = await client.responses.create(model=MODEL, input="Name a sea.", **BRIEF)
    assert first.store is True
    second = await other.responses.create(
        model=MODEL, input="And a river?", previous_response_id=first.id, **BRIEF
    )
    assert second.previous_response_id == first.id
    stream = await client.responses.create(
        model=MODEL, input="And a lake?", previous_response_id=second.id, stream=True, **BRIEF
    )
    last = [event async for event in stream][-1]
    assert last.type == "response.incomplete"
    third = last.response
    assert third.previous_response_id == second.id
    whole: list[Any] = [
        {"role": "user", "content": "Name a sea."},
        *_items(first),
        {"role": "user", "content": "And a river?"},
        *_items(second),
        {"role": "user", "content": "And a lake?"},
    ]
    stateless = await other.responses.create(model=MODEL, input=whole, store=False, **BRIEF)
    assert first.usage is not None
    assert second.usage is not None
    assert third.usage is not None
    assert stateless.usage is not None
    assert first.usage.input_tokens < second.usage.input_tokens < third.usage.input_tokens
    assert third.usage.input_tokens == stateless.usage.input_tokens
    listed = await other.responses.input_items.list(third.id, order="asc", limit=100)
    texts = [i.content[0].text for i in listed.data if i.type == "message" and i.role == "user"]
    assert texts == ["Name a sea.", "And a river?", "And a lake?"]


async def test_a_stored_response_is_retrieved_then_deleted(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    created = await client.responses.create(model=MODEL, input="Keep this.", **BRIEF)
    fetched = await other.responses.retrieve(created.id)
    assert fetched.model_dump() == created.model_dump()
    await other.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as gone:
        await client.responses.retrieve(created.id)
    assert gone.value.body == {
        "message": f"Response with id '{created.id}' not found.",
        "type": "invalid_request_error",
        "code": "not_found",
        "param": None,
    }
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)
    with pytest.raises(openai.BadRequestError) as cut:
        await client.responses.create(
            model=MODEL, input="Go on.", previous_response_id=created.id, **BRIEF
        )
    assert cut.value.code == "previous_response_not_found"


async def test_store_false_is_neither_retrievable_nor_continued(
    client: openai.AsyncOpenAI,
) -> None:
    created = await client.responses.create(model=MODEL, input="Forget this.", store=False, **BRIEF)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(
            model=MODEL, input="Go on.", previous_response_id=created.id, **BRIEF
        )
    assert bad.value.body == {
        "message": f"Previous response with id '{created.id}' not found.",
        "type": "invalid_request_error",
        "code": "previous_response_not_found",
        "param": "previous_response_id",
    }


async def test_input_items_are_paged_as_openai_lists_them(client: openai.AsyncOpenAI) -> None:
    items: Any = [{"role": "user", "content": f"part {i}"} for i in range(5)]
    created = await client.responses.create(model=MODEL, input=items, **BRIEF)
    newest = await client.responses.input_items.list(created.id, limit=2)
    assert [i.content[0].text for i in newest.data] == ["part 4", "part 3"]
    assert newest.has_more is True
    rest = await client.responses.input_items.list(created.id, limit=10, after=newest.last_id)
    assert [i.content[0].text for i in rest.data] == ["part 2", "part 1", "part 0"]
    assert rest.has_more is False


@pytest.mark.parametrize(
    ("path", "status", "param"),
    [
        ("/v1/responses/abc", 400, "response_id"),
        ("/v1/responses/resp_a.b", 400, "response_id"),
        ("/v1/responses/resp_unknown", 404, None),
        ("/v1/responses/resp_unknown/input_items", 404, None),
    ],
    ids=["not-resp", "bad-characters", "unknown", "unknown-items"],
)
async def test_bad_response_ids_get_openai_errors(
    stack: Stack, path: str, status: int, param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        for method in ("GET", "DELETE") if "items" not in path else ("GET",):
            resp = await http.request(method, path)
            assert resp.status_code == status, (method, resp.text)
            assert resp.json()["error"]["param"] == param


async def test_bad_listing_queries_are_400(client: openai.AsyncOpenAI, stack: Stack) -> None:
    created = await client.responses.create(model=MODEL, input="List me.", **BRIEF)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=10) as http:
        for query, param in (("limit=0", "limit"), ("order=up", "order"), ("after=x", "after")):
            resp = await http.get(f"/v1/responses/{created.id}/input_items?{query}")
            assert resp.status_code == 400, query
            assert resp.json()["error"]["param"] == param


async def test_too_large_turns_are_refused_or_not_stored(stack: Stack, tmp_path: Path) -> None:
    """``--responses-max-stored-bytes``: an input over it is a 400 unless ``store`` is false;
    an answer that makes the record too large is answered, and its id says why it is missing."""
    with gateway_replica(
        stack, tmp_path / "small.log", "--responses-max-stored-bytes", "4096"
    ) as small:
        c = openai.AsyncOpenAI(base_url=f"{small.base_url}/v1", api_key="unused", max_retries=0)
        big = "word " * 1000
        with pytest.raises(openai.BadRequestError) as refused:
            await c.responses.create(model=MODEL, input=big, **BRIEF)
        assert refused.value.param == "input"
        assert "--responses-max-stored-bytes" in refused.value.message
        kept = await c.responses.create(model=MODEL, input=big, store=False, **BRIEF)
        assert kept.status == "incomplete"
        near = "word " * 600  # under the limit alone; not with the response
        long = await c.responses.create(model=MODEL, input=near, **BRIEF)
        with pytest.raises(openai.NotFoundError) as missing:
            await c.responses.retrieve(long.id)
        assert "was not stored" in missing.value.message
        await c.close()


async def test_the_store_settings_bound_the_bucket(tmp_path: Path) -> None:
    """``--responses-store-ttl-s`` and ``--responses-store-max-bytes`` as the bucket has them."""
    args = ("--responses-store-ttl-s", "3600", "--responses-store-max-bytes", "2097152")
    namespace = f"e2e{uuid.uuid4().hex[:8]}"
    with (
        nats_server(tmp_path / "js") as (nats_url, _),
        gateway_on(nats_url, namespace, tmp_path / "gateway.log", *args, ready="/live") as gw,
    ):
        async with httpx.AsyncClient(base_url=gw.base_url, timeout=10) as http:
            resp = await http.get("/v1/responses/resp_nothing")  # opens the bucket
        assert resp.status_code == 404
        nc = await nats.connect(nats_url)
        try:
            bucket = Subjects(namespace).stored_turns_bucket
            info = await nc.jetstream().stream_info(f"KV_{bucket}")
        finally:
            await nc.close()
    assert info.config.max_age == 3600
    assert info.config.max_bytes == 2097152
    assert info.config.discard == DiscardPolicy.OLD


async def test_compact_keeps_the_user_messages_and_one_compaction_item(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    first = await client.responses.create(model=MODEL, input="Plan a trip.", **BRIEF)
    compacted = await other.responses.compact(
        model=MODEL, previous_response_id=first.id, input="Add a museum."
    )
    assert compacted.object == "response.compaction"
    kinds = [(item.type, getattr(item, "role", None)) for item in compacted.output]
    assert kinds == [("message", "user"), ("message", "user"), ("compaction", None)]
    assert compacted.usage.output_tokens > 0
    follow = await client.responses.create(
        model=MODEL,
        input=[*_items(compacted), {"role": "user", "content": "Now the hotel."}],
        **BRIEF,
    )
    assert follow.output_text
    with pytest.raises(openai.BadRequestError) as foreign:
        await client.responses.create(
            model=MODEL,
            input=[{"type": "compaction", "encrypted_content": "gAAAA-not-ours"}],
            **BRIEF,
        )
    assert foreign.value.param == "input[0].encrypted_content"
    with pytest.raises(openai.BadRequestError) as empty:
        await client.responses.compact(model=MODEL)
    assert empty.value.param == "input"


def _data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


async def test_a_text_file_part_reaches_the_model_as_text(client: openai.AsyncOpenAI) -> None:
    text = "line one\nline two\n"
    as_file: Any = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Summarize:"},
                {
                    "type": "input_file",
                    "filename": "notes.txt",
                    "file_data": _data_url(text.encode(), "text/plain"),
                },
            ],
        }
    ]
    inline = f"Summarize:\n<file name='notes.txt'>\n{text}\n</file>"
    with_file = await client.responses.create(model=MODEL, input=as_file, store=False, **BRIEF)
    with_text = await client.responses.create(model=MODEL, input=inline, store=False, **BRIEF)
    assert with_file.usage is not None
    assert with_text.usage is not None
    assert with_file.usage.input_tokens == with_text.usage.input_tokens


@pytest.mark.parametrize(
    ("part", "param"),
    [
        (
            {
                "type": "input_file",
                "filename": "a.pdf",
                "file_data": "data:application/pdf;base64,JVBERi0x",
            },
            "input[0].content[0]",
        ),
        ({"type": "input_file", "file_id": "file-1"}, "input[0].content[0].file_id"),
        ({"type": "input_file", "file_url": "https://x/a.txt"}, "input[0].content[0].file_url"),
        (
            {"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,!!"},
            "input[0].content[0].file_data",
        ),
        (
            {"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,/w=="},
            "input[0].content[0].file_data",
        ),
        ({"type": "input_image", "image_url": "data:image/png;base64,AA=="}, "input[0].content[0]"),
    ],
    ids=["pdf", "file-id", "file-url", "bad-base64", "not-utf8", "image"],
)
async def test_parts_that_cannot_be_read_are_400_naming_the_part(
    client: openai.AsyncOpenAI, part: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(
            model=MODEL, input=[{"role": "user", "content": [part]}], **BRIEF
        )
    assert bad.value.param == param


def _collapsed(kinds: list[str]) -> list[str]:
    """Event types with runs of the same delta type collapsed to one."""
    out: list[str] = []
    for kind in kinds:
        if not (out and out[-1] == kind and kind.endswith(".delta")):
            out.append(kind)
    return out


async def _turn(connection: Any, **fields: Any) -> list[Any]:
    """One ``response.create`` over the socket: its events up to the one that ends it."""
    await connection.response.create(model=MODEL, **BRIEF, **fields)
    events = []
    async for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "error"):
            return events
    raise AssertionError(f"the socket closed after {[e.type for e in events]}")


async def test_a_websocket_turn_gives_the_events_of_sse_and_continues(
    client: openai.AsyncOpenAI, other: openai.AsyncOpenAI
) -> None:
    sse = await client.responses.create(
        model=MODEL, input="Tell me about the sea.", stream=True, store=False, **BRIEF
    )
    sse_kinds = _collapsed([event.type async for event in sse])
    async with client.responses.connect() as connection:
        first = await _turn(connection, input="Tell me about the sea.", store=False)
        assert _collapsed([e.type for e in first]) == sse_kinds
        assert [e.sequence_number for e in first] == list(range(len(first)))
        # Not stored, yet the same socket continues it.
        second = await _turn(connection, input="More.", previous_response_id=first[-1].response.id)
        assert second[-1].type == "response.incomplete"
        kept = second[-1].response
        assert kept.previous_response_id == first[-1].response.id
        assert kept.usage.input_tokens > first[-1].response.usage.input_tokens
        # A bad turn is an error event; the socket stays usable.
        failed = await _turn(connection, input="x", previous_response_id="resp_nothing")
        assert failed[-1].type == "error"
        assert failed[-1].status == 400
        assert failed[-1].error.code == "previous_response_not_found"
        again = await _turn(connection, input="Once more.")
        assert again[-1].type == "response.incomplete"
    # The second turn was stored: another gateway continues it over HTTP.
    more = await other.responses.create(
        model=MODEL, input="And more.", previous_response_id=kept.id, **BRIEF
    )
    assert more.usage is not None
    assert more.usage.input_tokens > kept.usage.input_tokens


async def test_a_websocket_event_that_is_not_a_turn_is_an_error(client: openai.AsyncOpenAI) -> None:
    async with client.responses.connect() as connection:
        await connection.send({"type": "response.cancel"})  # type: ignore[arg-type, typeddict-item]
        event = await connection.recv()
        assert event.type == "error"
        assert event.error.param == "type"
        failed = await _turn(connection, input="x", background=True)
        assert failed[-1].error.param == "background"


async def test_a_restarted_gateway_finds_what_it_stored(stack: Stack, tmp_path: Path) -> None:
    with gateway_replica(stack, tmp_path / "before.log") as before:
        c = openai.AsyncOpenAI(base_url=f"{before.base_url}/v1", api_key="unused", max_retries=0)
        created = await c.responses.create(model=MODEL, input="Remember me.", **BRIEF)
        await c.close()
    with gateway_replica(stack, tmp_path / "after.log") as after:
        c = openai.AsyncOpenAI(base_url=f"{after.base_url}/v1", api_key="unused", max_retries=0)
        fetched = await c.responses.retrieve(created.id)
        follow = await c.responses.create(
            model=MODEL, input="Still there?", previous_response_id=created.id, **BRIEF
        )
        await c.close()
    assert fetched.output_text == created.output_text
    assert follow.previous_response_id == created.id
