"""Run the formatter: ``python -m services.formatter [--help]``."""

from __future__ import annotations

from services.formatter.config import FormatterConfig
from services.formatter.service import build_service
from shared.bus import run
from shared.lifecycle import run_service
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = FormatterConfig.from_cli(argv)
    configure_logging(service="formatter", level=config.log_level, fmt=config.log_format)
    run(lambda: run_service(config, "formatter", lambda nc: build_service(config, nc)))


if __name__ == "__main__":
    main()
