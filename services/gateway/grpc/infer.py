"""One KServe inference request over the bus: an LLM through the pipeline (``text`` output), or
a tensor model straight to one of its live workers (round-robin, ``TensorInfer``).

Raises ``ServiceError`` for every expected failure; the servicer (``service.py``) turns it
into a status or a stream error. The exchange (``core/exchange.py``) bounds every wait by
``--request-timeout-s`` (first response), ``--stream-idle-timeout-s`` (later ones) and the
client's deadline, whichever ends first; a timeout or a cancelled call publishes ``Cancel``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import structlog

from services.gateway.apis.admission_hints import NO_POLICY, AdmissionReader
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
from services.gateway.apis.nvext import NO_HEADERS, RoutingHeaders, routing_headers
from services.gateway.apis.openai import completion_from, completion_to_preprocess
from services.gateway.core.context import RequestContext
from services.gateway.core.exchange import Exchange, Exchanges
from services.gateway.core.readiness import Readiness
from shared.errors import (
    InvalidRequest,
    ModelNotFound,
    ShuttingDown,
)
from shared.kserve import grpc_service_pb2 as pb
from shared.kserve_wire import usage_parameters
from shared.messages import KServeOutput, ModelCard, TensorInfer

log = structlog.get_logger(__name__)

Metadata = Iterable[tuple[str, str | bytes]]
"""A call's invocation metadata (``Call.invocation_metadata()``)."""


class Writer(Protocol):
    """The stream a ``ModelStreamInfer`` request answers on (``grpc.http2.calls.Call``)."""

    async def write(self, message: pb.ModelStreamInferResponse) -> None: ...

    async def write_framed(self, data: bytes) -> None: ...


class Inference:
    """Answers KServe inference requests for every model the registry knows."""

    __slots__ = ("_admission", "_bus", "_exchanges", "_readiness", "_views")

    def __init__(
        self, exchanges: Exchanges, readiness: Readiness, admission: AdmissionReader = NO_POLICY
    ) -> None:
        self._exchanges = exchanges
        self._admission = admission
        """The admission headers and policy: metadata is read as HTTP headers are."""
        self._bus = exchanges.bus
        self._readiness = readiness
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
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        deadline: float | None = None,
        metadata: Metadata = (),
    ) -> pb.ModelInferResponse:
        """A ``ModelInfer`` call's response. ``deadline`` is the client's (``time.monotonic()``);
        ``metadata`` carries the routing and admission headers, as over HTTP."""
        ctx.model = request.model_name
        view = await self.view(request.model_name, request.model_version)
        if view.kind == "tensor":
            return await self._tensor(request, ctx, view, deadline)
        parsed = text_request(request)
        if parsed.streaming:
            raise InvalidRequest(
                "`streaming` needs ModelStreamInfer; ModelInfer answers once.", param="streaming"
            )
        headers = self.headers(metadata)
        return await self._whole_text(request, ctx, parsed, deadline, final=None, headers=headers)

    def headers(self, metadata: Metadata) -> RoutingHeaders:
        """The routing headers of a call's metadata (``InvalidRequest`` for a bad value)."""
        raw = [
            (key.encode("latin-1"), value.encode("latin-1") if isinstance(value, str) else value)
            for key, value in metadata
        ]
        return routing_headers(raw, self._admission)

    async def stream(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        writer: Writer,
        deadline: float | None = None,
        metadata: Metadata = (),
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
            headers = self.headers(metadata)
            if parsed.streaming is not False:
                await self._streamed_text(request, ctx, parsed, writer, deadline, headers)
                return
            response = await self._whole_text(
                request, ctx, parsed, deadline, final=True, headers=headers
            )
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
        headers: RoutingHeaders = NO_HEADERS,
    ) -> Exchange:
        """Send the request down the pipeline; its exchange."""
        model = request.model_name
        completion = completion_from(
            {**parsed.fields, "model": model, "prompt": parsed.prompt, "stream": stream}
        )
        self._check_open()
        await self._bus.check_model(model)
        envelope = self._exchanges.envelope(ctx, deadline)
        kserve = KServeOutput(id=request.id, outputs=tuple(parsed.outputs)) if stream else None
        preprocess = completion_to_preprocess(
            completion,
            request_id=envelope.request_id,
            reply_to=envelope.reply_to,
            created=envelope.created,
            deadline_ms=envelope.deadline_ms,
            headers=headers,
            output_format="kserve" if stream else "text",
            kserve=kserve,
        )
        return await self._exchanges.submit(ctx, preprocess, envelope)

    async def _streamed_text(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        parsed: TextRequest,
        writer: Writer,
        deadline: float | None,
        headers: RoutingHeaders = NO_HEADERS,
    ) -> None:
        """Relay the formatter's framed responses; those already queued go out in one write."""
        exchange = await self._submit(request, ctx, parsed, deadline, stream=True, headers=headers)
        _, rest = await exchange.relay(await exchange.first(), writer.write_framed)
        if rest:
            await writer.write_framed(rest)

    async def _whole_text(
        self,
        request: pb.ModelInferRequest,
        ctx: RequestContext,
        parsed: TextRequest,
        deadline: float | None,
        *,
        final: bool | None,
        headers: RoutingHeaders = NO_HEADERS,
    ) -> pb.ModelInferResponse:
        """The whole text in one response (``text`` format, not streamed)."""
        exchange = await self._submit(request, ctx, parsed, deadline, stream=False, headers=headers)
        done, text = await exchange.relay(await exchange.first())
        response = pb.ModelInferResponse()
        fill_text(
            response,
            model=request.model_name,
            request_id=request.id,
            text=text,
            finish_reason=done.finish_reason,
            final=final,
            wanted=parsed.outputs,
            parameters=usage_parameters(done.prompt_tokens, done.completion_tokens),
        )
        return response

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
        envelope = self._exchanges.envelope(ctx, deadline)
        infer = TensorInfer(
            request_id=envelope.request_id,
            model=model,
            reply_to=envelope.reply_to,
            inputs=inputs,
            outputs=tuple(o.name for o in request.outputs),
            model_version=request.model_version,
            id=request.id,
            parameters=parameters_of(request.parameters),
        )
        result = await self._exchanges.tensor(infer, envelope)
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

    def _check_open(self) -> None:
        if self._readiness.is_shutting_down:
            raise ShuttingDown("The gateway is shutting down.")
