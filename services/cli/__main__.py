"""``jetserve`` command line: ``up`` runs NATS, every service and mocker workers; ``tap`` prints
bus messages as JSON lines."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from services.cli import tap
from services.cli.stack import Stack, StackConfig, StackError
from shared.config import env, env_help
from shared.model_dir import DEFAULT_MODEL_NAME, ensure_default_model_dir


def _up_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("up", help="run the whole stack locally (private nats-server + services)")
    p.add_argument(
        "--http-host",
        default=env("JETSERVE_GATEWAY_HTTP_HOST", "127.0.0.1"),
        help=env_help("Gateway HTTP bind address", "JETSERVE_GATEWAY_HTTP_HOST"),
    )
    p.add_argument(
        "--http-port",
        type=int,
        default=env("JETSERVE_GATEWAY_HTTP_PORT", 8000),
        help=env_help("Gateway HTTP port (0 = pick a free one)", "JETSERVE_GATEWAY_HTTP_PORT"),
    )
    p.add_argument(
        "--grpc-port",
        type=int,
        default=env("JETSERVE_GATEWAY_GRPC_PORT", 8001),
        help=env_help("Gateway gRPC port", "JETSERVE_GATEWAY_GRPC_PORT"),
    )
    p.add_argument(
        "--nats-port",
        type=int,
        default=env("JETSERVE_NATS_PORT", 0),
        help=env_help(
            "Port of the private nats-server (0 = pick a free one)", "JETSERVE_NATS_PORT"
        ),
    )
    p.add_argument(
        "--nats-url",
        default=env("JETSERVE_UP_NATS_URL", ""),
        help=env_help("Use this NATS server instead of starting one", "JETSERVE_UP_NATS_URL"),
    )
    p.add_argument(
        "--namespace",
        default=env("JETSERVE_NAMESPACE", "jetserve"),
        help=env_help("Subject namespace", "JETSERVE_NAMESPACE"),
    )
    p.add_argument(
        "--workers",
        type=int,
        default=env("JETSERVE_UP_WORKERS", 2),
        help=env_help("Mocker worker processes", "JETSERVE_UP_WORKERS"),
    )
    p.add_argument(
        "--router-mode",
        default=env("JETSERVE_ROUTER_MODE", "round-robin"),
        choices=["round-robin", "random", "kv", "direct"],
        help=env_help("Routing policy", "JETSERVE_ROUTER_MODE"),
    )
    p.add_argument(
        "--model-path",
        default=env("JETSERVE_MOCKER_MODEL_PATH", ""),
        help=env_help(
            "Local model directory (default: bundled Qwen3 tokenizer)", "JETSERVE_MOCKER_MODEL_PATH"
        ),
    )
    p.add_argument(
        "--model-name",
        default=env("JETSERVE_MOCKER_MODEL_NAME", DEFAULT_MODEL_NAME),
        help=env_help("Served model name", "JETSERVE_MOCKER_MODEL_NAME"),
    )
    p.add_argument(
        "--mocker-args",
        default="",
        help='Extra flags for every mocker, e.g. "--speedup-ratio 0 --seed 1"',
    )
    p.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", "INFO"),
        help=env_help("Log level of every service", "LOG_LEVEL"),
    )
    p.add_argument(
        "--log-to-terminal",
        action="store_true",
        help="Let services log to this terminal instead of files in the run dir",
    )
    p.add_argument(
        "--run-dir",
        default="",
        help="Folder for logs, pids and the NATS store (default: a new temp dir)",
    )


def _up(args: argparse.Namespace) -> int:
    if args.workers < 1:
        print("jetserve up: --workers must be at least 1", file=sys.stderr)
        return 2
    model_path = args.model_path
    if not model_path:
        try:
            model_path = str(ensure_default_model_dir(_cache_dir() / "qwen3-model"))
        except FileNotFoundError as exc:
            print(f"jetserve up: {exc}", file=sys.stderr)
            return 2
    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(
        StackConfig(
            http_host=args.http_host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            nats_port=args.nats_port,
            nats_url=args.nats_url or None,
            namespace=args.namespace,
            workers=args.workers,
            router_mode=args.router_mode,
            model_path=model_path,
            model_name=args.model_name,
            mocker_args=args.mocker_args,
            log_level=args.log_level,
            log_to_terminal=args.log_to_terminal,
            run_dir=run_dir,
        )
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stack.start()
    except StackError as exc:
        stack.stop()
        print(f"jetserve up: {exc}", file=sys.stderr)
        return 1
    print(
        f"JetServe is up: {stack.base_url}/v1  (model {args.model_name}, "
        f"{args.workers} mocker workers, NATS {stack.nats_url})"
    )
    print(f"logs and pids: {stack.run_dir}    stop: Ctrl-C")
    sys.stdout.flush()
    code = 0
    while not stop.wait(0.5):
        dead = stack.exited()
        if dead is not None:
            print(
                f"jetserve up: {dead.name} exited with code {dead.proc.returncode}\n{dead.tail()}",
                file=sys.stderr,
            )
            code = 1
            break
    print("stopping…", file=sys.stderr)
    stack.stop()
    return code


def _cache_dir() -> Path:
    import os

    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jetserve"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="jetserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _up_parser(sub)
    tap.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "up":
        sys.exit(_up(args))
    if args.command == "tap":
        sys.exit(tap.run(args))


if __name__ == "__main__":
    main()
