"""Run the vLLM worker: ``python -m services.vllm_worker [--help]``."""

from __future__ import annotations

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.service import VllmWorker
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(VllmWorkerConfig, VllmWorker, argv)


if __name__ == "__main__":
    main()
