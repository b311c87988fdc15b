"""NATS users for a least-privilege deployment: one NKey per process, and the nats-server
``authorization`` block that gives each the permissions of its role (``shared.bus_permissions``).

``jetserve up --secure`` writes one into its run dir and starts its nats-server with it;
``jetserve nats-config`` writes one for a server run elsewhere (compose, a cluster). The server
holds only public keys; each process gets its own seed file (mode 0600), read with
``--nats-nkey-seed`` / ``JETSERVE_NATS_NKEY_SEED``. A worker's user name is its worker id.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from shared.bus_permissions import WORKERS, permissions
from shared.messages import MEDIA_KINDS, media_worker_id
from shared.subjects import Subjects

CONF_NAME = "auth.conf"
TAP_USER = "tap"


@dataclass(frozen=True, slots=True)
class BusUser:
    """One NATS user: a process of ``service`` (a worker's ``name`` is its worker id)."""

    name: str
    service: str
    seed: bytes

    @property
    def public_key(self) -> str:
        return str(nkeys.from_seed(bytearray(self.seed)).public_key.decode())

    @property
    def worker_ids(self) -> tuple[str, ...]:
        """The ids the process registers under: its name (a media worker: one per kind)."""
        if self.service == "media":
            return tuple(media_worker_id(self.name, kind) for kind in MEDIA_KINDS)
        return (self.name,) if self.service in WORKERS else ()


def new_user(name: str, service: str) -> BusUser:
    """A user with a fresh NKey."""
    return BusUser(name, service, nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def authorization(users: Sequence[BusUser], subjects: Subjects) -> str:
    """nats-server's ``authorization`` block: each user's public key and permissions. A client
    without one of these keys cannot connect."""
    entries = [
        {
            "nkey": user.public_key,
            "permissions": permissions(user.service, subjects, user.worker_ids).as_config(),
        }
        for user in users
    ]
    names = ", ".join(u.name for u in users)
    body = json.dumps({"users": entries}, indent=2)
    return f"# JetServe least-privilege users ({names}), namespace {subjects.namespace}\n" + (
        f"authorization {body}\n"
    )


def write_users(
    folder: Path, users: list[BusUser], subjects: Subjects, *, seed_mode: int = 0o600
) -> Path:
    """``folder/auth.conf`` and one ``folder/<name>.nk`` seed per user; the conf's path.

    ``folder`` is private to its owner (0700). The seeds are 0600, or ``seed_mode``: a
    container's user (uid 10001 in the image) reads a bind-mounted seed by its own mode."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for user in users:
        path = seed_path(folder, user.name)
        path.touch(mode=0o600)
        path.write_bytes(user.seed + b"\n")
        path.chmod(seed_mode)
    conf = folder / CONF_NAME
    conf.write_text(authorization(users, subjects))
    return conf


def seed_path(folder: Path, name: str) -> Path:
    return folder / f"{name}.nk"


# --- `jetserve nats-config`: users for a server run elsewhere (compose, a cluster) -------------

ROLES = ("gateway", "preprocessor", "router", "formatter")
"""Services whose replicas share one user: their permissions are their role's."""
COMPOSE_NAME = "docker-compose.secure.yml"
SEED_IN_CONTAINER = "/run/jetserve/nats.nk"
CONF_IN_CONTAINER = "/etc/nats/jetserve-auth.conf"


def deployment_users(workers: dict[str, int]) -> list[BusUser]:
    """One user per role, ``tap``, and one per worker process (``<service>-<i>``, its id)."""
    users = [new_user(role, role) for role in ROLES]
    for service, count in workers.items():
        users += [new_user(f"{service}-{i}", service) for i in range(count)]
    return [*users, new_user(TAP_USER, "tap")]


def compose_override(folder: Path, users: list[BusUser], base: dict[str, Any]) -> dict[str, Any]:
    """A compose file to add after ``docker-compose.yml`` (``base``, as loaded): nats-server
    reads the users, every service mounts its seed, and each worker is a service of its own
    (``mocker-0``…, a copy of ``base``'s ``mocker``, which drops to 0 replicas), since a worker's
    key names its worker id. (A copy, not ``extends``: compose 1.x cannot extend a service
    with ``depends_on``.)"""
    nats = base["services"]["nats"]
    services: dict[str, Any] = {
        "nats": {
            "command": [*nats["command"], "-c", CONF_IN_CONTAINER],
            "volumes": [*nats.get("volumes", []), f"{folder / CONF_NAME}:{CONF_IN_CONTAINER}:ro"],
        }
    }
    for name in base["services"]:
        if name in WORKERS:  # only the generated workers have keys; the scalable ones are off
            services[name] = {"scale": 0}
    for user in users:
        if user.service == "tap":
            continue
        seed = {"JETSERVE_NATS_NKEY_SEED": SEED_IN_CONTAINER}
        mount = f"{seed_path(folder, user.name)}:{SEED_IN_CONTAINER}:ro"
        if not user.worker_ids:
            services[user.name] = {"environment": seed, "volumes": [mount]}
            continue
        worker = copy.deepcopy(base["services"][user.service])
        worker["environment"] = {
            **worker.get("environment", {}),
            **seed,
            f"JETSERVE_{user.service.upper()}_WORKER_ID": user.name,
        }
        worker["volumes"] = [*worker.get("volumes", []), mount]
        services[user.name] = worker
    return {"services": services}


def compose_text(override: dict[str, Any], base_path: Path, path: Path) -> str:
    """The override as YAML (every value in full: the base's anchors were merged on load),
    with how to use it."""
    import yaml  # the launcher's extra (jetserve[embedded]); only this command needs it

    class NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    header = (
        "# Generated by `jetserve nats-config --compose`: least privilege on the bus.\n"
        f"#   docker compose -f {base_path} -f {path} up -d\n"
        "# A worker's NATS key is its identity: add workers by generating again, not --scale.\n"
    )
    return header + yaml.dump(override, Dumper=NoAliases, sort_keys=False, width=100)
