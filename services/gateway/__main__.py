"""Run the gateway: ``python -m services.gateway [--help]``."""

from services.gateway.config import GatewayConfig
from services.gateway.server import serve
from shared.logging import configure_logging


def main(argv: list[str] | None = None) -> None:
    config = GatewayConfig.from_cli(argv)
    configure_logging(service="gateway", level=config.log_level, fmt=config.log_format)
    serve(config)


if __name__ == "__main__":
    main()
