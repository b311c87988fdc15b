"""Busy thresholds set per model at run time (``thresholds.py``) and the fraction check."""

from __future__ import annotations

import random

import pytest

from services.router.core import CoreSettings, RoutingCore
from services.router.load import BusyThresholds, is_busy
from services.router.thresholds import ModelThresholds, thresholds_of
from shared.errors import AllWorkersBusy
from shared.messages import (
    BusyThresholdsChanged,
    Generate,
    SamplingParams,
    WorkerCard,
    WorkerLoad,
)


def changed(model: str = "m", revision: int = 1, **values: float | None) -> BusyThresholdsChanged:
    return BusyThresholdsChanged(model=model, revision=revision, **values)  # type: ignore[arg-type]


class TestModelThresholds:
    def test_a_set_threshold_is_the_models(self) -> None:
        known = ModelThresholds()
        assert known.apply(changed(active_decode_blocks_threshold=0.5))
        assert known.overrides == {"m": BusyThresholds(decode_blocks_frac=0.5)}

    def test_an_older_revision_is_ignored(self) -> None:
        known = ModelThresholds()
        known.apply(changed(revision=5, active_prefill_tokens_threshold=10))
        assert not known.apply(changed(revision=4, active_prefill_tokens_threshold=99))
        assert known.overrides == {"m": BusyThresholds(prefill_tokens=10)}

    def test_the_same_revision_twice_is_taken_once(self) -> None:
        known = ModelThresholds()
        assert known.apply(changed(revision=3, active_decode_blocks_threshold=0.1))
        assert not known.apply(changed(revision=3, active_decode_blocks_threshold=0.1))

    def test_all_cleared_gives_the_model_back_the_settings(self) -> None:
        known = ModelThresholds()
        known.apply(changed(revision=1, active_decode_blocks_threshold=0.5))
        assert known.apply(changed(revision=2))
        assert known.overrides == {}

    def test_a_stale_read_after_a_clear_does_not_bring_it_back(self) -> None:
        known = ModelThresholds()
        known.apply(changed(revision=2))
        assert not known.apply_all([changed(revision=1, active_decode_blocks_threshold=0.5)])
        assert known.overrides == {}

    def test_models_are_independent(self) -> None:
        known = ModelThresholds()
        known.apply_all(
            [
                changed("a", 1, active_prefill_tokens_threshold_frac=0.25),
                changed("b", 2, active_decode_blocks_threshold=0.9),
            ]
        )
        assert set(known.overrides) == {"a", "b"}

    def test_thresholds_of_maps_every_field(self) -> None:
        message = changed(
            active_decode_blocks_threshold=0.8,
            active_prefill_tokens_threshold=100,
            active_prefill_tokens_threshold_frac=0.5,
        )
        assert thresholds_of(message) == BusyThresholds(
            decode_blocks_frac=0.8, prefill_tokens=100, prefill_tokens_frac=0.5
        )


class TestFraction:
    def test_busy_past_the_fraction_of_kv_capacity(self) -> None:
        thresholds = BusyThresholds(prefill_tokens_frac=0.5)
        report = WorkerLoad(worker_id="w", prefill_tokens=600)
        assert is_busy(thresholds, report=report, tracked_prefill_tokens=0, kv_capacity_tokens=1000)

    def test_not_busy_under_it(self) -> None:
        thresholds = BusyThresholds(prefill_tokens_frac=0.5)
        assert not is_busy(
            thresholds, report=None, tracked_prefill_tokens=500, kv_capacity_tokens=1000
        )

    def test_no_capacity_known_turns_the_check_off(self) -> None:
        thresholds = BusyThresholds(prefill_tokens_frac=0.0)
        assert not is_busy(thresholds, report=None, tracked_prefill_tokens=5)

    def test_the_fraction_alone_enables_the_checks(self) -> None:
        assert BusyThresholds(prefill_tokens_frac=0.1).enabled


class TestCore:
    def test_a_models_thresholds_replace_the_settings_for_it(self) -> None:
        core = RoutingCore(CoreSettings(mode="kv"))
        card = WorkerCard(worker_id="w1", model="m", kv_blocks=10, block_size=16)
        core.reports.update(WorkerLoad(worker_id="w1", kv_used_blocks=2, kv_total_blocks=10), 0.0)
        gen = Generate(
            request_id="r1",
            model="m",
            token_ids=(1, 2, 3),
            sampling=SamplingParams(),
            stream_to="s",
        )
        core.decide(gen, [card], now=0.0, rng=random.Random(0))  # no thresholds: routed
        core.busy_by_model = {"m": BusyThresholds(decode_blocks_frac=0.1)}
        with pytest.raises(AllWorkersBusy):
            core.decide(gen, [card], now=0.0, rng=random.Random(0))

    def test_other_models_keep_the_settings(self) -> None:
        core = RoutingCore(CoreSettings(mode="kv"))
        core.busy_by_model = {"other": BusyThresholds(decode_blocks_frac=0.0)}
        assert core.busy_of("m") == BusyThresholds()
