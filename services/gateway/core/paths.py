"""The HTTP paths the gateway serves, from its settings (``--chat-path``, …; Dynamo's
``DYN_HTTP_SVC_*_PATH`` env names work too): the one place their defaults are written (the
settings, the metrics' default labels and the OpenAPI document read them here). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.gateway.config import GatewayConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Paths:
    """Every route's path; the defaults are the OpenAI / Anthropic / Dynamo ones."""

    chat: str = "/v1/chat/completions"
    completions: str = "/v1/completions"
    embeddings: str = "/v1/embeddings"
    responses: str = "/v1/responses"
    messages: str = "/v1/messages"
    count_tokens: str = "/v1/messages/count_tokens"
    images: str = "/v1/images/generations"
    videos: str = "/v1/videos/generations"
    models: str = "/v1/models"
    health: str = "/health"
    live: str = "/live"
    metrics: str = "/metrics"
    busy_threshold: str = "/busy_threshold"
    load_lora_adapter: str = "/v1/load_lora_adapter"
    unload_lora_adapter: str = "/v1/unload_lora_adapter"

    @classmethod
    def of(cls, config: GatewayConfig) -> Paths:
        """The paths ``config`` serves: each field from its ``<field>_path`` setting."""
        return cls(**{name: getattr(config, f"{name}_path") for name in cls.__slots__})

    @property
    def compact(self) -> str:
        """The Responses API's compaction, under its path (as OpenAI's API has it)."""
        return f"{self.responses}/compact"

    @property
    def asks(self) -> frozenset[str]:
        """Inference that Litestar serves (request/reply): admitted like the relayed paths."""
        return frozenset({self.embeddings, self.images, self.videos, self.compact})

    @property
    def protected(self) -> frozenset[str]:
        """Paths that need an API key when keys are set: inference and the model list; an
        entry ending in ``/`` protects every path under it (stored Responses turns)."""
        return self.all() - self.probes | {self.models, f"{self.responses}/"}

    @property
    def probes(self) -> frozenset[str]:
        """Paths orchestrators and scrapers poll: their access line is debug, not info."""
        return frozenset({self.health, self.live, self.metrics, self.models})

    def all(self) -> frozenset[str]:
        """Every path served (the metrics' ``endpoint`` labels; anything else is ``other``)."""
        return frozenset(getattr(self, name) for name in self.__slots__)
