"""``GatewayBus``: what the gateway's core and fronts need of the bus, as a Protocol, so the
NATS implementation (``bus.NatsBus``) and the tests' in-memory fakes are interchangeable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from services.gateway.core.bus import Reply
    from services.gateway.core.inbox import Inbox
    from shared.messages import (
        BusyThresholdsChanged,
        CountTokens,
        Embed,
        EmbedResult,
        LoraAdapterAnswer,
        LoraCommand,
        MediaGenerate,
        MediaResult,
        ModelCard,
        Preprocess,
        TensorInfer,
        WorkerCard,
    )


class ReplyBus(Protocol):
    """What one request's ``Reply`` needs of the bus: its address, resubmission, cancel."""

    def reply_subject(self, request_id: str) -> str: ...

    async def resend(self, request: Preprocess, inbox: Inbox) -> None: ...

    def forget(self, request_id: str) -> None: ...

    def cancel_soon(self, request_id: str, reason: str) -> None: ...


class GatewayBus(ReplyBus, Protocol):
    """The gateway's side of the bus: lifecycle, the live models, requests and their replies."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    @property
    def is_connected(self) -> bool: ...

    @property
    def in_flight(self) -> int: ...

    def live_models(self) -> list[str]: ...

    def live_workers(self, model: str) -> list[WorkerCard]: ...

    def is_live(self, model: str) -> bool: ...

    def workers_in_turn(self, model: str) -> list[str]: ...

    async def check_model(self, model: str) -> None: ...

    async def model_card(self, model: str) -> ModelCard | None: ...

    def bus_id(self, request_id: str) -> str: ...

    async def submit(self, request: Preprocess) -> Reply: ...

    async def submit_tensor(self, request: TensorInfer, worker_id: str) -> Reply: ...

    async def embed(self, request: Embed, timeout_s: float) -> EmbedResult: ...

    async def count_tokens(self, request: CountTokens, timeout_s: float) -> int: ...

    async def generate_media(
        self, request: MediaGenerate, worker_id: str, timeout_s: float
    ) -> MediaResult: ...

    async def busy_thresholds(self, model: str | None = None) -> list[BusyThresholdsChanged]: ...

    async def set_busy_thresholds(
        self, message: BusyThresholdsChanged
    ) -> BusyThresholdsChanged: ...

    async def lora_command(
        self, worker_id: str, command: LoraCommand, timeout_s: float
    ) -> LoraAdapterAnswer: ...
