"""Run the mocker: ``python -m services.mocker [--help]``."""

from __future__ import annotations

from services.mocker.config import MockerConfig
from services.mocker.service import serve
from shared.bus import run
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = MockerConfig.from_cli(argv)
    configure_logging(service="mocker", level=config.log_level, fmt=config.log_format)
    run(lambda: serve(config))


if __name__ == "__main__":
    main()
