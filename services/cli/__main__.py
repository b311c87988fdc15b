"""``jetserve`` command line: ``up`` runs NATS, every service and mocker workers; ``tap`` prints
bus messages as JSON lines; ``top`` is a live view of the fleet; ``nats-config`` writes a
least-privilege deployment's NATS users; ``chat`` talks to a model from the terminal."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from services.cli import chat, nats_config, tap
from services.cli.config import UpConfig, UpPlan, add_up_options, up_plan, write_up_dump
from services.cli.launcher import supervise
from services.cli.secure import TAP_USER
from services.cli.stack import UP_LINE, Stack, StackConfig, StackError
from services.cli.top import command as top
from shared.model_dir import default_model_dir, ensure_default_model_dir
from shared.vision_model import VISION_MODEL_NAME

UP_EPILOG = """\
Every setting of a service is a flag here too, prefixed with the service's name: the router's
--kv-overlap-score-weight is --router-kv-overlap-score-weight, the mocker's --speedup-ratio is
--mocker-speedup-ratio. Services also read their own env vars, which this command passes on.
The temp run dir is removed after a clean exit unless --keep-run-dir.
Disaggregated serving: --workers 0 --prefill-workers 2 --decode-workers 2, with the router's
--router-conditional-disagg and --router-enforce-disagg (docs/operations.md).
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``jetserve`` parser with its subcommands (nothing is parsed or run)."""
    parser = argparse.ArgumentParser(prog="jetserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="run the whole stack locally (private nats-server + services)",
        description="Run a private nats-server, every service and mocker workers.",
        epilog=UP_EPILOG,
    )
    add_up_options(up)
    tap.add_parser(sub)
    top.add_parser(sub)
    nats_config.add_parser(sub)
    chat.add_parser(sub)
    return parser


def _workers_text(up: UpConfig) -> str:
    """``2 mocker workers``; with roles ``1 aggregated + 2 prefill + 2 decode mocker workers``;
    ``, 2 data-parallel ranks each`` when there are more than one."""
    counts = up.worker_counts()
    if set(counts) == {"both"}:
        text = f"{up.workers} {up.engine} workers"
    else:
        names = {"both": "aggregated", "prefill": "prefill", "decode": "decode"}
        parts = " + ".join(f"{n} {names[role]}" for role, n in counts.items())
        text = f"{parts} {up.engine} workers"
    if up.data_parallel_size > 1:
        text += f", {up.data_parallel_size} data-parallel ranks each"
    return text


def banner(up: UpConfig, stack: Stack) -> str:
    """What ``jetserve up`` prints once the stack is ready: where it serves (the line begins
    with ``UP_LINE``), what, where its logs are, and how to watch it."""
    served = f", tensor model echo on {up.tensor_workers} workers" if up.tensor_workers else ""
    if up.embedders:
        served += f", embedding model {up.embedding_model_name} on {up.embedders} workers"
    if up.media_workers:
        served += f", image and video models on {up.media_workers} media workers"
    if up.vision_workers:
        served += f", vision model {VISION_MODEL_NAME} on {up.vision_workers} mocker workers"
    stages = {"preprocessor": up.preprocessors, "router": up.routers, "formatter": up.formatters}
    replicas = "".join(f", {n} {name}s" for name, n in stages.items() if n > 1)
    removed = "" if up.keep_run_dir or not stack.owns_run_dir else " (removed on a clean exit)"
    lines = [
        f"{UP_LINE}{stack.base_url}/v1 and gRPC (KServe v2) {stack.grpc_address}  "
        f"(model {up.model_name}, {_workers_text(up)}{served}{replicas}, "
        f"NATS {stack.nats_url})",
        f"logs and pids: {stack.run_dir}{removed}    stop: Ctrl-C",
        f"live view: jetserve top --run-dir {stack.run_dir}",
    ]
    if up.secure:
        lines.append(
            f"NATS admits only this stack's keys; read-only tap: "
            f"jetserve tap --nats-url {stack.nats_url} --nats-nkey-seed {stack.seeds[TAP_USER]} '>'"
        )
    return "\n".join(lines)


def _up(plan: UpPlan) -> int:
    up = plan.up
    try:
        model_path = up.model_path or ensure_default_model_dir(default_model_dir())
    except FileNotFoundError as exc:
        print(f"jetserve up: {exc}", file=sys.stderr)
        return 2
    if up.run_dir is not None:
        up.run_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(StackConfig.from_up(plan, model_path))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stack.start()
    except StackError as exc:
        stack.stop()
        print(f"jetserve up: {exc}\nlogs kept in {stack.run_dir}", file=sys.stderr)
        return 1
    print(banner(up, stack), flush=True)
    code, reason = supervise(stack, stop)
    print(f"stopping ({reason.splitlines()[0]})…", file=sys.stderr)
    if code:
        print(reason, file=sys.stderr)
    stack.stop()
    if code == 0 and not up.keep_run_dir and stack.remove_run_dir():
        return code
    print(f"logs kept in {stack.run_dir}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "up":
        try:
            plan = up_plan(args)
            write_up_dump(args, plan)
        except ValueError as exc:
            parser.error(str(exc))
        sys.exit(_up(plan))
    if args.command == "tap":
        sys.exit(tap.run(args))
    if args.command == "top":
        sys.exit(top.run(args))
    if args.command == "nats-config":
        sys.exit(nats_config.run(args))
    if args.command == "chat":
        sys.exit(chat.run(args))


if __name__ == "__main__":
    main()
