"""A hand-written in-memory ``GatewayBus`` for the gateway's unit tests (no sockets)."""

from __future__ import annotations

import msgspec

from services.gateway.core.bus import Inbox, Reply, ReplyItem
from services.gateway.core.errors import NoResponders
from services.gateway.core.port import GatewayBus
from shared.errors import ServiceUnavailable
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

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class FakeBus(GatewayBus):
    """Answers every request with ``script``; records what the app asked for. Implements the
    ``GatewayBus`` Protocol (subclassing it, so mypy checks every method's signature)."""

    def __init__(self) -> None:
        self.script: list[ReplyItem] = []
        self.check_error: Exception | None = None
        self.submit_error: Exception | None = None
        self.started = self.stopped = False
        self.submitted: list[Preprocess] = []
        self.inboxes: list[Inbox] = []
        """One per submitted request, for replies that arrive later."""
        self.cancelled: list[tuple[str, str]] = []
        self.connected = True
        self.pending = 0
        self.cards: dict[str, ModelCard | None] = {}
        """Cards by model (``None``: never published); any other model gets an LLM card."""
        self.workers = ["t1"]
        """The live workers ``workers_in_turn`` gives (tensor models)."""
        self.cards_of_workers: list[WorkerCard] = [WorkerCard(worker_id="w1", model="m")]
        """What ``live_workers`` gives (``/v1/models``' ``jetserve`` extension)."""
        self.tensor_sent: list[tuple[TensorInfer, str]] = []
        self.tensor_scripts: list[list[ReplyItem]] = []
        """One script per tensor submit, in order (else ``script``)."""
        self.resent: list[Preprocess] = []
        self.gone: set[str] = set()
        """Workers that answer "no responders" (media)."""
        self.asked: list[str] = []
        """The workers asked, in order (media)."""
        self.token_counts: list[CountTokens] = []
        self.thresholds: dict[str, BusyThresholdsChanged] = {}
        """The busy-thresholds bucket, by model."""

    @property
    def is_connected(self) -> bool:
        return self.connected

    @property
    def in_flight(self) -> int:
        return self.pending

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def live_models(self) -> list[str]:
        return ["m"]

    async def check_model(self, model: str) -> None:
        if self.check_error is not None:
            raise self.check_error

    async def model_card(self, model: str) -> ModelCard | None:
        if model in self.cards:
            return self.cards[model]
        return ModelCard(model=model, context_length=8, created=123)

    def is_live(self, model: str) -> bool:
        return True

    def live_workers(self, model: str) -> list[WorkerCard]:
        return [card for card in self.cards_of_workers if card.model == model]

    def workers_in_turn(self, model: str) -> list[str]:
        return list(self.workers)

    async def submit_tensor(self, request: TensorInfer, worker_id: str) -> Reply:
        self.tensor_sent.append((request, worker_id))
        script = self.tensor_scripts.pop(0) if self.tensor_scripts else self.script
        inbox = Inbox()
        for item in script:
            inbox.put_nowait(item)
        self.inboxes.append(inbox)
        return Reply(self, request.request_id, inbox)

    def reply_subject(self, request_id: str) -> str:
        return f"gw.{request_id}"

    def bus_id(self, request_id: str) -> str:
        return request_id

    async def submit(self, request: Preprocess) -> Reply:
        if self.submit_error is not None:
            raise self.submit_error
        self.submitted.append(request)
        inbox = Inbox()
        for item in self.script:
            inbox.put_nowait(item)
        self.inboxes.append(inbox)
        return Reply(self, request.request_id, inbox)

    def forget(self, request_id: str) -> None:
        pass

    def cancel_soon(self, request_id: str, reason: str) -> None:
        self.cancelled.append((request_id, reason))

    async def resend(self, request: Preprocess, inbox: Inbox) -> None:
        self.resent.append(request)

    async def embed(self, request: Embed, timeout_s: float) -> EmbedResult:
        raise ServiceUnavailable("No embedder in this fake.")

    async def count_tokens(self, request: CountTokens, timeout_s: float) -> int:
        self.token_counts.append(request)
        return 7

    async def generate_media(
        self, request: MediaGenerate, worker_id: str, timeout_s: float
    ) -> MediaResult:
        self.asked.append(worker_id)
        if worker_id in self.gone:
            raise NoResponders(f"The worker `{worker_id}` of `{request.model}` is not running.")
        return MediaResult(
            request_id=request.request_id,
            model=request.model,
            media_type="image/png",
            items=(b"x",),
            worker_id=worker_id,
        )

    async def busy_thresholds(self, model: str | None = None) -> list[BusyThresholdsChanged]:
        found = list(self.thresholds.values())
        return [m for m in found if model is None or m.model == model]

    async def lora_command(
        self, worker_id: str, command: LoraCommand, timeout_s: float
    ) -> LoraAdapterAnswer:
        return LoraAdapterAnswer(request_id=command.request_id, worker_id=worker_id, changed=True)

    async def set_busy_thresholds(self, message: BusyThresholdsChanged) -> BusyThresholdsChanged:
        revision = 1 + max((m.revision for m in self.thresholds.values()), default=0)
        stored = msgspec.structs.replace(message, revision=revision)
        self.thresholds[message.model] = stored
        return stored
