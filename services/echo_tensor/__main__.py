"""Run the echo tensor worker: ``python -m services.echo_tensor [--help]``."""

from __future__ import annotations

from services.echo_tensor.config import EchoTensorConfig
from services.echo_tensor.service import build_service
from shared.lifecycle import service_main


def main(argv: list[str] | None = None) -> None:
    service_main(EchoTensorConfig, build_service, argv)


if __name__ == "__main__":
    main()
