"""Run the mock embedding worker: ``python -m services.embedder [--help]``."""

from __future__ import annotations

from services.embedder.config import EmbedderConfig
from services.embedder.service import build_service
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(EmbedderConfig, build_service, argv)


if __name__ == "__main__":
    main()
