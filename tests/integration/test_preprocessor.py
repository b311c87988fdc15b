"""The preprocessor in-process against a real nats-server; formatter and router played by hand."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from tokenizers import Tokenizer

from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import Preprocessor, serving
from shared import codec
from shared.messages import (
    GatewayEvent,
    Generate,
    ModelCard,
    Preprocess,
    RequestFailed,
    StreamOpen,
    StreamOpened,
)
from shared.model_dir import ensure_default_model_dir
from shared.registry import publish_model
from shared.subjects import Subjects

MODEL = "Qwen/Qwen3-0.6B"
CONTEXT = 40960
EOS = (151645, 151643)
GATEWAY = "g1"
FORMATTER = "f1"
CHAT = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
)
CHAT_TEXT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))


@pytest.fixture
async def published(nc: Client, subjects: Subjects, model_dir: Path) -> None:
    card = ModelCard(model=MODEL, context_length=CONTEXT, eos_token_ids=EOS)
    await publish_model(nc.jetstream(), subjects, card, model_dir)


@pytest.fixture
async def preprocessor(nats_url: str, subjects: Subjects) -> AsyncIterator[Preprocessor]:
    config = PreprocessorConfig(
        nats_url=nats_url, namespace=subjects.namespace, formatter_timeout_s=1.0
    )
    async with serving(config) as service:
        yield service


class FakeFormatter:
    """Answers ``StreamOpen`` with a stream subject (or a canned failure) and records them."""

    def __init__(self, subjects: Subjects, failure: RequestFailed | None = None) -> None:
        self.subjects = subjects
        self.failure = failure
        self.opened: list[StreamOpen] = []

    async def on_open(self, msg: Msg) -> None:
        req = codec.decode(msg.data, StreamOpen)
        self.opened.append(req)
        answer = self.failure or StreamOpened(
            request_id=req.request_id, stream_to=self.subjects.stream(FORMATTER, req.request_id)
        )
        await msg.respond(codec.encode(answer))


@pytest.fixture
async def formatter(nc: Client, subjects: Subjects) -> FakeFormatter:
    fake = FakeFormatter(subjects)
    await nc.subscribe(subjects.formatter_open, queue="formatter", cb=fake.on_open)
    await nc.flush()
    return fake


@pytest.fixture
async def router(nc: Client, subjects: Subjects) -> Subscription:
    sub = await nc.subscribe(subjects.route, queue="router")
    await nc.flush()
    return sub


@pytest.fixture
async def gateway(nc: Client, subjects: Subjects) -> Subscription:
    sub = await nc.subscribe(subjects.reply_all(GATEWAY))
    await nc.flush()
    return sub


async def send(nc: Client, subjects: Subjects, **fields: Any) -> str:
    """Publish a ``Preprocess`` as the gateway does; returns its request id."""
    request_id = uuid.uuid4().hex
    reply_to = subjects.reply(GATEWAY, request_id)
    base: dict[str, Any] = {"api": "chat", "model": MODEL, "created": 1, "messages": CHAT}
    req = Preprocess(request_id=request_id, reply_to=reply_to, **{**base, **fields})
    await nc.publish(subjects.preprocess, codec.encode(req), reply=reply_to)
    return request_id


async def failure_of(gateway: Subscription) -> RequestFailed:
    msg = await gateway.next_msg(timeout=10)
    event: GatewayEvent = codec.GATEWAY_EVENTS.decode(msg.data)
    assert isinstance(event, RequestFailed)
    return event


@pytest.mark.usefixtures("published", "preprocessor")
class TestHappyPath:
    async def test_generate_carries_the_templated_token_ids(
        self,
        nc: Client,
        subjects: Subjects,
        router: Subscription,
        model_dir: Path,
        formatter: FakeFormatter,
    ) -> None:
        await send(nc, subjects, max_tokens=32)
        generate = codec.decode((await router.next_msg(timeout=10)).data, Generate)
        expected = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        ids = expected.encode(CHAT_TEXT, add_special_tokens=False).ids
        assert list(generate.token_ids) == ids

    async def test_generate_goes_to_the_formatters_stream(
        self, nc: Client, subjects: Subjects, router: Subscription, formatter: FakeFormatter
    ) -> None:
        request_id = await send(nc, subjects, max_tokens=32)
        msg = await router.next_msg(timeout=10)
        stream_to = subjects.stream(FORMATTER, request_id)
        assert codec.decode(msg.data, Generate).stream_to == stream_to
        assert msg.reply.startswith(f"{subjects.namespace}.v1.bounce.")

    async def test_no_router_tells_the_formatter_503(
        self, nc: Client, subjects: Subjects, formatter: FakeFormatter
    ) -> None:
        request_id = await send(nc, subjects, max_tokens=32)
        stream = await nc.subscribe(subjects.stream(FORMATTER, request_id))
        msg = await stream.next_msg(timeout=10)
        event = codec.decode(msg.data, RequestFailed)
        assert (event.status, event.message) == (503, "no router is running")

    async def test_sampling_is_resolved(
        self, nc: Client, subjects: Subjects, router: Subscription, formatter: FakeFormatter
    ) -> None:
        await send(nc, subjects)
        generate = codec.decode((await router.next_msg(timeout=10)).data, Generate)
        sampling = generate.sampling
        assert (sampling.max_tokens, sampling.stop_token_ids) == (
            CONTEXT - len(generate.token_ids),
            EOS,
        )

    async def test_stream_open_tells_the_formatter_the_counts(
        self, nc: Client, subjects: Subjects, router: Subscription, formatter: FakeFormatter
    ) -> None:
        request_id = await send(nc, subjects, max_tokens=32)
        generate = codec.decode((await router.next_msg(timeout=10)).data, Generate)
        [opened] = formatter.opened
        assert (opened.request_id, opened.prompt_tokens, opened.max_tokens, opened.reply_to) == (
            request_id,
            len(generate.token_ids),
            32,
            subjects.reply(GATEWAY, request_id),
        )

    async def test_long_prompt_is_tokenized_off_the_loop_identically(
        self,
        nc: Client,
        subjects: Subjects,
        router: Subscription,
        model_dir: Path,
        formatter: FakeFormatter,
    ) -> None:
        prompt = "The quick brown fox jumps over the lazy dog.\n" * 400  # > OFFLOAD_CHARS
        await send(nc, subjects, api="completion", messages=(), prompt=prompt, max_tokens=8)
        generate = codec.decode((await router.next_msg(timeout=10)).data, Generate)
        expected = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(prompt).ids
        assert list(generate.token_ids) == expected

    async def test_concurrent_requests_all_reach_the_router(
        self, nc: Client, subjects: Subjects, router: Subscription, formatter: FakeFormatter
    ) -> None:
        sent = set(await asyncio.gather(*(send(nc, subjects, max_tokens=8) for _ in range(20))))
        routed = {
            codec.decode((await router.next_msg(timeout=10)).data, Generate).request_id
            for _ in sent
        }
        assert routed == sent


@pytest.mark.usefixtures("published", "preprocessor", "formatter")
class TestFailures:
    async def test_unknown_model_is_404(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        await send(nc, subjects, model="no/such-model")
        failed = await failure_of(gateway)
        assert (failed.status, failed.code) == (404, "model_not_found")

    async def test_context_exceeded_is_400(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        await send(nc, subjects, max_tokens=CONTEXT)
        failed = await failure_of(gateway)
        assert (failed.status, failed.code) == (400, "context_length_exceeded")

    async def test_failure_names_the_request(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        request_id = await send(nc, subjects, messages=())
        failed = await failure_of(gateway)
        assert (failed.request_id, failed.status) == (request_id, 400)

    async def test_nothing_reaches_the_router_on_failure(
        self, nc: Client, subjects: Subjects, gateway: Subscription, router: Subscription
    ) -> None:
        await send(nc, subjects, max_tokens=CONTEXT)
        await failure_of(gateway)
        assert router.pending_msgs == 0

    async def test_expired_request_is_504(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        await send(nc, subjects, deadline_ms=1)
        failed = await failure_of(gateway)
        assert (failed.status, failed.code) == (504, "timeout")

    async def test_undecodable_message_is_400_on_its_reply_subject(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        reply_to = subjects.reply(GATEWAY, "bad1")
        await nc.publish(subjects.preprocess, b"\x00not msgpack", reply=reply_to)
        failed = await failure_of(gateway)
        assert (failed.request_id, failed.status) == ("bad1", 400)


@pytest.mark.usefixtures("published", "preprocessor")
async def test_no_formatter_is_503(nc: Client, subjects: Subjects, gateway: Subscription) -> None:
    await send(nc, subjects, max_tokens=8)
    failed = await failure_of(gateway)
    assert (failed.status, failed.message) == (503, "no formatter is running")


@pytest.mark.usefixtures("published", "preprocessor")
async def test_formatter_failure_is_forwarded(
    nc: Client, subjects: Subjects, gateway: Subscription
) -> None:
    refusal = RequestFailed(request_id="x", code="overloaded", message="busy", status=503)
    fake = FakeFormatter(subjects, failure=refusal)
    await nc.subscribe(subjects.formatter_open, queue="formatter", cb=fake.on_open)
    await send(nc, subjects, max_tokens=8)
    failed = await failure_of(gateway)
    assert (failed.code, failed.status) == ("overloaded", 503)


def errors_counted(service: Preprocessor, code: str) -> float:
    """``jetserve_errors_total{service="preprocessor", code=...}`` from the service's registry."""
    labels = {"service": "preprocessor", "code": code}
    return service.metrics.registry.get_sample_value("jetserve_errors_total", labels) or 0.0


@pytest.mark.usefixtures("published")
class TestErrorsKeepTheirCode:
    """A failure is logged and counted under its own code, a remote one too (not internal)."""

    @pytest.fixture
    async def refusing_formatter(self, nc: Client, subjects: Subjects) -> FakeFormatter:
        refusal = RequestFailed(request_id="x", code="overloaded", message="busy", status=503)
        fake = FakeFormatter(subjects, failure=refusal)
        await nc.subscribe(subjects.formatter_open, queue="formatter", cb=fake.on_open)
        await nc.flush()
        return fake

    @pytest.mark.usefixtures("refusing_formatter")
    async def test_a_formatters_refusal_is_counted_under_its_code(
        self, nc: Client, subjects: Subjects, gateway: Subscription, preprocessor: Preprocessor
    ) -> None:
        await send(nc, subjects, max_tokens=8)
        await failure_of(gateway)
        counted = (errors_counted(preprocessor, c) for c in ("overloaded", "internal_error"))
        assert tuple(counted) == (1.0, 0.0)

    @pytest.mark.usefixtures("refusing_formatter", "preprocessor")
    async def test_a_formatters_refusal_is_logged_under_its_code(
        self, nc: Client, subjects: Subjects, gateway: Subscription
    ) -> None:
        with capture_logs(processors=[merge_contextvars]) as logs:
            request_id = await send(nc, subjects, max_tokens=8)
            await failure_of(gateway)
        failed = [e for e in logs if e["event"] in ("request_failed", "request_crashed")]
        assert [(e["event"], e["code"], e["request_id"]) for e in failed] == [
            ("request_failed", "overloaded", request_id)
        ]

    @pytest.mark.usefixtures("formatter")
    async def test_an_unknown_model_is_counted_as_model_not_found(
        self, nc: Client, subjects: Subjects, gateway: Subscription, preprocessor: Preprocessor
    ) -> None:
        await send(nc, subjects, model="no/such-model")
        await failure_of(gateway)
        assert errors_counted(preprocessor, "model_not_found") == 1.0


@pytest.mark.usefixtures("published", "preprocessor")
async def test_a_handshake_lost_in_transit_is_a_passing_503(
    nc: Client, subjects: Subjects, gateway: Subscription
) -> None:
    """A formatter that never answers (its StreamOpen or the answer lost when a node stopped)
    fails the request with 503 service_unavailable, which the gateway resubmits: a CI run's
    cluster test lost a request to the 504 this used to be."""
    silent = await nc.subscribe(subjects.formatter_open, queue="formatter")
    await nc.flush()
    request_id = await send(nc, subjects, max_tokens=8)
    failed = await failure_of(gateway)
    assert codec.decode((await silent.next_msg(timeout=1)).data, StreamOpen).request_id == (
        request_id
    )
    assert (failed.request_id, failed.status, failed.code) == (
        request_id,
        503,
        "service_unavailable",
    )
    assert failed.message == "no formatter answered within 1 s"
