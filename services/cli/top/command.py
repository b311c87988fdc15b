"""``jetserve top``'s options and entry point (the screens are in ``screen``).

Where to look comes from ``--nats-url`` / ``--namespace`` / ``--metrics`` (and the NATS
credential flags every command has), or from a ``jetserve up`` run dir (``--run-dir``: its
``stack.json``), whose values flags given on the command line override. ``--metrics-prefix``
(the services' own flag) says what the scraped metric names start with.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass, field
from pathlib import Path

from services.cli import runrecord
from services.cli.tap import auth_from, connection_settings
from shared.config import DEFAULT_NATS_URL, CommonConfig, Settings
from shared.logging import configure_logging
from shared.metric_names import DEFAULT_PREFIX, prefix_problem
from shared.nats_auth import NatsAuth
from shared.subjects import check_token


@dataclass(frozen=True, slots=True)
class TopOptions:
    nats_url: str = DEFAULT_NATS_URL
    namespace: str = "jetserve"
    auth: NatsAuth = field(default_factory=NatsAuth)
    metrics: tuple[str, ...] = ()
    metrics_prefix: str = DEFAULT_PREFIX
    window_s: float = 2.0
    interval_s: float = 1.0
    is_once: bool = False


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``top`` subcommand's options."""
    p = sub.add_parser(
        "top",
        help="live view of the fleet: workers, models, routers, gateway, admission",
        description=(
            "A live view of the fleet, from the bus (worker cards, load, lifecycle, KV events, "
            "routing decisions, token batches) and the services' /metrics (gateway figures, "
            "router index and event lag, tenants' budgets and 429s, router queue depth). "
            "Policy classes and tenants are shown once a request names one. q quits."
        ),
    )
    connection_settings().add_to(p)
    prefix_setting().add_to(p)
    p.add_argument(
        "--metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a service's /metrics URL (repeat; http://host:port alone means its /metrics)",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        help="a `jetserve up` run dir: NATS URL, namespace, /metrics URLs and the tap key",
    )
    p.add_argument("--once", action="store_true", help="print one frame as text and exit")
    p.add_argument(
        "--window", type=float, default=2.0, help="seconds rates are taken over (default 2)"
    )
    p.add_argument(
        "--interval", type=float, default=1.0, help="seconds between screens (default 1)"
    )


def prefix_setting() -> Settings:
    """``--metrics-prefix``, read as every service reads it (``JETSERVE_METRICS_PREFIX``)."""
    return CommonConfig.settings().select("metrics_prefix")


def options_from(args: argparse.Namespace) -> TopOptions:
    """Validate the parsed flags; raises ValueError with a message for the user."""
    settings = connection_settings()
    connection = settings.resolved(args)
    prefix = str(prefix_setting().resolved(args)["metrics_prefix"])
    metrics = [_metrics_url(u) for u in args.metrics]
    if args.run_dir is not None:
        record = runrecord.read(args.run_dir)
        given = settings.from_args(args)
        if not prefix_setting().from_args(args):
            prefix = record.metrics_prefix
        from_record = {"nats_url": record.nats_url, "namespace": record.namespace}
        if record.tap_seed and "nats_creds" not in given:
            from_record["nats_nkey_seed"] = record.tap_seed
        connection.update({k: v for k, v in from_record.items() if k not in given})
        connection["nats_nkey_seed"] = _as_path(connection["nats_nkey_seed"])
        metrics += [u for u in record.metrics.values() if u not in metrics]
    if args.window <= 0 or args.interval <= 0:
        raise ValueError("--window and --interval must be > 0")
    if problem := prefix_problem(prefix):
        raise ValueError(f"--metrics-prefix {problem}")
    return TopOptions(
        nats_url=str(connection["nats_url"]),
        namespace=check_token(str(connection["namespace"]), "--namespace"),
        auth=auth_from(connection),
        metrics=tuple(metrics),
        metrics_prefix=prefix,
        window_s=args.window,
        interval_s=args.interval,
        is_once=args.once,
    )


def _metrics_url(url: str) -> str:
    """``http://host:port`` means ``http://host:port/metrics``."""
    scheme, _, rest = url.partition("://")
    if not rest:
        raise ValueError(f"--metrics {url}: give a URL (http://host:port/metrics)")
    return url if "/" in rest.rstrip("/") else f"{scheme}://{rest.rstrip('/')}/metrics"


def _as_path(value: object) -> Path | None:
    return Path(value) if isinstance(value, str | Path) and str(value) else None


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jetserve top``; returns the exit status."""
    try:
        options = options_from(args)
    except ValueError as exc:
        print(f"jetserve top: {exc}", file=sys.stderr)
        return 2
    # The worker directory logs as the services do; keep it off the screen.
    configure_logging(service="top", level="ERROR", fmt="json")
    from services.cli.top import screen  # rich is loaded by `top` alone, not by every command

    try:
        return asyncio.run(screen.top(options))
    except KeyboardInterrupt:
        return 0
