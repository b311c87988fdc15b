"""Run the mocker: ``python -m services.mocker [--help]``."""

from __future__ import annotations

from services.mocker.config import MockerConfig
from services.mocker.service import Mocker
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(MockerConfig, Mocker, argv)


if __name__ == "__main__":
    main()
