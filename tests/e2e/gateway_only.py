"""A gateway process on a real nats-server with nothing behind it: for what the gateway alone
decides (validation, headers, documents). A valid request for a model nobody registered is a 404
``model_not_found``, which shows that validation let it through."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.gateway_replica import Replica, gateway_on
from tests.support import nats_server

UNKNOWN_MODEL = "no-such-model"


GatewayProcess = Replica


@contextmanager
def gateway_process(run_dir: Path, *args: str) -> Iterator[GatewayProcess]:
    """``python -m services.gateway`` (with ``args``) on a private nats-server, until exit."""
    with (
        nats_server(run_dir / "js") as (nats_url, _),
        gateway_on(
            nats_url, f"e2e{uuid.uuid4().hex[:8]}", run_dir / "gateway.log", *args, ready="/live"
        ) as gateway,
    ):
        yield gateway
