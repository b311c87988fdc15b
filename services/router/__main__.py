"""Run the router: ``python -m services.router [--help]``."""

from __future__ import annotations

from services.router.config import RouterConfig
from services.router.service import Router
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(RouterConfig, Router, argv)


if __name__ == "__main__":
    main()
