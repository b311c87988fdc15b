"""The kit's ``loadgen.py`` run unchanged, its summary extended with per-request samples.

    <kit venv>/bin/python bench/loadgen_samples.py /path/to/loadgen.py [loadgen options...]

The kit's client prints percentiles only; this loads it as a module, wraps its ``summarize``
to add ``samples`` (``bench.samples.latency_samples``: each request's TTFT, and its ITL as the
kit computes it) and calls its ``main``: the requests, timing and output are the kit's own.
Runs under the kit venv's python, where JetServe is not installed: standard library only.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

if __package__ in (None, ""):  # run by path: make ``bench`` importable from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.samples import latency_samples


def request_samples(results: list[dict[str, Any]]) -> dict[str, object]:
    """Samples of the successful requests in ``loadgen.py``'s result records; ITL as its
    ``summarize`` computes it: (e2e - TTFT) / (tokens - 1), tokens from usage else chunks."""
    ok = [r for r in results if r["ok"]]
    itl = []
    for r in ok:
        tokens = r["completion_tokens"] if r["completion_tokens"] is not None else r["chunks"]
        if tokens and tokens > 1:
            itl.append((r["e2e"] - r["ttft"]) / (tokens - 1))
    return latency_samples((r["ttft"] for r in ok), itl)


def load_loadgen(path: Path) -> ModuleType:
    """``loadgen.py`` as a module, with ``summarize`` wrapped to add ``samples``."""
    spec = importlib.util.spec_from_file_location("loadgen", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original: Callable[..., dict[str, Any]] = module.summarize

    def summarize(args: Any, model: str, wall: float, results: list[dict[str, Any]]) -> Any:
        return {**original(args, model, wall, results), "samples": request_samples(results)}

    module.__dict__["summarize"] = summarize  # main() looks it up at call time
    return module


def main(argv: list[str]) -> int:
    """Run ``loadgen.py`` (``argv[0]``) with the rest of ``argv`` as its command line."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    module = load_loadgen(Path(argv[0]))
    sys.argv = [argv[0], *argv[1:]]
    return int(module.main())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
