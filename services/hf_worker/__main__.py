"""Run the transformers worker: ``python -m services.hf_worker [--help]``."""

from __future__ import annotations

from services.hf_worker.config import HfWorkerConfig
from services.hf_worker.service import HfWorker
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(HfWorkerConfig, HfWorker, argv)


if __name__ == "__main__":
    main()
