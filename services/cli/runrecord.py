"""``stack.json`` in a ``jetserve up`` run dir: how to reach the stack from outside (its NATS URL,
namespace, every ``/metrics`` URL and the prefix of their names, the read-only tap key of a
``--secure`` stack). ``Stack`` writes it; ``jetserve top --run-dir`` reads it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import msgspec

from shared.metric_names import DEFAULT_PREFIX

RECORD_FILE = "stack.json"


class StackRecord(msgspec.Struct, frozen=True, kw_only=True):
    nats_url: str
    namespace: str
    metrics: dict[str, str] = msgspec.field(default_factory=dict)
    """``/metrics`` URL by process name: the gateway's HTTP port, and every process started
    with ``--metrics-port`` (``jetserve up --router-metrics-port 9100 ...``)."""
    tap_seed: str = ""
    """The read-only tap user's NKey seed file (``--secure`` stacks only)."""
    metrics_prefix: str = DEFAULT_PREFIX
    """What the stack's metric names start with (``jetserve up --metrics-prefix``)."""


def metrics_urls(
    plan: Sequence[tuple[str, Sequence[str]]], gateway_url: str, host: str = "127.0.0.1"
) -> dict[str, str]:
    """``/metrics`` URLs of a stack's planned processes (``(name, command)``): the gateway's
    at ``gateway_url``, and one per process whose command sets a non-zero ``--metrics-port``."""
    urls = {"gateway": f"{gateway_url}/metrics"}
    for name, cmd in plan:
        for flag, value in itertools.pairwise(cmd):
            if flag == "--metrics-port" and value.isdigit() and int(value):
                urls[name] = f"http://{host}:{value}/metrics"
    return urls


def dumps(record: StackRecord) -> str:
    """The record as the file holds it (indented JSON)."""
    return msgspec.json.format(msgspec.json.encode(record)).decode() + "\n"


def read(run_dir: Path) -> StackRecord:
    """The record in ``run_dir`` (``ValueError`` saying why when there is none or it is bad)."""
    path = run_dir / RECORD_FILE
    try:
        return msgspec.json.decode(path.read_bytes(), type=StackRecord)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except msgspec.DecodeError as exc:
        raise ValueError(f"{path}: {exc}") from exc
