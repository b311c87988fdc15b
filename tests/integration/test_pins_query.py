"""Issue 24 at the request-facing layer: the real gateway, preprocessor and formatter on real
NATS, the router played by hand. Pins (body and headers) reach the routers on ``Generate``; a
``RouteChoice`` on the stream comes back to the OpenAI client as a query-only answer; a
disaggregated request's ``nvext.worker_id`` is Dynamo's pair; the router's verdicts on a pin
(400 naming the field, 503 with ``Retry-After``) reach the client as theirs.

The full stack (router, prefill and decode mockers) is ``tests/e2e/test_disagg.py``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from services.formatter.config import FormatterConfig
from services.formatter.detokenizer import load_tokenizer
from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import serving
from shared import codec
from shared.messages import (
    Generate,
    ModelCard,
    RequestFailed,
    RouteChoice,
    TokenBatch,
    WorkerCard,
)
from shared.model_dir import DEFAULT_MODEL_NAME
from shared.registry import WorkerRegistration, publish_model
from shared.subjects import Subjects
from tests.integration.formatter_support import running_formatter
from tests.integration.gateway_support import Gateway, gateway_config, served_gateway, until_live

MODEL = DEFAULT_MODEL_NAME
TIMEOUT_S = 30.0
"""The first request waits for the formatter's tokenizer (seconds on a loaded machine)."""
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
DEAD = "dead-1"
"""A pin the fake router answers as a dead worker (503)."""
NOT_PREFILL = "decode-9"
"""A prefill pin the fake router answers as a worker of the wrong role (400)."""


class FakeRouter:
    """Plays the routers: records every ``Generate``; answers a query with a ``RouteChoice``,
    the pins above with the router's errors, anything else with tokens from a disaggregated
    pair (``p1`` rank 2 prefilled, ``d1`` rank 1 decoded)."""

    def __init__(self, nc: Client, tokenizer: Any) -> None:
        self.nc = nc
        self.tokenizer = tokenizer
        self.generated: list[Generate] = []

    async def on_generate(self, msg: Msg) -> None:
        gen = codec.decode(msg.data, Generate)
        self.generated.append(gen)
        hints = gen.routing
        if hints is not None and hints.query_only:
            answer: Any = RouteChoice(
                request_id=gen.request_id,
                worker_id=gen.worker_id or "d1",
                dp_rank=hints.dp_rank or 0,
                prefill_worker_id=hints.prefill_worker_id or "",
                prefill_dp_rank=hints.prefill_dp_rank or 0,
                token_ids=gen.token_ids,
                prompt_tokens=len(gen.token_ids),
            )
        elif gen.worker_id == DEAD:
            answer = RequestFailed(
                request_id=gen.request_id,
                code="no_worker_available",
                message=f"worker {DEAD} is not live",
                status=503,
                retry_after_s=1.0,
            )
        elif hints is not None and hints.prefill_worker_id == NOT_PREFILL:
            answer = RequestFailed(
                request_id=gen.request_id,
                code="invalid_request",
                message=f"worker {NOT_PREFILL} is not a prefill worker (its role is decode)",
                status=400,
                param="nvext.prefill_worker_id",
            )
        else:
            ids = tuple(self.tokenizer.encode("Hi there", add_special_tokens=False).ids)
            answer = TokenBatch(
                request_id=gen.request_id,
                token_ids=ids,
                finish_reason="length",
                prompt_tokens=len(gen.token_ids),
                worker_id="d1",
                dp_rank=1,
                prefill_worker_id="p1",
                prefill_dp_rank=2,
            )
        await self.nc.publish(gen.stream_to, codec.encode(answer))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return load_tokenizer((model_dir / "tokenizer.json").read_bytes())


@pytest.fixture
async def router(nc: Client, subjects: Subjects, tokenizer: Any) -> FakeRouter:
    fake = FakeRouter(nc, tokenizer)
    await nc.subscribe(subjects.route, queue="router", cb=fake.on_generate)
    await nc.flush()
    return fake


@pytest.fixture
async def stack(
    nats_url: str, nc: Client, subjects: Subjects, model_dir: Path, router: FakeRouter
) -> AsyncIterator[Gateway]:
    card = ModelCard(model=MODEL, context_length=40960, eos_token_ids=(151645,))
    await publish_model(nc.jetstream(), subjects, card, model_dir)
    registration = WorkerRegistration(
        nc.jetstream(), subjects, WorkerCard(worker_id="d1", model=MODEL)
    )
    await registration.start()
    formatter = FormatterConfig(nats_url=nats_url, namespace=subjects.namespace, formatter_id="f1")
    preprocessor = PreprocessorConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_timeout_s=TIMEOUT_S
    )
    gateway = gateway_config(nats_url, subjects, TIMEOUT_S, retry_budget_s=0.0)
    try:
        async with (
            running_formatter(formatter),
            serving(preprocessor),
            served_gateway(gateway) as served,
        ):
            async with httpx.AsyncClient(base_url=served.base_url, timeout=TIMEOUT_S) as http:
                await until_live(http, timeout_s=10)
            yield served
    finally:
        await registration.stop()


@pytest.fixture
async def http(stack: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=TIMEOUT_S) as client:
        yield client


@pytest.fixture
async def client(stack: Gateway) -> AsyncIterator[openai.AsyncOpenAI]:
    api = openai.AsyncOpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", timeout=TIMEOUT_S, max_retries=0
    )
    try:
        yield api
    finally:
        await api.close()


def sse_objects(text: str) -> list[dict[str, Any]]:
    frames = [f.removeprefix("data: ") for f in text.split("\n\n") if f.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


async def test_a_query_answers_where_the_chat_would_go_without_generating(
    client: openai.AsyncOpenAI, router: FakeRouter
) -> None:
    response = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        extra_body={"nvext": {"annotations": ["query_instance_id"]}},
    )
    [gen] = router.generated
    assert gen.routing is not None
    assert gen.routing.query_only
    assert response.choices[0].message.content == ""
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (
        len(gen.token_ids),
        0,
    )
    assert response.model_extra is not None
    assert response.model_extra["nvext"] == {
        "worker_id": {
            "prefill_worker_id": None,
            "prefill_dp_rank": None,
            "decode_worker_id": "d1",
            "decode_dp_rank": 0,
        },
        "token_ids": list(gen.token_ids),
    }


async def test_a_streamed_completion_query_with_pins_names_both_workers(
    http: httpx.AsyncClient, router: FakeRouter
) -> None:
    body = {
        "model": MODEL,
        "prompt": "Say hi",
        "stream": True,
        "stream_options": {"include_usage": True},
        "nvext": {"annotations": ["query_instance_id:epp"], "prefill_worker_id": "p3"},
    }
    headers = {"x-dynamo-worker-instance-id": "d4", "x-dynamo-dp-rank": "1"}
    response = await http.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    [gen] = router.generated
    assert gen.worker_id == "d4"
    objects = sse_objects(response.text)
    [carrier] = [o for o in objects if "nvext" in o]
    assert carrier["choices"][0]["finish_reason"] == "stop"
    assert carrier["nvext"] == {
        "worker_id": {
            "prefill_worker_id": "p3",
            "prefill_dp_rank": 0,
            "decode_worker_id": "d4",
            "decode_dp_rank": 1,
        },
        "token_ids": list(gen.token_ids),
    }
    assert "".join(o["choices"][0]["text"] for o in objects if o["choices"]) == ""
    assert objects[-1]["usage"]["completion_tokens"] == 0


async def test_pins_reach_the_routers_and_the_answer_names_both_phases(
    client: openai.AsyncOpenAI, router: FakeRouter
) -> None:
    response = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=8,
        extra_headers={"x-dynamo-prefill-instance-id": "p1", "x-dynamo-prefill-dp-rank": "2"},
        extra_body={
            "nvext": {"decode_worker_id": "d1", "dp_rank": 1, "extra_fields": ["worker_id"]}
        },
    )
    [gen] = router.generated
    assert gen.worker_id == "d1"
    assert gen.routing is not None
    assert (
        gen.routing.prefill_worker_id,
        gen.routing.prefill_dp_rank,
        gen.routing.dp_rank,
        gen.routing.decode_worker_id_param,
        gen.routing.query_only,
    ) == ("p1", 2, 1, "nvext.decode_worker_id", False)
    assert response.choices[0].message.content == "Hi there"
    assert response.model_extra is not None
    assert response.model_extra["nvext"] == {
        "worker_id": {
            "prefill_worker_id": "p1",
            "prefill_dp_rank": 2,
            "decode_worker_id": "d1",
            "decode_dp_rank": 1,
        }
    }


async def test_a_pin_the_router_refuses_is_400_naming_the_field(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post(
        "/v1/chat/completions", json={**CHAT, "nvext": {"prefill_worker_id": NOT_PREFILL}}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "nvext.prefill_worker_id")


async def test_a_dead_pinned_worker_is_503_with_retry_after(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/chat/completions", json=CHAT, headers={"x-dynamo-worker-instance-id": DEAD}
    )
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["code"] == "no_worker_available"


async def test_a_malformed_pin_reaches_no_router(
    http: httpx.AsyncClient, router: FakeRouter
) -> None:
    response = await http.post(
        "/v1/chat/completions", json=CHAT, headers={"x-dynamo-dp-rank": "first"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "x-dynamo-dp-rank"
    assert router.generated == []


async def test_a_query_with_several_choices_ends_them_all(
    http: httpx.AsyncClient, router: FakeRouter
) -> None:
    body = {**CHAT, "n": 2, "nvext": {"annotations": ["query_instance_id"]}}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [(c["index"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, "stop"),
        (1, "stop"),
    ]
    assert answer["nvext"]["token_ids"] == list(router.generated[0].token_ids)
