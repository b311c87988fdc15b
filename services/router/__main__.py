"""Run the router: ``python -m services.router [--help]``."""

from __future__ import annotations

from services.router.config import RouterConfig
from services.router.service import Router
from shared.bus import run
from shared.lifecycle import run_service
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = RouterConfig.from_cli(argv)
    configure_logging(service="router", level=config.log_level, fmt=config.log_format)
    run(lambda: run_service(config, "router", lambda nc: Router(config, nc)))


if __name__ == "__main__":
    main()
