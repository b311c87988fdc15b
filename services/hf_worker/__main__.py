"""Run the transformers worker: ``python -m services.hf_worker [--help]``."""

from __future__ import annotations

import importlib.util

from services.hf_worker.config import HfWorkerConfig
from services.hf_worker.service import HfWorker
from shared.lifecycle import service_main


def missing_torch(config: HfWorkerConfig) -> str | None:
    """The engine needs torch and transformers."""
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return f"{' and '.join(missing)} not installed: pip install 'jetserve[hf]'"


def main(argv: list[str] | None = None) -> None:
    service_main(HfWorkerConfig, HfWorker, argv, preflight=missing_torch)


if __name__ == "__main__":
    main()
