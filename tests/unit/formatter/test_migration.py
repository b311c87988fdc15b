"""``next_attempt``: the Generate that routes a request again, or why it may not move."""

from __future__ import annotations

import msgspec

from services.formatter.migration import NotMigrated, next_attempt
from shared.messages import Generate, SamplingParams
from tests.unit.migration_support import migratable_open

GEN = Generate(
    request_id="r",
    model="m",
    token_ids=(1, 2, 3),
    sampling=SamplingParams(max_tokens=10, min_tokens=4, seed=9),
    stream_to="",
    reply_to="gw.r",
)


def test_generated_tokens_are_appended_and_the_budget_reduced() -> None:
    attempt = next_attempt(migratable_open(GEN, limit=2), [7, 8, 9], 0, "fmt.x.r")
    assert attempt == msgspec.structs.replace(
        GEN,
        token_ids=(1, 2, 3, 7, 8, 9),
        sampling=SamplingParams(max_tokens=7, min_tokens=1, seed=9),
        resumed_tokens=3,
        stream_to="fmt.x.r",
        attempt=1,
    )


def test_min_tokens_never_goes_below_zero() -> None:
    attempt = next_attempt(migratable_open(GEN, limit=2), [5] * 6, 0, "s")
    assert isinstance(attempt, Generate)
    assert attempt.sampling.min_tokens == 0


def test_before_any_token_the_request_is_sent_as_it_was() -> None:
    attempt = next_attempt(migratable_open(GEN, limit=2), [], 1, "s")
    assert attempt == msgspec.structs.replace(GEN, stream_to="s", attempt=2)


def test_off_without_a_generate_or_a_limit() -> None:
    assert isinstance(next_attempt(migratable_open(None), [], 0, "s"), NotMigrated)
    assert isinstance(next_attempt(migratable_open(GEN, limit=0), [], 0, "s"), NotMigrated)


def test_the_limit_counts_migrations_already_made() -> None:
    assert isinstance(next_attempt(migratable_open(GEN, limit=2), [], 1, "s"), Generate)
    refused = next_attempt(migratable_open(GEN, limit=2), [], 2, "s")
    assert refused == NotMigrated("the migration limit (2) is reached")


def test_max_seq_len_counts_prompt_and_generated_tokens() -> None:
    assert isinstance(
        next_attempt(migratable_open(GEN, max_seq_len=6), [1, 2, 3], 0, "s"), Generate
    )
    assert isinstance(
        next_attempt(migratable_open(GEN, max_seq_len=5), [1, 2, 3], 0, "s"), NotMigrated
    )


def test_nothing_left_to_generate_is_not_migrated() -> None:
    assert isinstance(next_attempt(migratable_open(GEN, limit=2), [1] * 10, 0, "s"), NotMigrated)
