"""LoRA adapters on vLLM (decision 031): JetServe's load/unload commands as vLLM's adapter API.

In-process (``AsyncLLM``, ``vllm/v1/engine/async_llm.py``): each held adapter is one
``LoRARequest(lora_name, lora_int_id, lora_path)`` (``vllm/lora/request.py``), its int id counted
from 1 as ``OpenAIServingModels`` counts them (``vllm/entrypoints/openai/serving_models.py``);
load is ``await add_lora(request)`` (which pre-loads it), unload ``await remove_lora(int_id)``;
each request carries its adapter's ``LoRARequest``. Remote (``vllm serve``): load and unload are
its ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` and ``/v1/unload_lora_adapter
{"lora_name"}``; a request names the adapter as its ``model``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import httpx

from shared.worker.records import EngineError

__all__ = ["InProcessAdapters", "LoraClient", "RemoteAdapters"]


class LoraClient(Protocol):
    """The part of ``AsyncLLM`` adapters need."""

    async def add_lora(self, lora_request: Any) -> bool: ...

    async def remove_lora(self, lora_id: int) -> bool: ...


class InProcessAdapters:
    """Held adapters as ``LoRARequest``s on an in-process engine."""

    def __init__(
        self, client: LoraClient, make_request: Callable[..., Any] | None, max_loras: int
    ) -> None:
        self._client = client
        self._make = make_request
        """``vllm.lora.request.LoRARequest``, or None: the engine runs without ``enable_lora``."""
        self.max_loras = max_loras
        self._requests: dict[str, Any] = {}
        self._next_id = 0

    def request_for(self, name: str) -> Any:
        """The ``LoRARequest`` of held adapter ``name`` (``EngineError`` if not held)."""
        found = self._requests.get(name)
        if found is None:
            raise EngineError(f"LoRA adapter {name!r} is not loaded on this worker")
        return found

    async def load_lora(self, name: str, path: str) -> None:
        if self._make is None:
            raise EngineError(
                "this vLLM engine was started without LoRA (give the worker --lora-modules)"
            )
        self._next_id += 1
        request = self._make(lora_name=name, lora_int_id=self._next_id, lora_path=path)
        try:
            await self._client.add_lora(request)
        except (ValueError, RuntimeError, OSError) as exc:  # vLLM: no adapter there, bad rank
            raise EngineError(f"vLLM could not load LoRA adapter {name!r}: {exc}") from exc
        self._requests[name] = request

    async def unload_lora(self, name: str) -> None:
        request = self._requests.pop(name, None)
        if request is not None:
            await self._client.remove_lora(request.lora_int_id)


class RemoteAdapters:
    """Held adapters on a remote ``vllm serve`` (its adapter endpoints)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def load_lora(self, name: str, path: str) -> None:
        body = {"lora_name": name, "lora_path": path}
        response = await self._post("/v1/load_lora_adapter", body)
        if response.status_code == 400 and "already been loaded" in response.text:
            return  # held there already (a restarted worker, or another client): idempotent
        if response.status_code != 200:
            raise EngineError(
                f"vLLM could not load LoRA adapter {name!r}: {response.status_code} "
                f"{response.text[:300]}"
            )

    async def unload_lora(self, name: str) -> None:
        response = await self._post("/v1/unload_lora_adapter", {"lora_name": name})
        if response.status_code not in (200, 404):  # 404: it was not loaded there
            raise EngineError(
                f"vLLM could not unload LoRA adapter {name!r}: {response.status_code} "
                f"{response.text[:300]}"
            )

    async def _post(self, path: str, body: dict[str, str]) -> httpx.Response:
        try:
            return await self._client.post(path, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"vLLM did not answer {path}: {exc!r}") from exc
