"""Pure: LoRA adapters as the gateway sees them (decision 031).

- Which adapters the live workers hold, and each one's base model (``/v1/models``' ``parent``),
  from their cards; a request whose ``model`` names an adapter goes to the preprocessors as its
  base model with the adapter in ``RoutingHints.lora_name`` (routers send it to holders only,
  the block hashes are the adapter's), and its answers name the adapter, as vLLM's do.
- vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` bodies (``lora_name``,
  ``lora_path``; ``lora_int_id`` is accepted and ignored on unload, as names are the ids here)
  and answers: a plain-text success line, 400 for an adapter every target already holds, 404
  for one nobody holds. JetServe's extensions: ``model`` (the base model; needed only when
  several are served) and ``worker_ids`` (only these workers; default: every live worker of
  the model).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from shared.errors import InvalidRequest, ModelNotFound, NotFound
from shared.messages import LoraAdapterAnswer, Preprocess, RoutingHints, WorkerCard

S = TypeVar("S", bound=msgspec.Struct)

__all__ = [
    "AdapterInfo",
    "LoadLoraAdapterBody",
    "UnloadLoraAdapterBody",
    "adapters_of",
    "for_adapter",
    "load_outcome",
    "parse_load",
    "parse_unload",
    "targets",
    "unload_outcome",
]


class LoadLoraAdapterBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``LoadLoRAAdapterRequest`` (+ ``model``, ``worker_ids``)."""

    lora_name: str = ""
    lora_path: str = ""
    load_inplace: bool = False
    model: str | None = None
    worker_ids: list[str] | None = None


class UnloadLoraAdapterBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``UnloadLoRAAdapterRequest`` (+ ``model``, ``worker_ids``)."""

    lora_name: str = ""
    lora_int_id: int | None = None
    model: str | None = None
    worker_ids: list[str] | None = None


@dataclass(frozen=True, slots=True)
class AdapterInfo:
    """One adapter the live workers hold."""

    name: str
    parent: str
    path: str
    workers: tuple[str, ...]


def adapters_of(cards: Iterable[WorkerCard]) -> dict[str, AdapterInfo]:
    """Adapter name -> what the live ``cards`` say of it (the first holder's path)."""
    found: dict[str, AdapterInfo] = {}
    for card in sorted(cards, key=lambda c: c.worker_id):
        for adapter in card.loras:
            known = found.get(adapter.name)
            workers = (*known.workers, card.worker_id) if known else (card.worker_id,)
            parent = adapter.parent or card.model
            path = known.path if known else adapter.path
            found[adapter.name] = AdapterInfo(adapter.name, parent, path, workers)
    return found


def for_adapter(request: Preprocess, parent: str) -> Preprocess:
    """``request`` (whose ``model`` names an adapter) as its base model's, with the adapter in
    the routing hints."""
    hints = request.routing or RoutingHints()
    hints = msgspec.structs.replace(hints, lora_name=request.model)
    return msgspec.structs.replace(request, model=parent, routing=hints)


def parse_load(body: bytes) -> LoadLoraAdapterBody:
    """A load body, checked as vLLM checks it (400s name the field)."""
    parsed = _decode(body, LoadLoraAdapterBody)
    if not parsed.lora_name or not parsed.lora_path:
        raise InvalidRequest("Both 'lora_name' and 'lora_path' must be provided.")
    if parsed.load_inplace:
        raise InvalidRequest(
            "load_inplace is not supported: unload the adapter, then load it",
            param="load_inplace",
        )
    return parsed


def parse_unload(body: bytes) -> UnloadLoraAdapterBody:
    """An unload body (a name is needed: names are the adapters' ids here)."""
    parsed = _decode(body, UnloadLoraAdapterBody)
    if not parsed.lora_name:
        raise InvalidRequest("'lora_name' must be provided.", param="lora_name")
    return parsed


def targets(
    model: str | None,
    worker_ids: Sequence[str] | None,
    live: Mapping[str, Sequence[WorkerCard]],
) -> list[WorkerCard]:
    """The live workers a command goes to: those of ``model`` (the only model served when
    None), only ``worker_ids`` when given; raises for an unknown model or worker."""
    if model is None:
        if len(live) != 1:
            raise InvalidRequest(
                "several models are served: say which in 'model'" if live else "no live model",
                param="model",
            )
        model = next(iter(live))
    cards = list(live.get(model, ()))
    if not cards:
        raise ModelNotFound(model)
    serving = [c for c in cards if c.max_loras > 0]
    if worker_ids is not None:
        unknown = sorted(set(worker_ids) - {c.worker_id for c in cards})
        if unknown:
            raise InvalidRequest(
                f"not a live worker of {model}: {', '.join(unknown)}", param="worker_ids"
            )
        serving = [c for c in serving if c.worker_id in worker_ids]
    if not serving:
        raise InvalidRequest(f"no live worker of {model} serves LoRA adapters", param="model")
    return serving


def load_outcome(name: str, answers: Sequence[LoraAdapterAnswer]) -> str:
    """The success line, or the error every worker gave (400: all already held it)."""
    refused = [a for a in answers if not a.ok]
    if refused:
        raise InvalidRequest(f"{refused[0].worker_id}: {refused[0].message}")
    if answers and not any(a.changed for a in answers):
        raise InvalidRequest(f"The lora adapter '{name}' has already been loaded.")
    return f"Success: LoRA adapter '{name}' added successfully."


def unload_outcome(name: str, answers: Sequence[LoraAdapterAnswer]) -> str:
    """The success line; 404 when no worker held the adapter (as vLLM)."""
    if not any(a.changed for a in answers):
        raise NotFound(f"The lora adapter '{name}' cannot be found.")
    return f"Success: LoRA adapter '{name}' removed successfully."


def _decode(body: bytes, kind: type[S]) -> S:
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc)) from None
    except msgspec.DecodeError:
        raise InvalidRequest("The body is not valid JSON.") from None
