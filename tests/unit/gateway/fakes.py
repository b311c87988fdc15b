"""A hand-written in-memory ``GatewayBus`` for the gateway's unit tests (no sockets)."""

from __future__ import annotations

from typing import Any

from services.gateway.core.bus import Inbox, Reply, ReplyItem
from shared.messages import ModelCard, Preprocess, TensorInfer, WorkerCard

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class FakeBus:
    """Answers every request with ``script``; records what the app asked for."""

    def __init__(self) -> None:
        self.script: list[ReplyItem] = []
        self.check_error: Exception | None = None
        self.submit_error: Exception | None = None
        self.started = self.stopped = False
        self.submitted: list[Preprocess] = []
        self.inboxes: list[Inbox] = []
        """One per submitted request, for replies that arrive later."""
        self.cancelled: list[tuple[str, str]] = []
        self.is_connected = True
        self.in_flight = 0
        self.cards: dict[str, ModelCard] = {}
        """Cards by model; any other model gets an LLM card."""
        self.workers = ["t1"]
        """The live workers ``workers_in_turn`` gives (tensor models)."""
        self.cards_of_workers: list[WorkerCard] = [WorkerCard(worker_id="w1", model="m")]
        """What ``live_workers`` gives (``/v1/models``' ``jetserve`` extension)."""
        self.tensor_sent: list[tuple[TensorInfer, str]] = []
        self.tensor_scripts: list[list[ReplyItem]] = []
        """One script per tensor submit, in order (else ``script``)."""

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
        return self.cards.get(model) or ModelCard(model=model, context_length=8, created=123)

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
        bus: Any = self
        return Reply(bus, request.request_id, inbox)

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
        bus: Any = self
        return Reply(bus, request.request_id, inbox)

    def forget(self, request_id: str) -> None:
        pass

    def cancel_soon(self, request_id: str, reason: str) -> None:
        self.cancelled.append((request_id, reason))
