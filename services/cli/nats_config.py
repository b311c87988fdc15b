"""``jetserve nats-config``: the NATS users of a least-privilege deployment, for a nats-server
that ``jetserve up`` does not start (``docker compose``, a cluster of your own).

Writes ``auth.conf`` (include it in the server's configuration, or pass it with ``-c``), one
seed per process (``--nats-nkey-seed``), and with ``--compose`` a compose file to add after
``docker-compose.yml``. ``docs/operations.md`` ("Securing a deployment") walks through it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from services.cli.secure import (
    COMPOSE_NAME,
    TAP_USER,
    compose_override,
    compose_text,
    deployment_users,
    seed_path,
    write_users,
)
from shared.bus_permissions import WORKERS
from shared.subjects import Subjects, check_token

DEFAULT_WORKERS = ("mocker=1", "embedder=1")
"""What ``docker compose up`` runs by default."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "nats-config",
        help="write the NATS users of a least-privilege deployment (compose, your own server)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--out", type=Path, required=True, help="folder to write (made private, 0700)")
    p.add_argument("--namespace", default="jetserve", help="the deployment's namespace")
    p.add_argument(
        "--workers",
        action="append",
        metavar="SERVICE=N",
        help=f"worker processes, each its own user and worker id <service>-<i> (repeatable; "
        f"services: {', '.join(sorted(WORKERS))}; default: {' '.join(DEFAULT_WORKERS)})",
    )
    p.add_argument(
        "--compose",
        action="store_true",
        help=f"also write {COMPOSE_NAME} for docker compose (seeds readable in containers)",
    )
    p.add_argument(
        "--compose-file",
        type=Path,
        default=Path("docker-compose.yml"),
        help="the base compose file the workers' services extend (default: ./docker-compose.yml)",
    )


def parse_workers(items: list[str]) -> dict[str, int]:
    """``["mocker=2", "embedder=1"]`` → ``{"mocker": 2, "embedder": 1}``; ValueError when bad."""
    out: dict[str, int] = {}
    for item in items:
        service, _, count = item.partition("=")
        if service not in WORKERS or not count.isdigit():
            raise ValueError(f"--workers {item!r}: SERVICE=N, SERVICE one of {sorted(WORKERS)}")
        out[service] = int(count)
    return out


def run(args: argparse.Namespace) -> int:
    try:
        check_token(args.namespace, "--namespace")
        workers = parse_workers(args.workers or list(DEFAULT_WORKERS))
        base = _compose_base(args.compose_file, workers) if args.compose else None
    except ValueError as exc:
        print(f"jetserve nats-config: {exc}", file=sys.stderr)
        return 2
    folder = args.out.resolve()
    users = deployment_users(workers)
    mode = 0o644 if args.compose else 0o600
    conf = write_users(folder, users, Subjects(args.namespace), seed_mode=mode)
    print(f"nats-server users: {conf} ({len(users)} users, namespace {args.namespace})")
    print(f"seeds: {folder}/<user>.nk (--nats-nkey-seed); read-only: {seed_path(folder, TAP_USER)}")
    if base is not None:
        override = folder / COMPOSE_NAME
        text = compose_text(
            compose_override(folder, users, base), args.compose_file.resolve(), override
        )
        override.write_text(text)
        print(f"compose: docker compose -f {args.compose_file} -f {override} up -d")
    return 0


def _compose_base(path: Path, workers: dict[str, int]) -> dict[str, Any]:
    """The base compose file, loaded; ValueError when it lacks a service to copy workers of."""
    import yaml  # jetserve[embedded]; only --compose needs it

    if not path.is_file():
        raise ValueError(f"--compose-file {path}: no such file")
    base: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    missing = sorted(set(workers) - set(base.get("services") or {}))
    if missing:
        raise ValueError(f"{path} has no service {', '.join(missing)} to copy for those workers")
    return base
