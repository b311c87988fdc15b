"""Markers by folder: ``pytest -m "not integration and not e2e"`` is the fast loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_TESTS = Path(__file__).parent

collect_ignore = [] if os.environ.get("JETSERVE_ENGINE_TESTS") else ["engines", "vllm_real"]
"""Real engines (torch, vLLM) need their extras: ``make test-engines`` / ``make test-vllm`` set
``JETSERVE_ENGINE_TESTS`` and install them; ``make test`` runs without."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.path)).relative_to(_TESTS).parts
        if parts and parts[0] in ("integration", "e2e"):
            item.add_marker(parts[0])
