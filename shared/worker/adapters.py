"""A worker's LoRA adapters: which it holds (its card's ``loras``), loading and unloading them on
its ``lora`` subject (vLLM's ``load_lora_adapter`` / ``unload_lora_adapter``), and the check
that a request's adapter is held here (decision 031).

Commands are idempotent, so the gateway's admin endpoints and the routers that place adapters
can repeat one without harm: loading an adapter already held under the same path, or unloading
one not held, changes nothing and says so. The card is put before the answer goes, so whoever
asked sees the change in the registry once answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec
import structlog

from shared.errors import InvalidRequest, WorkerBusy
from shared.lora import LoraModule, check_adapter_name
from shared.messages import (
    LoadLoraAdapter,
    LoraAdapter,
    LoraAdapterAnswer,
    LoraCommand,
    UnloadLoraAdapter,
    WorkerCard,
)
from shared.worker.engine import AdapterEngine
from shared.worker.records import EngineError

log = structlog.get_logger(__name__)

PutCard = Callable[[WorkerCard], Awaitable[None]]
LORA_COMMANDS: msgspec.msgpack.Decoder[LoraCommand] = msgspec.msgpack.Decoder(LoraCommand)
"""What a worker's ``lora`` subject carries."""


class WorkerAdapters:
    """The adapters one worker holds, over its engine (``AdapterEngine``) and card."""

    def __init__(
        self, worker_id: str, model: str, engine: object, max_loras: int, put_card: PutCard
    ) -> None:
        self.worker_id = worker_id
        self._model = model
        self._engine = engine if isinstance(engine, AdapterEngine) else None
        self.max_loras = max_loras if self._engine is not None else 0
        self._put_card = put_card
        self.held: dict[str, LoraAdapter] = {}
        self._lock = asyncio.Lock()
        """One command at a time: the card always says what the engine holds."""

    @property
    def is_supported(self) -> bool:
        return self._engine is not None

    def on_card(self, card: WorkerCard) -> WorkerCard:
        """``card`` saying what this worker holds now."""
        loras = tuple(self.held[name] for name in sorted(self.held))
        return msgspec.structs.replace(card, loras=loras, max_loras=self.max_loras)

    async def load_static(self, modules: tuple[LoraModule, ...]) -> None:
        """Hold the ``--lora-modules`` adapters before the card is first put (``ValueError``:
        the engine serves no adapters, or one cannot be loaded)."""
        if modules and self._engine is None:
            raise ValueError("--lora-modules: this worker's engine serves no LoRA adapters")
        for module in modules:
            parent = module.base_model_name
            if parent and parent != self._model:
                raise ValueError(
                    f"--lora-modules: adapter {module.name!r} is for {parent!r}, this worker "
                    f"serves {self._model!r}"
                )
            try:
                await self._load(module.name, module.path)
            except EngineError as exc:
                raise ValueError(f"--lora-modules: adapter {module.name!r}: {exc}") from None

    def check(self, lora_name: str | None) -> None:
        """Raise ``WorkerBusy`` (retryable: the formatter routes the request again) when a
        request names an adapter this worker does not hold (unloaded since it was routed)."""
        if lora_name and lora_name not in self.held:
            raise WorkerBusy(f"LoRA adapter {lora_name!r} is not loaded on worker {self.worker_id}")

    async def handle(self, command: LoraCommand, card: WorkerCard) -> LoraAdapterAnswer:
        """Apply one command; the answer says what changed (errors as ``ok=False``)."""
        async with self._lock:
            try:
                if isinstance(command, LoadLoraAdapter):
                    changed, found = await self._on_load(command), True
                else:
                    changed, found = await self._on_unload(command), command.lora_name in self.held
                    found = found or changed
            except (InvalidRequest, EngineError) as exc:
                log.warning("lora_command_refused", command=type(command).__name__, error=str(exc))
                return self._answer(command, ok=False, code="invalid_request", message=str(exc))
            if changed:
                await self._put_card(self.on_card(card))
                log.info(
                    "lora_adapters_changed",
                    command=type(command).__name__,
                    lora_name=command.lora_name,
                    requested_by=command.requested_by,
                    loras=sorted(self.held),
                )
            return self._answer(command, changed=changed, found=found)

    async def _on_load(self, command: LoadLoraAdapter) -> bool:
        if self._engine is None:
            raise InvalidRequest(f"worker {self.worker_id}'s engine serves no LoRA adapters")
        name, path = command.lora_name, command.lora_path
        if not name or not path:
            raise InvalidRequest("Both 'lora_name' and 'lora_path' must be provided.")
        try:
            check_adapter_name(name)
        except ValueError as exc:
            raise InvalidRequest(str(exc), param="lora_name") from None
        held = self.held.get(name)
        if held is not None:
            if held.path != path:
                raise InvalidRequest(
                    f"LoRA adapter {name!r} is already loaded from {held.path!r}", param="lora_path"
                )
            return False
        await self._load(name, path)
        return True

    async def _on_unload(self, command: UnloadLoraAdapter) -> bool:
        name = command.lora_name
        if name not in self.held or self._engine is None:
            return False
        await self._engine.unload_lora(name)
        del self.held[name]
        return True

    async def _load(self, name: str, path: str) -> None:
        assert self._engine is not None
        await self._engine.load_lora(name, path)
        self.held[name] = LoraAdapter(name=name, path=path)

    def _answer(self, command: LoraCommand, **fields: object) -> LoraAdapterAnswer:
        return LoraAdapterAnswer(
            request_id=command.request_id,
            worker_id=self.worker_id,
            loras=tuple(sorted(self.held)),
            **fields,  # type: ignore[arg-type]  # the answer's own fields, by name
        )
