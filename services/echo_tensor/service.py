"""Echo tensor worker wiring: model card, worker card with heartbeat, ``TensorInfer`` → echo.

The model card (``kind="tensor"``, with its ``TensorModelSpec``) tells gateways what the model
takes and gives; the worker card (``kind="echo_tensor"``) says it is live. Requests come on
``subjects.tensor_infer(worker_id)`` through the shared handler boundary and are answered on
their ``reply_to``; the echo itself is ``echo.py``, the start and stop order
``shared.worker.simple``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from nats.aio.client import Client

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.echo import echo
from services.echo_tensor.spec import flag_spec, output_names
from shared import codec
from shared.handlers import Callback
from shared.messages import ModelCard, TensorInfer, TensorModelSpec, WorkerCard
from shared.metrics import ServiceMetrics
from shared.worker.simple import Model, SimpleWorker

TENSOR_INFER = codec.decoder(TensorInfer)


def model_spec(config: EchoTensorConfig) -> TensorModelSpec:
    """The model's spec: from the Triton config file when one is given, else the flags."""
    if config.triton_model_config is None:
        return flag_spec(config.inputs, config.outputs)
    # Imported only here: protobuf is needed for a Triton config file and nothing else.
    from services.echo_tensor.triton_config import model_spec as triton_spec

    return triton_spec(config.triton_model_config, config.model_name)


class EchoTensorService(SimpleWorker[EchoTensorConfig]):
    """One echo worker: its cards in the registry and its tensor-request subscription (an echo
    has nothing in flight: ``stop`` leaves the registry, then unsubscribes)."""

    def __init__(
        self,
        config: EchoTensorConfig,
        nc: Client,
        *,
        spec: TensorModelSpec | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__(config, nc, metrics=metrics)
        self.worker_id = config.worker_id
        self.spec = spec if spec is not None else model_spec(config)
        self._names = output_names(self.spec)

    async def model_cards(self) -> Sequence[Model]:
        card = ModelCard(
            model=self.config.model_name,
            context_length=0,
            created=int(time.time()),
            kind="tensor",
            tensor_spec=self.spec,
        )
        return [(card, None)]

    def worker_cards(self) -> Sequence[WorkerCard]:
        model = self.config.model_name
        return [WorkerCard(worker_id=self.worker_id, model=model, kind="echo_tensor")]

    def subscriptions(self) -> Sequence[tuple[str, Callback]]:
        on_infer = self.boundary.handler(
            TENSOR_INFER, "tensor_infer", self.on_infer, reply_to=_reply_to
        )
        return [(self._subjects.tensor_infer(self.worker_id), on_infer)]

    def log_fields(self) -> dict[str, object]:
        return {"worker_id": self.worker_id, "model": self.config.model_name}

    async def on_infer(self, request: TensorInfer) -> None:
        """Answer one request with its inputs (``ModelNotFound`` for another model)."""
        result = echo(request, model=self.config.model_name, names=self._names)
        await self._nc.publish(request.reply_to, codec.encode(result))


def _reply_to(request: TensorInfer) -> str:
    return request.reply_to


def build_service(
    config: EchoTensorConfig, nc: Client, *, metrics: ServiceMetrics | None = None
) -> EchoTensorService:
    """Compose an echo worker on ``nc`` (a bad Triton config file fails here, before serving)."""
    return EchoTensorService(config, nc, metrics=metrics)
