"""Run the mocker: ``python -m services.mocker [--help]``."""

from __future__ import annotations

from services.mocker.config import MockerConfig
from services.mocker.service import Mocker
from shared.bus import run
from shared.lifecycle import run_service
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = MockerConfig.from_cli(argv)
    configure_logging(service="mocker", level=config.log_level, fmt=config.log_format)
    run(lambda: run_service(config, "mocker", lambda nc: Mocker(config, nc)))


if __name__ == "__main__":
    main()
