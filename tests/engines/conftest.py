"""Fixtures of the engine tests: a tiny random-weight Qwen3 model directory (2 layers, hidden 64)
with the real Qwen3 tokenizer files, so the whole stack can serve it.

``make test-engines`` installs ``.[hf]`` (torch, transformers) first; in a plain ``make test``
without them, the modules that need torch are skipped at import (``pytest.importorskip``).
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.cli.stack import Stack
from shared.model_dir import TINY_QWEN3, ensure_default_model_dir
from tests.e2e.conftest import running_stack

MODEL = "tiny-qwen3"
SEED = 5
"""The random weights' seed: every worker of a stack builds the same model."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_default_model_dir(tmp_path_factory.mktemp("tiny-qwen3"), TINY_QWEN3)


@contextlib.contextmanager
def hf_stack(run_dir: Path, model_dir: Path, *, workers: int, max_num_seqs: int) -> Iterator[Stack]:
    """The whole stack (``jetserve up --engine hf``) with ``workers`` transformers workers, each
    the seeded random tiny model on the CPU."""
    worker_args = [
        *("--random-weights", "--device", "cpu", "--seed", str(SEED)),
        *("--block-size", "16", "--num-blocks", "256", "--max-num-seqs", str(max_num_seqs)),
        *("--tool-call-parser", "none", "--reasoning-parser", "none"),
    ]
    with running_stack(
        run_dir,
        model_dir,
        ready_timeout_s=120,
        workers=workers,
        engine="hf",
        model_name=MODEL,
        mocker_args=shlex.join(worker_args),
    ) as stack:
        yield stack
