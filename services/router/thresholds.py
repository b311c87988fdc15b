"""Per-model busy thresholds set at run time (``POST /busy_threshold``) over the router's own
``--active-*`` settings. Pure: messages in, thresholds out.

A model's thresholds come from ``BusyThresholdsChanged``, as the gateway broadcast it and as the
busy-thresholds KV bucket holds it (read at start). They *replace* the router's settings for
that model, as Dynamo's ``POST /busy_threshold`` replaces the model's configuration: a threshold
left ``None`` there is off. A message whose three thresholds are ``None`` (the key deleted)
gives the model back the router's settings. Each model keeps the highest bucket revision seen,
so a broadcast and the read at start may arrive in either order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from services.router.load import BusyThresholds
from shared.messages import BusyThresholdsChanged


def thresholds_of(message: BusyThresholdsChanged) -> BusyThresholds | None:
    """The thresholds a message sets (``None``: it clears the model's)."""
    found = BusyThresholds(
        decode_blocks_frac=message.active_decode_blocks_threshold,
        prefill_tokens=message.active_prefill_tokens_threshold,
        prefill_tokens_frac=message.active_prefill_tokens_threshold_frac,
    )
    return found if found.enabled else None


class ModelThresholds:
    """The thresholds set per model, each with the bucket revision it came with."""

    __slots__ = ("_by_model",)

    def __init__(self) -> None:
        self._by_model: dict[str, tuple[int, BusyThresholds | None]] = {}

    def apply(self, message: BusyThresholdsChanged) -> bool:
        """Take ``message`` unless its model has one of this revision or newer; True if taken."""
        known = self._by_model.get(message.model)
        if known is not None and known[0] >= message.revision:
            return False
        self._by_model[message.model] = (message.revision, thresholds_of(message))
        return True

    def apply_all(self, messages: Iterable[BusyThresholdsChanged]) -> bool:
        """``apply`` each (the bucket's contents); True if any was taken."""
        return any([self.apply(m) for m in messages])  # every one, not up to the first

    @property
    def overrides(self) -> Mapping[str, BusyThresholds]:
        """Model -> its thresholds, for the models that have some set (a fresh mapping)."""
        return {model: t for model, (_, t) in self._by_model.items() if t is not None}
