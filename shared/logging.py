"""structlog set-up: one JSON object per line with ``service`` and the bound ``request_id``."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(*, service: str, level: str = "INFO", fmt: str = "auto") -> None:
    """Configure structlog (and stdlib logging) for one service process."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    tail: list[structlog.typing.Processor] = (
        [structlog.processors.dict_tracebacks, structlog.processors.JSONRenderer()]
        if as_json
        else [structlog.dev.ConsoleRenderer()]
    )
    numeric = getattr(logging, level.upper())
    structlog.configure(
        processors=[*shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    structlog.contextvars.bind_contextvars(service=service)
