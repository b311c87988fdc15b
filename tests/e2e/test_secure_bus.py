"""Least privilege on the bus end to end (issue 12): ``jetserve up --secure`` starts its
nats-server with the generated users (``services.cli.secure``), each process with its own NKey.

Every service works under its role's permissions (every API the stack serves, and nats-server
logs no violation); a client without a key cannot connect; a worker that tries another worker's
KV events or worker card, or a subject outside its role, is refused by the server (the
violation comes back to the client); ``tap``'s user reads and cannot publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import grpc
import nats
import nats.errors
import openai
import pytest
from nats.aio.client import Client

from services.cli.stack import Stack
from services.media.config import DEFAULT_IMAGE_MODEL
from shared.bus_permissions import inbox_prefix
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve import grpc_service_pb2_grpc as pb_grpc
from shared.subjects import Subjects
from tests.e2e.conftest import MODEL, TENSOR_MODEL, running_stack
from tests.support import eventually_async

VIOLATION = "violation"
"""nats-server logs "Publish Violation"; nats-py lower-cases the whole error, subject too."""


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    with running_stack(
        tmp_path_factory.mktemp("secure"),
        model_dir,
        secure=True,
        workers=2,
        embedders=1,
        tensor_workers=1,
        media_workers=1,
    ) as stack:
        yield stack


@contextlib.asynccontextmanager
async def as_user(stack: Stack, user: str) -> AsyncIterator[tuple[Client, list[str]]]:
    """A connection with ``user``'s seed, and the errors the server sends it."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        stack.nats_url,
        nkeys_seed=str(stack.seeds[user]),
        inbox_prefix=inbox_prefix(user.split("-")[0]),  # mocker-0 → the mocker's inbox
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        yield nc, errors
    finally:
        await nc.close()


async def refused(nc: Client, errors: list[str], subject: str) -> str:
    """Publish ``subject`` and return the server's violation for it (fails without one)."""
    await nc.publish(subject, b"forged")
    await nc.flush()
    hits = await eventually_async(
        lambda: [e for e in errors if VIOLATION in e.lower() and subject.lower() in e.lower()],
        timeout_s=2.5,
        interval_s=0.05,
        message=lambda: f"no violation for {subject}: {errors}",
    )
    return hits[0]


def violations(stack: Stack) -> list[str]:
    """Every permission violation nats-server logged, and every one a service was told of."""
    lines = []
    for log in stack.run_dir.glob("*.log"):
        lines += [
            line for line in log.read_text(errors="replace").splitlines() if VIOLATION in line
        ]
    return lines


def _echo_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=TENSOR_MODEL, id="secure-echo")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32", shape=[3])
    request.raw_input_contents.append(struct.pack("<3i", 1, 2, 3))
    assert tensor.name == "INPUT0"
    return request


async def test_every_service_works_under_its_permissions(secure: Stack) -> None:
    base = f"{secure.base_url}/v1"
    client = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0)
    chat = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5
    )
    stream = await client.completions.create(model=MODEL, prompt="once", max_tokens=4, stream=True)
    pieces = [c.choices[0].text async for c in stream if c.choices]
    embedding = await client.embeddings.create(model="Qwen/Qwen3-Embedding-0.6B", input="hi")
    image = await client.images.generate(model=DEFAULT_IMAGE_MODEL, prompt="a fox", size="256x256")
    claude = anthropic.AsyncAnthropic(base_url=secure.base_url, api_key="unused", max_retries=0)
    counted = await claude.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "count me"}]
    )
    async with grpc.aio.insecure_channel(secure.grpc_address) as channel:
        echoed = await pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_echo_request())
    assert chat.choices[0].message.content
    assert pieces
    assert len(embedding.data[0].embedding) > 0
    assert image.data
    assert counted.input_tokens > 0
    assert echoed.raw_output_contents[0] == struct.pack("<3i", 1, 2, 3)
    assert violations(secure) == []


async def test_a_client_without_a_key_cannot_connect(secure: Stack) -> None:
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(secure.nats_url, allow_reconnect=False, max_reconnect_attempts=0)


async def test_a_worker_cannot_act_for_another(secure: Stack) -> None:
    subjects = Subjects(secure.config.namespace)
    async with as_user(secure, "mocker-0") as (nc, errors):
        kv = await refused(nc, errors, subjects.kv_events("mocker-1"))
        card = await refused(nc, errors, f"$KV.{subjects.workers_bucket}.mocker-1")
        load = await refused(nc, errors, subjects.load("mocker-1"))
        # Nor publish what its role never sends: a client's response, a routed request.
        reply = await refused(nc, errors, subjects.route)
    assert all("for publish" in e.lower() for e in (kv, card, load, reply))


async def test_a_worker_cannot_read_the_token_streams(secure: Stack) -> None:
    subjects = Subjects(secure.config.namespace)
    async with as_user(secure, "mocker-0") as (nc, errors):
        await nc.subscribe(subjects.reply_all("*"))
        await nc.flush()
        await eventually_async(
            lambda: any("violation for subscription" in e.lower() for e in errors),
            timeout_s=2.5,
            interval_s=0.05,
            message=lambda: f"no subscription violation: {errors}",
        )


async def test_tap_reads_the_bus_and_cannot_publish(secure: Stack) -> None:
    subjects = Subjects(secure.config.namespace)
    async with as_user(secure, "tap") as (nc, errors):
        seen: asyncio.Queue[str] = asyncio.Queue()

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            await seen.put(msg.subject)

        await nc.subscribe(f"{subjects.namespace}.v1.>", cb=on_msg)
        await nc.flush()
        client = openai.AsyncOpenAI(
            base_url=f"{secure.base_url}/v1", api_key="unused", max_retries=0
        )
        await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "tapped"}],
            max_tokens=3,
            extra_headers={"X-Request-Id": f"tap{uuid.uuid4().hex[:8]}"},
        )
        first = await asyncio.wait_for(seen.get(), 10)
        cancel = await refused(nc, errors, subjects.cancel)
    assert first.startswith(f"{subjects.namespace}.v1.")
    assert "for publish" in cancel.lower()
