"""A worker that cannot run here says why in one line before it connects (``preflight``)."""

from __future__ import annotations

import importlib.util

import pytest

from services.hf_worker.__main__ import missing_torch
from services.hf_worker.config import HfWorkerConfig
from services.vllm_worker.__main__ import missing_vllm
from services.vllm_worker.config import VllmWorkerConfig


@pytest.fixture
def nothing_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)


@pytest.mark.usefixtures("nothing_installed")
def test_in_process_vllm_needs_vllm() -> None:
    problem = missing_vllm(VllmWorkerConfig())
    assert problem is not None
    assert "pip install 'jetserve[vllm]'" in problem
    assert "--engine-url" in problem


@pytest.mark.usefixtures("nothing_installed")
def test_remote_vllm_needs_no_vllm() -> None:
    assert missing_vllm(VllmWorkerConfig(engine_url="http://127.0.0.1:8000")) is None


@pytest.mark.usefixtures("nothing_installed")
def test_the_transformers_worker_needs_torch_and_transformers() -> None:
    assert missing_torch(HfWorkerConfig()) == (
        "torch and transformers not installed: pip install 'jetserve[hf]'"
    )
