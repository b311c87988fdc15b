"""Response shapes of the gateway's own endpoints (models, health), for ``/openapi.json``.

Chat and completion bodies are ``shared.api_objects``' Structs, the ones the formatter encodes.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


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
