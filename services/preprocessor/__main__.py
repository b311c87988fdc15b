"""``python -m services.preprocessor``: read config, configure logging, serve."""

from __future__ import annotations

from services.preprocessor.config import PreprocessorConfig
from services.preprocessor.service import build_preprocessor
from shared.bus import run
from shared.lifecycle import run_service
from shared.logging import configure_logging


def cli(argv: list[str] | None = None) -> None:
    config = PreprocessorConfig.from_cli(argv)
    configure_logging(service="preprocessor", level=config.log_level, fmt=config.log_format)
    run(lambda: run_service(config, "preprocessor", lambda nc: build_preprocessor(config, nc)))


if __name__ == "__main__":
    cli()
