"""The vLLM worker's LoRA mapping (``services/vllm_worker/adapters.py``) against fakes that follow
vLLM's interfaces: ``AsyncLLM.add_lora(lora_request) -> bool`` / ``remove_lora(lora_id) -> bool``
(``vllm/v1/engine/async_llm.py``), ``LoRARequest(lora_name, lora_int_id, lora_path)``
(``vllm/lora/request.py``), and ``vllm serve``'s ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` (``vllm/entrypoints/openai/serving_models.py``: 400 "has already
been loaded", 404 "cannot be found", plain-text success lines)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx
import pytest

from services.vllm_worker.adapters import InProcessAdapters, RemoteAdapters
from shared.worker.records import EngineError


@dataclass
class FakeLoRARequest:
    """``vllm.lora.request.LoRARequest``'s fields that the worker sets."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""


class FakeLoraEngine:
    """``AsyncLLM``'s adapter methods: ``add_lora`` raises ``ValueError`` for a path with no
    adapter (vLLM: "No adapter found"), ids must be positive."""

    def __init__(self) -> None:
        self.loaded: dict[int, FakeLoRARequest] = {}

    async def add_lora(self, lora_request: FakeLoRARequest) -> bool:
        if lora_request.lora_int_id < 1:
            raise ValueError("lora_int_id must be > 0")
        if lora_request.lora_path.startswith("/missing"):
            raise ValueError(f"No adapter found for {lora_request.lora_path}")
        self.loaded[lora_request.lora_int_id] = lora_request
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        return self.loaded.pop(lora_id, None) is not None


async def test_in_process_load_adds_a_lora_request_with_ids_from_one() -> None:
    engine = FakeLoraEngine()
    adapters = InProcessAdapters(engine, FakeLoRARequest, max_loras=2)
    await adapters.load_lora("sql", "/a/sql")
    await adapters.load_lora("chat", "/a/chat")
    assert engine.loaded == {
        1: FakeLoRARequest("sql", 1, "/a/sql"),
        2: FakeLoRARequest("chat", 2, "/a/chat"),
    }
    assert adapters.request_for("chat") is engine.loaded[2]


async def test_in_process_unload_removes_it_by_its_int_id() -> None:
    engine = FakeLoraEngine()
    adapters = InProcessAdapters(engine, FakeLoRARequest, max_loras=1)
    await adapters.load_lora("sql", "/a/sql")
    await adapters.unload_lora("sql")
    assert engine.loaded == {}
    with pytest.raises(EngineError, match="not loaded"):
        adapters.request_for("sql")


async def test_in_process_bad_path_is_an_engine_error() -> None:
    adapters = InProcessAdapters(FakeLoraEngine(), FakeLoRARequest, max_loras=1)
    with pytest.raises(EngineError, match="No adapter found"):
        await adapters.load_lora("x", "/missing/x")


async def test_an_engine_without_lora_refuses_loads_saying_how() -> None:
    adapters = InProcessAdapters(FakeLoraEngine(), None, max_loras=0)
    with pytest.raises(EngineError, match="--lora-modules"):
        await adapters.load_lora("x", "/a/x")


def _vllm_serve() -> tuple[httpx.AsyncClient, set[str]]:
    """A ``vllm serve`` stand-in answering its two adapter endpoints as serving_models.py."""
    held: set[str] = set()

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        name = body.get("lora_name")
        if request.url.path == "/v1/load_lora_adapter":
            if name in held:
                message = f"The lora adapter '{name}' has already been loaded."
                return httpx.Response(400, json={"message": message, "code": 400})
            held.add(name)
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        if name not in held:
            message = f"The lora adapter '{name}' cannot be found."
            return httpx.Response(404, json={"message": message, "code": 404})
        held.discard(name)
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle), base_url="http://vllm")
    return client, held


async def test_remote_load_and_unload_use_vllm_serve_endpoints_idempotently() -> None:
    client, held = _vllm_serve()
    async with client:
        adapters = RemoteAdapters(client)
        await adapters.load_lora("sql", "/a/sql")
        await adapters.load_lora("sql", "/a/sql")  # 400 "already been loaded": held, fine
        assert held == {"sql"}
        await adapters.unload_lora("sql")
        await adapters.unload_lora("sql")  # 404: not there, fine
        assert held == set()


async def test_remote_refusal_is_an_engine_error_with_vllms_words() -> None:
    def refuse(_: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"message": "LoRA rank 64 > max_lora_rank 16"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse), base_url="http://v") as c:
        with pytest.raises(EngineError, match="max_lora_rank"):
            await RemoteAdapters(c).load_lora("big", "/a/big")
