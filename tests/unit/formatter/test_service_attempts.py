"""The formatter's wiring acting on the attempt rules, on a fake connection (what it publishes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from services.formatter.config import FormatterConfig
from services.formatter.service import FormatterService
from services.formatter.tokenizer_cache import TokenizerCache
from shared import codec
from shared.messages import (
    Cancel,
    Generate,
    Migrated,
    ResponseChunk,
    TokenBatch,
)
from shared.model_dir import ensure_default_model_dir
from shared.subjects import Subjects
from tests.unit.migration_support import GEN, migratable_open

SUBJECTS = Subjects("t")
GATEWAY = "gw"
"""Where ``migratable_open`` sends the request's chunks."""
HELLO = (9707, 1879)


@dataclass
class FakeNc:
    """Keeps what is published, in order, as ``(subject, bytes)``."""

    sent: list[tuple[str, bytes]] = field(default_factory=list)

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "") -> None:
        self.sent.append((subject, payload))

    def on(self, subject: str) -> list[bytes]:
        return [payload for sent_to, payload in self.sent if sent_to == subject]


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    model_dir = ensure_default_model_dir(tmp_path_factory.mktemp("qwen3"))
    return (Path(model_dir) / "tokenizer.json").read_bytes()


async def opened(tokenizer_json: bytes, nc: FakeNc, *, limit: int) -> FormatterService:
    """A formatter (id ``f1``) with request ``r`` open: streaming, migratable ``limit`` times
    (0: not at all, so no ``Generate`` is kept, as the preprocessor does)."""

    async def fetch(_: str) -> bytes:
        return tokenizer_json

    tokenizers = TokenizerCache(fetch)
    await tokenizers.get("m")
    config = FormatterConfig(namespace="t", formatter_id="f1")
    service = FormatterService(config, nc, subjects=SUBJECTS, tokenizers=tokenizers)  # type: ignore[arg-type]
    await service.on_open_direct(migratable_open(GEN if limit else None, limit=limit, stream=True))
    return service


def batch(ids: tuple[int, ...], index: int = 0, **fields: Any) -> TokenBatch:
    return TokenBatch(request_id="r", token_ids=ids, index=index, worker_id="w1", **fields)


async def test_a_gap_cancels_the_attempt_then_routes_the_next_and_tells(
    tokenizer_json: bytes,
) -> None:
    nc = FakeNc()
    service = await opened(tokenizer_json, nc, limit=3)
    await service.on_stream(batch(HELLO))
    await service.on_stream(batch((11,), index=9))
    subjects = [subject for subject, _ in nc.sent]
    assert subjects == [GATEWAY, SUBJECTS.cancel, SUBJECTS.route, SUBJECTS.migrations]
    [cancel], [route], [notice] = (nc.on(s) for s in subjects[1:])
    assert codec.decode(cancel, Cancel) == Cancel(request_id="r", reason="migrated", worker_id="w1")
    generate = codec.decode(route, Generate)
    assert (generate.attempt, generate.token_ids, generate.stream_to) == (
        1,
        (1, 2, *HELLO),
        SUBJECTS.stream("f1", "r"),
    )
    migrated = codec.decode(notice, Migrated)
    assert (migrated.kind, migrated.reason, migrated.attempt) == ("ongoing", "batch_gap", 1)


async def test_a_worker_giving_up_a_request_that_may_not_move_ends_it_cancelled(
    tokenizer_json: bytes,
) -> None:
    nc = FakeNc()
    service = await opened(tokenizer_json, nc, limit=0)
    await service.on_stream(batch(HELLO, finish_reason="cancelled"))
    chunks = [codec.decode(data, ResponseChunk) for data in nc.on(GATEWAY)]
    assert [(c.seq, c.done, c.finish_reason) for c in chunks] == [(0, True, "cancelled")]
    assert service.in_flight == 0


async def test_a_worker_giving_up_at_the_migration_limit_ends_it_cancelled(
    tokenizer_json: bytes,
) -> None:
    """The emptied batch is formatted as it is, not judged again (it once recursed forever)."""
    nc = FakeNc()
    service = await opened(tokenizer_json, nc, limit=1)
    await service.on_stream(batch(HELLO, index=0, finish_reason="cancelled"))
    await service.on_stream(batch((11,), index=0, finish_reason="cancelled", attempt=1))
    chunks = [codec.decode(data, ResponseChunk) for data in nc.on(GATEWAY)]
    assert [(c.seq, c.done, c.finish_reason) for c in chunks] == [
        (0, False, None),
        (1, False, None),
        (2, True, "cancelled"),
    ]
    assert (len(nc.on(SUBJECTS.route)), service.in_flight) == (1, 0)
