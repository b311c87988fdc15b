"""Run the mock media worker: ``python -m services.media [--help]``."""

from __future__ import annotations

from services.media.config import MediaConfig
from services.media.service import build_service
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(MediaConfig, build_service, argv)


if __name__ == "__main__":
    main()
