"""The kit's ``loadgen.py`` with prompt lengths spread over a range, and pooled token gaps kept.

    <kit venv>/bin/python bench/loadgen_spread.py /path/to/loadgen.py --prompt-words-max N \\
        --prompt-words M [loadgen options...]

``loadgen.py`` gives every request ``--prompt-words`` words. Here request ``i`` gets between
``--prompt-words`` and ``--prompt-words-max`` words (both included), the count drawn by the
kit's own SplitMix64 generator keyed on (``--seed``, ``SPREAD_STREAM``, ``i``): the same
options give the same prompts on any server and Python, and ``prompts_sha256`` (recomputed over
the spread prompts) shows it. The words are the first ones of the prompt ``loadgen.py`` makes
with ``--prompt-words-max`` words: its generator draws them one after another, so that is the
prompt it would make with that many. Warm-up prompts get ``--prompt-words`` words.

The summary gains ``prompt_words_max``, the pooled chunk-to-chunk gaps' p99.9 and maximum
(``chunk_gap_ms_p999``, ``chunk_gap_ms_max``: a decode step stalled by another request's
prefill shows there, where a request's mean ITL dilutes it over its tokens), and ``samples``
(``bench.loadgen_samples``) with ``gap_ms``, the pooled gaps bounded like the others.
Requests, timing and every other figure are the kit's own. Standard library only: it runs under
the kit venv's python, where JetServe is not installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run by path: make ``bench`` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen_samples import load_loadgen
from bench.samples import bounded

SPREAD_STREAM = 5
"""The generator stream of the word counts; ``loadgen.py`` uses 1 to 4 (prefix, user, assign,
warm-up), so the prompts' words are the ones it would draw."""
Prompt = tuple[str | None, str]
"""(system prefix or ``None``, user text), as ``loadgen.build_prompts`` returns them."""


def first_words(user: str, count: int) -> str:
    """``loadgen.py``'s user text (``"request 7: w1 w2 …"``) cut to its first ``count`` words
    after the tag."""
    tag, _, words = user.partition(": ")
    return f"{tag}: " + " ".join(words.split(" ")[:count])


def word_counts(below: Callable[[int, int], int], requests: int, low: int, high: int) -> list[int]:
    """Words of each request: ``low + below(i, high - low + 1)``, where ``below(i, n)`` is a
    draw in ``[0, n)`` from request ``i``'s generator."""
    return [low + below(i, high - low + 1) for i in range(requests)]


def digest(warmup: Sequence[Prompt], work: Sequence[Prompt]) -> str:
    """The ``prompts_sha256`` of the spread prompts."""
    return hashlib.sha256(json.dumps([list(work), list(warmup)]).encode()).hexdigest()


def spread(module: ModuleType, high: int) -> None:
    """Wrap ``module``'s ``build_prompts`` (spread lengths) and ``summarize`` (gap figures)."""
    build, summarize = module.build_prompts, module.summarize

    def build_prompts(args: argparse.Namespace) -> tuple[list[Prompt], list[Prompt], str]:
        low = args.prompt_words
        if high < low:
            raise SystemExit(f"--prompt-words-max {high} is below --prompt-words {low}")
        warmup, work, _ = build(argparse.Namespace(**{**vars(args), "prompt_words": high}))
        counts = word_counts(
            lambda i, n: int(module._Stream(args.seed, SPREAD_STREAM, i).below(n)),
            len(work),
            low,
            high,
        )
        work = [(p, first_words(u, n)) for (p, u), n in zip(work, counts, strict=True)]
        warmup = [(p, first_words(u, low)) for p, u in warmup]
        return warmup, work, digest(warmup, work)

    def summarize_gaps(args: Any, model: str, wall: float, results: list[dict[str, Any]]) -> Any:
        out = summarize(args, model, wall, results)
        gaps = [g for r in results if r["ok"] for g in r["gaps"]]
        out["prompt_words_max"] = high
        out["chunk_gap_ms_p999"] = round(module.pct(gaps, 99.9) * 1000.0, 3)
        out["chunk_gap_ms_max"] = round(max(gaps, default=float("nan")) * 1000.0, 3)
        out["samples"]["gap_ms"] = bounded(gaps)
        return out

    module.__dict__["build_prompts"] = build_prompts  # main() looks both up at call time
    module.__dict__["summarize"] = summarize_gaps


def main(argv: list[str]) -> int:
    """Run ``loadgen.py`` (``argv[0]``) with the rest of ``argv`` but ``--prompt-words-max``."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--prompt-words-max", type=int, required=True)
    ours, rest = parser.parse_known_args(argv[1:])
    module = load_loadgen(Path(argv[0]))
    spread(module, ours.prompt_words_max)
    sys.argv = [argv[0], *rest]
    return int(module.main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
