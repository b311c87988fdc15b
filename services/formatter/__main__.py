"""Run the formatter: ``python -m services.formatter [--help]``."""

from __future__ import annotations

from services.formatter.config import FormatterConfig
from services.formatter.service import build_service
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(FormatterConfig, build_service, argv)


if __name__ == "__main__":
    main()
