"""Run the router: ``python -m services.router [--help]``."""

from __future__ import annotations

from services.router.config import RouterConfig
from services.router.service import serve
from shared.bus import run
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = RouterConfig.from_cli(argv)
    configure_logging(service="router", level=config.log_level, fmt=config.log_format)
    run(lambda: serve(config))


if __name__ == "__main__":
    main()
