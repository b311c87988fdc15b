"""One KServe inference request over the bus: an LLM through the pipeline (``text`` output), or
a tensor model straight to one of its live workers (round-robin, ``TensorInfer``).

Raises ``ServiceError`` for every expected failure; the servicer (``grpc_service.py``) turns it
into a status or a stream error. Waits are bounded by ``--request-timeout-s`` (first response),
``--stream-idle-timeout-s`` (later ones) and the client's deadline, whichever ends first; a
timeout or a cancelled call publishes ``Cancel`` as HTTP does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from services.gateway.apis.kserve import (
    check_output,
    fill_tensors,
    fill_text,
    mark_final,
    parameters_of,
    request_tensors,
)
from services.gateway.apis.kserve_models import (
    ModelView,
    TextRequest,
    check_inputs,
    check_version,
    requested_outputs,
    text_request,
    view_of,
)
from services.gateway.apis.openai import completion_from, completion_to_preprocess
from services.gateway.core.bus import GatewayBus, Reply
from services.gateway.config import GatewayConfig
from services.gateway.core.context import RequestContext, note_error
from services.gateway.core.errors import NoResponders
from services.gateway.grpc.http2.connection import StreamReset
from services.gateway.http.relay import Readiness
from shared.errors import (
    InvalidRequest,
    ModelNotFound,
    NoWorkerAvailable,
    ServiceError,
    ShuttingDown,
)
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve_wire import usage_parameters
from shared.messages import KServeOutput, ModelCard, ResponseChunk, TensorInfer, TensorResult

log = structlog.get_logger(__name__)

NO_WORKER_RETRY_AFTER_S = 1.0


class Writer(Protocol):
    """The stream a ``ModelStreamInfer`` request answers on (``grpcserver.calls.Call``)."""

    async def write(self, message: pb.ModelStreamInferResponse) -> None: ...

    async def write_framed(self, data: bytes) -> None: ...


class Inference:
    """Answers KServe inference requests for every model the registry knows."""

    __slots__ = ("_bus", "_first_timeout_s", "_idle_timeout_s", "_readiness", "_views")

    def __init__(self, config: GatewayConfig, bus: GatewayBus, readiness: Readiness) -> None:
        self._bus = bus
        self._readiness = readiness
        self._first_timeout_s = config.request_timeout_s
        self._idle_timeout_s = config.stream_idle_timeout_s
        self._views: dict[str, tuple[ModelCard, ModelView]] = {}
        """Per model, the view built from its card, while the bus gives that same card (the
        bus follows the registry: a model republished with another card gets a new view)."""

    async def view(self, name: str, version: str = "") -> ModelView:
        """The model's KServe view; ``ModelNotFound`` for a model no worker ever published."""
        check_version(name, version)
        if not name:
            raise InvalidRequest("`model_name` must not be empty.", param="model_name")
        card = await self._bus.model_card(name)
        if card is None:
            if not self._bus.is_live(name):
                raise ModelNotFound(name)
            return view_of(name, None)  # a live worker that published no card: an LLM
        built = self._views.get(name)
        if built is not None and built[0] == card:
            return built[1]
        view = view_of(name, card)
        self._views[name] = (card, view)
        return view

    async def run(
        self, request: pb.ModelInferRequest, ctx: RequestContext, deadline: float | None = None
    ) -> pb.ModelInferResponse:
        """A ``ModelInfer`` call's response. ``deadline`` is the client's (``time.monotonic()``)."""
        ctx.model = request.model_name
        view = await self.view(request.model_name, request.model_version)
        if view.kind == "tensor":
            return await self._tensor(request, ctx, view, deadline)
        parsed = text_request(request)
        if parsed.streaming:
            raise InvalidRequest(
                "`streaming` needs ModelStreamInfer; ModelInfer answers once.", param="streaming"
            )
        return await self._whole_text(request, ctx, parsed, deadline, final=None)

    async def stream(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        writer: Writer,
        deadline: float | None = None,
    ) -> None:
        """Answer one request of a ``ModelStreamInfer`` stream on ``writer``: an LLM's text as
        the formatter framed it (``kserve`` format), or one response (a tensor model, or
        ``streaming`` false)."""
        ctx.model = request.model_name
        view = await self.view(request.model_name, request.model_version)
        if view.kind == "tensor":
            response = await self._tensor(request, ctx, view, deadline)
            mark_final(response, True)
        else:
            parsed = text_request(request)
            if parsed.streaming is not False:
                await self._streamed_text(request, ctx, parsed, writer, deadline)
                return
            response = await self._whole_text(request, ctx, parsed, deadline, final=True)
        out = pb.ModelStreamInferResponse()
        out.infer_response.CopyFrom(response)
        await writer.write(out)

    # --- LLM ---------------------------------------------------------------------------------

    async def _submit(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        parsed: TextRequest,
        deadline: float | None,
        *,
        stream: bool,
    ) -> tuple[Reply, float]:
        """Send the request down the pipeline: the reply and the first response's time limit."""
        model = request.model_name
        completion = completion_from(
            {**parsed.fields, "model": model, "prompt": parsed.prompt, "stream": stream}
        )
        self._check_open()
        await self._bus.check_model(model)
        first_timeout_s = _wait_s(self._first_timeout_s, deadline)
        ctx.bus_id = self._bus.bus_id(ctx.request_id)
        now = time.time()
        kserve = KServeOutput(id=request.id, outputs=tuple(parsed.outputs)) if stream else None
        preprocess = completion_to_preprocess(
            completion,
            request_id=ctx.bus_id,
            reply_to=self._bus.reply_subject(ctx.bus_id),
            created=int(now),
            deadline_ms=int((now + first_timeout_s) * 1000),
            output_format="kserve" if stream else "text",
            kserve=kserve,
        )
        return await self._bus.submit(preprocess), first_timeout_s

    async def _streamed_text(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        parsed: TextRequest,
        writer: Writer,
        deadline: float | None,
    ) -> None:
        """Relay the formatter's framed responses; those already queued go out in one write."""
        reply, first_timeout_s = await self._submit(request, ctx, parsed, deadline, stream=True)
        _, rest = await self._read(reply, ctx, first_timeout_s, deadline, writer.write_framed)
        if rest:
            await writer.write_framed(_joined(rest))

    async def _whole_text(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        parsed: TextRequest,
        deadline: float | None,
        *,
        final: bool | None,
    ) -> pb.ModelInferResponse:
        """The whole text in one response (``text`` format, not streamed)."""
        reply, first_timeout_s = await self._submit(request, ctx, parsed, deadline, stream=False)
        done, parts = await self._read(reply, ctx, first_timeout_s, deadline)
        response = pb.ModelInferResponse()
        fill_text(
            response,
            model=request.model_name,
            request_id=request.id,
            text=_joined(parts),
            finish_reason=done.finish_reason,
            final=final,
            wanted=parsed.outputs,
            parameters=usage_parameters(done.prompt_tokens, done.completion_tokens),
        )
        return response

    async def _read(
        self,
        reply: Reply,
        ctx: RequestContext,
        first_timeout_s: float,
        deadline: float | None,
        write: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> tuple[ResponseChunk, list[bytes]]:
        """A request's chunks up to the done one: that chunk and the data not yet written.
        With ``write``, the data already queued is passed on whenever the queue runs dry."""
        try:
            chunk = await reply.next(first_timeout_s)
            ctx.mark_first_response()
            parts: list[bytes] = []
            while True:
                if chunk.data:
                    parts.append(chunk.data)
                if chunk.done:
                    break
                if write is not None and parts and not reply.ready:
                    data = _joined(parts)
                    parts.clear()
                    await write(data)
                chunk = await reply.next(_wait_s(self._idle_timeout_s, deadline))
            reply.close()
        except BaseException as exc:
            _abandon(reply, exc, deadline)
            raise
        ctx.prompt_tokens, ctx.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        return chunk, parts

    # --- tensor models ---------------------------------------------------------------------------

    async def _tensor(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        view: ModelView,
        deadline: float | None,
    ) -> pb.ModelInferResponse:
        inputs = request_tensors(request)
        check_inputs(inputs, view.spec)
        wanted = requested_outputs(request, view.spec)
        self._check_open()
        model = request.model_name
        workers = self._bus.workers_in_turn(model)
        if not workers:
            raise NoWorkerAvailable(
                f"The model `{model}` has no live worker right now.",
                retry_after_s=NO_WORKER_RETRY_AFTER_S,
            )
        ctx.bus_id = self._bus.bus_id(ctx.request_id)
        infer = TensorInfer(
            request_id=ctx.bus_id,
            model=model,
            reply_to=self._bus.reply_subject(ctx.bus_id),
            inputs=inputs,
            outputs=tuple(o.name for o in request.outputs),
            model_version=request.model_version,
            id=request.id,
            parameters=parameters_of(request.parameters),
        )
        result = await self._tensor_result(infer, workers, deadline)
        ctx.mark_first_response()
        outputs = [o for o in result.outputs if not wanted or o.name in wanted]
        for output in outputs:
            check_output(output)
        response = pb.ModelInferResponse()
        fill_tensors(
            response,
            model=model,
            request_id=result.id or request.id,
            outputs=outputs,
            model_version=result.model_version,
            parameters=result.parameters,
        )
        return response

    async def _tensor_result(
        self, infer: TensorInfer, workers: list[str], deadline: float | None
    ) -> TensorResult:
        """Send to the first worker; on "no responders" (it just went) try the next."""
        for attempt, worker_id in enumerate(workers, start=1):
            reply = await self._bus.submit_tensor(infer, worker_id)
            try:
                result = await reply.result(_wait_s(self._first_timeout_s, deadline))
            except NoResponders:
                if attempt == len(workers):
                    raise
                log.debug("tensor_worker_unreachable", worker_id=worker_id)
                continue
            except BaseException as exc:
                _abandon(reply, exc, deadline)
                raise
            reply.close()
            return result
        raise AssertionError("unreachable: workers is not empty")

    def _check_open(self) -> None:
        if self._readiness.is_shutting_down:
            raise ShuttingDown("The gateway is shutting down.")


def _abandon(reply: Reply, exc: BaseException, deadline: float | None) -> None:
    """Stop a request that will not be answered: cancelled call, or a bug (a ``ServiceError``
    from the reply has closed or cancelled it already)."""
    if isinstance(exc, (asyncio.CancelledError, StreamReset)):
        reason = "timeout" if _is_past(deadline) else "client_disconnected"
        note_error(reason)
        reply.cancel(reason)
    elif not isinstance(exc, ServiceError):
        reply.cancel("internal_error")


def _wait_s(limit_s: float, deadline: float | None) -> float:
    """``limit_s``, or less when the client's deadline comes first."""
    if deadline is None:
        return limit_s
    return max(0.0, min(limit_s, deadline - time.monotonic()))


DEADLINE_SLACK_S = 0.05
"""grpc cancels a call at its deadline by its own timer, which can fire a little before our
``time.monotonic()`` reaches the deadline we computed from ``time_remaining()`` (seen under CI
load): a cancel this close to the deadline is the deadline."""


def _is_past(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline - DEADLINE_SLACK_S


def _joined(parts: list[bytes]) -> bytes:
    return parts[0] if len(parts) == 1 else b"".join(parts)
