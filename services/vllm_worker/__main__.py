"""Run the vLLM worker: ``python -m services.vllm_worker [--help]``."""

from __future__ import annotations

import importlib.util

from services.vllm_worker.config import VllmWorkerConfig
from services.vllm_worker.service import VllmWorker
from shared.lifecycle import service_main


def missing_vllm(config: VllmWorkerConfig) -> str | None:
    """In-process mode needs vLLM itself; remote mode does not."""
    if config.remote or importlib.util.find_spec("vllm") is not None:
        return None
    return (
        "in-process mode needs vLLM: pip install 'jetserve[vllm]' "
        "(or put the worker in front of a running `vllm serve` with --engine-url)"
    )


def main(argv: list[str] | None = None) -> None:
    service_main(VllmWorkerConfig, VllmWorker, argv, preflight=missing_vllm)


if __name__ == "__main__":
    main()
