"""A formatter on the test's nats-server, started and stopped the way the service runs
(``shared.lifecycle.serving``: connect, build, start; stop, drain)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from functools import partial

from services.formatter.config import FormatterConfig
from services.formatter.service import FormatterService, build_service
from shared.lifecycle import serving


def running_formatter(config: FormatterConfig) -> AbstractAsyncContextManager[FormatterService]:
    return serving(config, "formatter", partial(build_service, config))
