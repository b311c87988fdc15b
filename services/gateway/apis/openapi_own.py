"""Response shapes of the gateway's own endpoints (models, health), for ``/openapi.json``.

Chat and completion bodies are ``shared.api_objects``' Structs, the ones the formatter encodes.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class ModelWorkers(msgspec.Struct, kw_only=True):
    """``/v1/models``' extension ``jetserve``: who serves the model right now."""

    workers: dict[str, int]
    """Live workers by role, every role named: ``{"both": 0, "prefill": 2, "decode": 2}``
    (``both``: aggregated; ``prefill`` and ``decode``: disaggregated serving)."""
    dp_ranks: int
    """Data-parallel ranks of those workers together: the routing targets (a worker with
    ``--data-parallel-size 2`` counts two)."""


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    jetserve: ModelWorkers
    """JetServe's extension: the model's live workers by role and their data-parallel ranks."""


class ModelList(msgspec.Struct, kw_only=True):
    """``GET /v1/models``: the models with a live worker."""

    object: Literal["list"] = "list"
    data: list[Model]


class Health(msgspec.Struct, kw_only=True):
    """``GET /health``: 200 when ready, 503 otherwise (with ``reason``)."""

    status: Literal["ok", "unavailable", "shutting_down"]
    models: list[str]
    reason: Literal["shutting_down", "nats_disconnected", "no_live_model"] | None = None


class Live(msgspec.Struct, kw_only=True):
    """``GET /live``: the process answers."""

    status: Literal["ok"] = "ok"
