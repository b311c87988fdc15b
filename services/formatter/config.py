"""Formatter configuration: its settings table (``JETSERVE_FORMATTER_*``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from shared.config import CommonConfig, computed_setting, setting
from shared.subjects import check_token


def _random_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True, slots=True, kw_only=True)
class FormatterConfig(CommonConfig):
    """Everything one formatter instance needs."""

    SERVICE = "formatter"
    DESCRIPTION = "Detokenize worker output into OpenAI responses."

    shutdown_grace_s: float = setting(
        30.0, "On SIGTERM, how long in-flight streams may take before they are failed", ge=0
    )
    formatter_id: str = computed_setting(
        _random_id,
        "Instance id, the subject token workers send token batches to (empty = random)",
        default_doc="random",
        per_instance=True,
    )
    idle_timeout_s: float = setting(
        60.0, "Fail a request with 504 (and cancel it) after this long without a token batch", gt=0
    )

    def __post_init__(self) -> None:
        # Not super(): slotted dataclasses are rebuilt, which breaks zero-argument super().
        CommonConfig.__post_init__(self)
        check_token(self.formatter_id, "--formatter-id / JETSERVE_FORMATTER_ID")
