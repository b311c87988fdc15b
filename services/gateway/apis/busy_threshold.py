"""Pure: ``POST /busy_threshold`` bodies and the answers of both methods, as Dynamo's frontend
has them (``lib/llm/src/http/service/busy_threshold.rs``).

``POST {"model": m}`` (no threshold named) answers the model's current thresholds. Naming any
of ``active_decode_blocks_threshold`` (0..1, used KV blocks / total),
``active_prefill_tokens_threshold`` (a token count) and ``active_prefill_tokens_threshold_frac``
(a fraction of the worker's KV capacity in tokens) *sets* the model's thresholds to exactly
those given, as Dynamo replaces the model's configuration: one omitted or ``null`` is off.
Every one ``null`` clears the model's entry, and the routers' own ``--active-*`` settings apply
to it again (Dynamo answers such a body with the current values instead: there, nothing can be
cleared). ``GET`` lists every model with a threshold set: ``{"thresholds": [...]}``. Bad bodies
are 400s naming the field.
"""

from __future__ import annotations

import re
from typing import Annotated, TypeVar

import msgspec
from msgspec import UNSET, Meta, UnsetType

from services.gateway.apis.bodies import invalid
from services.gateway.apis.openai_types import INT64_MAX
from shared.busy_thresholds import is_cleared
from shared.errors import InvalidRequest
from shared.messages import BusyThresholdsChanged

T = TypeVar("T", int, float)
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]
Tokens = Annotated[int, Meta(ge=0, le=INT64_MAX)]
CapacityFraction = Annotated[float, Meta(ge=0.0, le=100.0)]
ModelName = Annotated[str, Meta(min_length=1, max_length=1024)]


class BusyThresholdRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: ModelName
    active_decode_blocks_threshold: Fraction | UnsetType | None = UNSET
    active_prefill_tokens_threshold: Tokens | UnsetType | None = UNSET
    active_prefill_tokens_threshold_frac: CapacityFraction | UnsetType | None = UNSET

    @property
    def is_setting(self) -> bool:
        """Whether the body names a threshold (else it asks for the current ones)."""
        return not (
            self.active_decode_blocks_threshold is UNSET
            and self.active_prefill_tokens_threshold is UNSET
            and self.active_prefill_tokens_threshold_frac is UNSET
        )

    def to_message(self) -> BusyThresholdsChanged:
        """The thresholds this body sets (omitted ones off)."""
        return BusyThresholdsChanged(
            model=self.model,
            active_decode_blocks_threshold=_value(self.active_decode_blocks_threshold),
            active_prefill_tokens_threshold=_value(self.active_prefill_tokens_threshold),
            active_prefill_tokens_threshold_frac=_value(self.active_prefill_tokens_threshold_frac),
        )


class BusyThresholdResponse(msgspec.Struct, kw_only=True):
    """One model's thresholds (``null``: off, or the routers' own setting)."""

    model: str
    active_decode_blocks_threshold: float | None = None
    active_prefill_tokens_threshold: int | None = None
    active_prefill_tokens_threshold_frac: float | None = None


class BusyThresholdList(msgspec.Struct, kw_only=True):
    thresholds: list[BusyThresholdResponse]


_DECODER = msgspec.json.Decoder(BusyThresholdRequest)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<field>[^`]+)`")


def parse(body: bytes) -> BusyThresholdRequest:
    """A ``POST /busy_threshold`` body; every way it can be wrong is an ``InvalidRequest``."""
    try:
        return _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if unknown := _UNKNOWN.match(str(exc)):  # Dynamo's older `threshold`, a typo
            name = unknown["field"]
            raise InvalidRequest(
                f"Unrecognized field `{name}`: the thresholds are "
                "`active_decode_blocks_threshold`, `active_prefill_tokens_threshold` and "
                "`active_prefill_tokens_threshold_frac`.",
                param=name,
            ) from None
        raise invalid(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None


def answer(model: str, stored: BusyThresholdsChanged | None) -> bytes:
    """The ``POST`` answer: the model's thresholds as they now are."""
    return msgspec.json.encode(_response(model, stored))


def listing(stored: list[BusyThresholdsChanged]) -> bytes:
    """The ``GET`` answer: every model with a threshold set, by name."""
    shown = sorted((m for m in stored if not is_cleared(m)), key=lambda m: m.model)
    return msgspec.json.encode(BusyThresholdList(thresholds=[_response(m.model, m) for m in shown]))


def _response(model: str, stored: BusyThresholdsChanged | None) -> BusyThresholdResponse:
    if stored is None:
        return BusyThresholdResponse(model=model)
    return BusyThresholdResponse(
        model=model,
        active_decode_blocks_threshold=stored.active_decode_blocks_threshold,
        active_prefill_tokens_threshold=stored.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac=stored.active_prefill_tokens_threshold_frac,
    )


def _value(value: T | UnsetType | None) -> T | None:
    return None if isinstance(value, UnsetType) else value
