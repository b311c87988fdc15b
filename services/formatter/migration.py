"""Request migration (decision 017): the ``Generate`` that routes a request again after its
worker was lost, or why it cannot be. Pure.

The new attempt carries the original prompt with every token generated so far appended,
``max_tokens`` (and ``min_tokens``) reduced by as many, and ``resumed_tokens`` saying how many
of the prompt's ids were generated, so the client's stream goes on where it stopped and usage
counts each token once. Always built from the original ``Generate`` (``StreamOpen.generate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from shared.messages import Generate, StreamOpen

RETRYABLE_CODES = frozenset({"shutting_down", "worker_busy"})
"""``RequestFailed`` codes from a worker that mean "try another one" (before any token)."""


@dataclass(frozen=True, slots=True)
class NotMigrated:
    """Why a request whose worker was lost is failed instead of routed again."""

    reason: str


def next_attempt(
    open_: StreamOpen, generated: Sequence[int], migrations: int, stream_to: str
) -> Generate | NotMigrated:
    """The ``Generate`` of attempt ``migrations + 1``, or why there is none."""
    gen = open_.generate
    if gen is None or open_.migration_limit <= 0:
        return NotMigrated("migration is off")
    if migrations >= open_.migration_limit:
        return NotMigrated(f"the migration limit ({open_.migration_limit}) is reached")
    done = len(generated)
    left = gen.sampling.max_tokens - done
    if left < 1:
        return NotMigrated("no tokens are left to generate")
    max_seq_len = open_.migration_max_seq_len
    if max_seq_len and len(gen.token_ids) + done > max_seq_len:
        return NotMigrated(f"the sequence is longer than {max_seq_len} tokens")
    sampling = msgspec.structs.replace(
        gen.sampling, max_tokens=left, min_tokens=max(0, gen.sampling.min_tokens - done)
    )
    return msgspec.structs.replace(
        gen,
        token_ids=(*gen.token_ids, *generated),
        sampling=sampling,
        resumed_tokens=done,
        stream_to=stream_to,
        attempt=migrations + 1,
    )
