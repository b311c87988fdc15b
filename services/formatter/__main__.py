"""Run the formatter: ``python -m services.formatter [--help]``."""

from __future__ import annotations

from services.formatter.config import FormatterConfig
from services.formatter.service import serve
from shared.bus import run
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = FormatterConfig.from_cli(argv)
    configure_logging(service="formatter", level=config.log_level, fmt=config.log_format)
    run(lambda: serve(config))


if __name__ == "__main__":
    main()
