"""Echo tensor worker wiring: model card, worker card with heartbeat, ``TensorInfer`` → echo.

The model card (``kind="tensor"``, with its ``TensorModelSpec``) tells gateways what the model
takes and gives; the worker card (``kind="echo_tensor"``) says it is live. Requests come on
``subjects.tensor_infer(worker_id)`` through the shared handler boundary and are answered on
their ``reply_to``; the echo itself is ``echo.py``.
"""

from __future__ import annotations

import contextlib
import time

import nats.errors
import structlog
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.echo import echo
from services.echo_tensor.spec import flag_spec, output_names
from shared import codec
from shared.bus import barrier
from shared.handlers import Boundary
from shared.messages import ModelCard, TensorInfer, TensorModelSpec, WorkerCard
from shared.metrics import ServiceMetrics
from shared.registry import WorkerRegistration, publish_model_card
from shared.subjects import Subjects

log = structlog.get_logger(__name__)

TENSOR_INFER = codec.decoder(TensorInfer)


def model_spec(config: EchoTensorConfig) -> TensorModelSpec:
    """The model's spec: from the Triton config file when one is given, else the flags."""
    if config.triton_model_config is None:
        return flag_spec(config.inputs, config.outputs)
    # Imported only here: protobuf is needed for a Triton config file and nothing else.
    from services.echo_tensor.triton_config import model_spec as triton_spec

    return triton_spec(config.triton_model_config, config.model_name)


class EchoTensorService:
    """One echo worker: its cards in the registry and its tensor-request subscription."""

    def __init__(
        self,
        config: EchoTensorConfig,
        nc: Client,
        *,
        spec: TensorModelSpec | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._config = config
        self._nc = nc
        self._subjects = Subjects(config.namespace)
        self.metrics = metrics or ServiceMetrics("echo_tensor")
        self.worker_id = config.worker_id
        self.spec = spec if spec is not None else model_spec(config)
        self._names = output_names(self.spec)
        self._on_infer_msg = Boundary(nc, self.metrics).handler(
            TENSOR_INFER, "tensor_infer", self.on_infer, reply_to=_reply_to
        )
        card = WorkerCard(worker_id=self.worker_id, model=config.model_name, kind="echo_tensor")
        self._registration = WorkerRegistration(
            nc.jetstream(),
            self._subjects,
            card,
            ttl_s=config.worker_ttl_s,
            replicas=config.js_replicas,
        )
        self._sub: Subscription | None = None

    @property
    def service_metrics(self) -> ServiceMetrics:
        return self.metrics

    async def start(self) -> None:
        """Publish the model card, subscribe, then register (the worker card means "ready")."""
        card = ModelCard(
            model=self._config.model_name,
            context_length=0,
            created=int(time.time()),
            kind="tensor",
            tensor_spec=self.spec,
        )
        await publish_model_card(
            self._nc.jetstream(), self._subjects, card, replicas=self._config.js_replicas
        )
        subject = self._subjects.tensor_infer(self.worker_id)
        self._sub = await self._nc.subscribe(subject, cb=self._on_infer_msg)
        await barrier(self._nc)  # subscribed on the server before the card says "ready"
        await self._registration.start()
        log.info("worker_started", worker_id=self.worker_id, model=self._config.model_name)

    async def stop(self) -> None:
        """Leave the registry, then stop taking requests (an echo has nothing in flight)."""
        await self._registration.stop()
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
        log.info("worker_stopped", worker_id=self.worker_id)

    async def on_infer(self, request: TensorInfer) -> None:
        """Answer one request with its inputs (``ModelNotFound`` for another model)."""
        result = echo(request, model=self._config.model_name, names=self._names)
        await self._nc.publish(request.reply_to, codec.encode(result))


def _reply_to(request: TensorInfer) -> str:
    return request.reply_to


def build_service(
    config: EchoTensorConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> EchoTensorService:
    """Compose an echo worker on ``nc`` (a bad Triton config file fails here, before serving)."""
    return EchoTensorService(config, nc, metrics=metrics)
