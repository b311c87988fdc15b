"""``GRPCInferenceService`` (KServe v2 / Triton) over the gateway's bus: the RPCs.

Each inference request (a ``ModelInfer`` call, or one request on a ``ModelStreamInfer`` stream)
gets a request id, one access line and its metrics (``context.grpc_context``); a failure is a
status (unary) or a ``ModelStreamInferResponse.error_message`` on the stream, which stays open.
Stream requests run concurrently, each in its own task (at most ``MAX_STREAM_REQUESTS`` per
stream: then the stream is not read until one is answered); their responses carry the request's
``id``; the stream ends once the client has half-closed and every request is answered.

Each inference request takes a slot of the gateway's ``Admission`` (``--max-concurrent-requests``,
shared with HTTP; its connection holds at most ``--max-connection-share`` of them) before any
work and holds it until its response is written (or ``--send-timeout-s`` resets it); without one it
fails UNAVAILABLE (as Triton answers a full queue) with a ``retry-after`` trailer, or as a
stream error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from importlib.metadata import PackageNotFoundError, version

import grpc
import structlog

from services.gateway.apis.kserve import stream_error
from services.gateway.apis.kserve_models import ModelView
from services.gateway.core.admission import Admission
from services.gateway.core.context import (
    MAX_REQUEST_ID_LEN,
    RequestContext,
    grpc_context,
    grpc_probe_finished,
    note_error,
)
from services.gateway.core.metrics import GatewayMetrics
from services.gateway.core.port import GatewayBus
from services.gateway.core.readiness import Readiness
from services.gateway.grpc.http2.calls import Call
from services.gateway.grpc.http2.connection import StreamReset
from services.gateway.grpc.infer import Inference
from services.gateway.grpc.status import status_code
from shared.errors import Overloaded, ServiceError
from shared.kserve import grpc_service_pb2 as pb
from shared.subjects import is_token

log = structlog.get_logger(__name__)

SERVER_NAME = "jetserve"
EXTENSIONS = ("model_configuration", "parameters")
"""Triton extensions served: ``ModelConfig``, and request/response ``parameters``."""
_INTERNAL = "Internal server error."
MAX_STREAM_REQUESTS = 1024
"""Requests of one ``ModelStreamInfer`` stream in progress at once; past it, the stream's
messages stay unread (and the client's window closes) until one is answered, so a client that
sends without reading responses cannot pile up tasks here."""

Context = Call


class InferenceServicer:
    """The eight RPCs of ``inference.GRPCInferenceService``; anything else is UNIMPLEMENTED."""

    def __init__(
        self,
        inference: Inference,
        bus: GatewayBus,
        readiness: Readiness,
        metrics: GatewayMetrics,
        admission: Admission | None = None,
    ) -> None:
        self._inference = inference
        self._bus = bus
        self._readiness = readiness
        self._metrics = metrics
        self.admission = admission or Admission()
        """Shared with HTTP (``create_app`` passes one); no limit by default."""
        try:
            server_version = version("jetserve")
        except PackageNotFoundError:
            server_version = "0"
        self._server_metadata = pb.ServerMetadataResponse(
            name=SERVER_NAME, version=server_version, extensions=EXTENSIONS
        )

    def is_ready(self) -> bool:
        """Ready (and SERVING in grpc.health.v1) once a model has a live worker, until SIGTERM."""
        return (
            not self._readiness.is_shutting_down
            and self._bus.is_connected
            and bool(self._bus.live_models())
        )

    # --- health and metadata ---------------------------------------------------------------------

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        grpc_probe_finished("ServerLive", "OK", time.perf_counter(), self._metrics)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        grpc_probe_finished("ServerReady", "OK", time.perf_counter(), self._metrics)
        return pb.ServerReadyResponse(ready=self.is_ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        ready = (
            request.version in ("", "1")
            and not self._readiness.is_shutting_down
            and self._bus.is_live(request.name)
        )
        grpc_probe_finished("ModelReady", "OK", time.perf_counter(), self._metrics)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        grpc_probe_finished("ServerMetadata", "OK", time.perf_counter(), self._metrics)
        return self._server_metadata

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        return (await self._view("ModelMetadata", request.name, request.version, context)).metadata

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        return (await self._view("ModelConfig", request.name, request.version, context)).config

    async def _view(self, rpc: str, name: str, version: str, context: Context) -> ModelView:
        """The model's KServe view for a metadata RPC (a typed failure aborts the call)."""
        started = time.perf_counter()
        try:
            view = await self._inference.view(name, version)
        except ServiceError as exc:
            await self._probe_failed(rpc, exc, started, context)
        grpc_probe_finished(rpc, "OK", started, self._metrics)
        return view

    async def _probe_failed(
        self, rpc: str, exc: ServiceError, started: float, context: Context
    ) -> None:
        code = status_code(exc)
        grpc_probe_finished(rpc, code.name, started, self._metrics)
        await context.abort(code, exc.message)

    # --- inference -------------------------------------------------------------------------------

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Context
    ) -> pb.ModelInferResponse:
        deadline = _deadline(context)
        with grpc_context("ModelInfer", self._metrics, _client_request_id(context)) as ctx:
            trailers: tuple[tuple[str, str], ...] = (("x-request-id", ctx.request_id),)
            context.set_trailing_metadata(trailers)
            try:
                self._admit(context)
                return await self._inference.run(
                    request, ctx, deadline, context.invocation_metadata()
                )
            except ServiceError as exc:
                code = _failed(ctx, exc)
                if exc.retry_after_s is not None:
                    trailers += (("retry-after", str(max(1, round(exc.retry_after_s)))),)
                await context.abort(code, exc.message, trailers)
            except Exception:  # noqa: BLE001 - a bug: one traceback, and INTERNAL
                _crashed(ctx)
                await context.abort(grpc.StatusCode.INTERNAL, _INTERNAL, trailers)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[pb.ModelInferRequest], context: Context
    ) -> None:
        """One task per request, started as its message is read, each writing its own
        responses (the call keeps each message whole); the call ends once the client has
        half-closed and every request is answered. Cancelling the call (client cancel,
        deadline) cancels every request."""
        deadline = _deadline(context)
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()

        def start(request: pb.ModelInferRequest) -> None:
            task = loop.create_task(self._stream_one(request, context, deadline))
            tasks.add(task)
            task.add_done_callback(done)
            if len(tasks) >= MAX_STREAM_REQUESTS:
                context.pause_requests()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            context.resume_requests()

        try:
            await context.each_request(start)
            while tasks:
                await asyncio.wait(tuple(tasks))
        finally:
            for task in tasks:
                task.cancel()

    async def _stream_one(
        self, request: pb.ModelInferRequest, context: Context, deadline: float | None
    ) -> None:
        with grpc_context("ModelStreamInfer", self._metrics) as ctx:
            try:
                with self.admission.slot(context.connection):  # until its last response is out
                    await self._inference.stream(
                        request, ctx, context, deadline, context.invocation_metadata()
                    )
                return
            except StreamReset:  # the call is over (the client went): nobody to answer
                ctx.grpc_status = grpc.StatusCode.CANCELLED.name
                return
            except ServiceError as exc:
                _failed(ctx, exc)
                failed = stream_error(exc.message, model=request.model_name, request_id=request.id)
            except Exception:  # noqa: BLE001 - a bug: one traceback, the stream goes on
                _crashed(ctx)
                failed = stream_error(_INTERNAL, model=request.model_name, request_id=request.id)
            with contextlib.suppress(StreamReset):
                await context.write(failed)

    def _admit(self, context: Context) -> None:
        """Take a slot for a unary call until it is over (its response written, or the call
        aborted or cancelled); ``Overloaded`` when none is free."""
        admission, owner = self.admission, context.connection
        if not admission.try_enter(owner):
            raise admission.refusal(owner)
        context.add_done_callback(lambda _: admission.leave(owner))


def _failed(ctx: RequestContext, exc: ServiceError) -> grpc.StatusCode:
    """Record an expected failure for the access line; server-side ones log a warning (not a
    refusal under overload: the access line and ``jetserve_gateway_rejected_total`` count it)."""
    code = status_code(exc)
    ctx.grpc_status = code.name
    note_error(exc.code)
    if exc.status >= 500 and not isinstance(exc, Overloaded):
        log.warning("request_failed", code=exc.code, status=code.name, message=exc.message)
    return code


def _crashed(ctx: RequestContext) -> None:
    log.exception("request_crashed")
    ctx.grpc_status = grpc.StatusCode.INTERNAL.name
    note_error("internal_error")


def _deadline(context: Context) -> float | None:
    """The client's deadline on the ``time.monotonic()`` clock (``None``: it set none)."""
    remaining: float | None = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _client_request_id(context: Context) -> str | None:
    """The client's ``x-request-id`` metadata when it is a subject token of at most 64 chars."""
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and isinstance(value, str):
            if len(value) <= MAX_REQUEST_ID_LEN and is_token(value):
                return value
            return None
    return None
