"""``jetserve tap SUBJECT…``: subscribe and print every bus message as one JSON line.

Core NATS subscriptions by default (what flows from now on). With ``--since`` or ``--since-seq``
each subject is replayed from the JetStream streams that hold it (an ordered consumer per
stream, from that time or sequence) and then followed live. Formatting is in ``tapformat``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, BinaryIO, cast

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamInfo, StreamsListIterator

from services.cli import tapformat
from shared.bus_permissions import inbox_prefix
from shared.config import DEFAULT_NATS_URL, CommonConfig, Settings
from shared.nats_auth import NatsAuth
from shared.subjects import VERSION, check_token

CONNECT_TIMEOUT_S = 5.0
RECONNECT_ATTEMPTS = 10
"""Tries, 0.5 s apart, before tap gives up on an unreachable or lost server."""


NATS_AUTH_SETTINGS = (
    "nats_creds",
    "nats_nkey_seed",
    "nats_tls_ca",
    "nats_tls_cert",
    "nats_tls_key",
)


@dataclass(frozen=True, slots=True)
class TapOptions:
    """What to tap and how; built from the command line."""

    subjects: tuple[str, ...]
    nats_url: str = DEFAULT_NATS_URL
    auth: NatsAuth = field(default_factory=NatsAuth)
    raw: bool = False
    count: int = 0
    """Stop after this many messages (0 = never)."""
    timeout_s: float = 0.0
    """Stop after this long (0 = never)."""
    since: datetime | None = None
    since_seq: int = 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``tap`` subcommand's options."""
    p = sub.add_parser(
        "tap",
        help="print bus messages as JSON lines (debugging)",
        description=(
            "Subscribe to SUBJECTs and print one JSON line per message: "
            '{"subject", "type", "time", "fields"}. A subject that does not start with the '
            "namespace (or a version token, $ or _INBOX) is taken as relative: 'kv.>' means "
            "'<namespace>.v1.kv.>'. Default: every subject of the namespace."
        ),
    )
    p.add_argument(
        "subjects",
        nargs="*",
        metavar="SUBJECT",
        help="subjects, wildcards allowed (default: <namespace>.v1.>)",
    )
    connection_settings().add_to(p)
    p.add_argument("--exact", action="store_true", help="use SUBJECTs as given (no expansion)")
    p.add_argument("--raw", action="store_true", help="print payloads as base64, undecoded")
    p.add_argument("--count", type=int, default=0, help="exit after N messages (0 = never)")
    p.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="exit after SECONDS (0 = never); exit 1 when --count was not reached by then",
    )
    p.add_argument(
        "--since",
        metavar="DURATION",
        help="replay JetStream streams holding the subjects from this long ago (30s, 5m, 1h)",
    )
    p.add_argument(
        "--since-seq", type=int, default=0, metavar="SEQ", help="replay from stream sequence SEQ"
    )


def connection_settings() -> Settings:
    """``--nats-url``, ``--namespace`` and the ``--nats-*`` credential and TLS files, read as
    every service reads them."""
    return CommonConfig.settings().select("nats_url", "namespace", *NATS_AUTH_SETTINGS)


def auth_from(connection: Mapping[str, Any]) -> NatsAuth:
    """The ``--nats-*`` credential and TLS files of resolved ``connection_settings()``
    (ValueError saying what is wrong with them)."""
    files = {name: connection[name] for name in NATS_AUTH_SETTINGS}
    auth = NatsAuth(**{name.removeprefix("nats_"): value for name, value in files.items()})
    if problems := auth.problems():
        raise ValueError("; ".join(problems))
    return auth


def options_from(args: argparse.Namespace) -> TapOptions:
    """Validate the parsed flags; raises ValueError with a message for the user."""
    connection = connection_settings().resolved(args)
    namespace = str(connection["namespace"])
    check_token(namespace, "--namespace")
    subjects = args.subjects or [f"{namespace}.{VERSION}.>"]
    if not args.exact:
        subjects = [tapformat.expand(s, namespace) for s in subjects]
    if args.count < 0 or args.timeout < 0 or args.since_seq < 0:
        raise ValueError("--count, --timeout and --since-seq must be >= 0")
    if args.since and args.since_seq:
        raise ValueError("use --since or --since-seq, not both")
    since = None
    if args.since:
        since = datetime.now(UTC) - tapformat.parse_duration(args.since)
    auth = auth_from(connection)
    return TapOptions(
        subjects=tuple(subjects),
        nats_url=str(connection["nats_url"]),
        auth=auth,
        raw=args.raw,
        count=args.count,
        timeout_s=args.timeout,
        since=since,
        since_seq=args.since_seq,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jetserve tap``; returns the exit status."""
    try:
        options = options_from(args)
    except ValueError as exc:
        print(f"jetserve tap: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(tap(options, sys.stdout.buffer))
    except KeyboardInterrupt:
        return 0


class _Printer:
    """Writes lines and counts them; sets ``done`` once ``count`` is reached."""

    def __init__(self, options: TapOptions, out: BinaryIO) -> None:
        self._options = options
        self._out = out
        self.printed = 0
        self.done = asyncio.Event()

    def print(self, msg: Msg, *, time: datetime, seq: int | None = None) -> None:
        if self.done.is_set():
            return
        self._out.write(
            tapformat.line(
                msg.subject,
                msg.data,
                time=time,
                reply=msg.reply,
                headers=msg.headers,
                seq=seq,
                raw=self._options.raw,
            )
        )
        self._out.flush()
        self.printed += 1
        if self._options.count and self.printed >= self._options.count:
            self.done.set()


async def tap(options: TapOptions, out: BinaryIO) -> int:
    """Subscribe, print until ``--count``, ``--timeout`` or a signal; returns the exit status."""
    closed = asyncio.Event()
    try:
        nc = await connect(options.nats_url, closed, options.auth)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        print(f"jetserve tap: cannot connect to {options.nats_url}: {exc}", file=sys.stderr)
        return 1
    printer = _Printer(options, out)
    try:
        if options.since is not None or options.since_seq:
            await _replay(nc, options, printer)
        else:
            await _live(nc, options, printer)
        await nc.flush()
        print(f"jetserve tap: listening on {', '.join(options.subjects)}", file=sys.stderr)
        return await _wait(options, printer, closed)
    except _TapError as exc:
        print(f"jetserve tap: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.close()


class _TapError(Exception):
    """A problem to report to the user in one line."""


async def connect(url: str, closed: asyncio.Event, auth: NatsAuth, command: str = "tap") -> Client:
    """Connect with a few retries; errors are one stderr line each, ``closed`` set on give-up.
    The reply inbox is tap's whatever the ``command``, so the read-only tap key works for any
    read-only command (``top`` too)."""
    last = ""

    async def on_error(exc: Exception) -> None:
        nonlocal last
        if str(exc) != last:
            last = str(exc)
            print(f"jetserve {command}: {type(exc).__name__}: {exc}", file=sys.stderr)

    async def on_closed() -> None:
        closed.set()

    return await nats.connect(
        [s.strip() for s in url.split(",") if s.strip()],
        name=f"jetserve-{command}",
        inbox_prefix=inbox_prefix("tap"),
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=RECONNECT_ATTEMPTS,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        closed_cb=on_closed,
        **auth.connect_options(),
    )


async def _live(nc: Client, options: TapOptions, printer: _Printer) -> None:
    """One subscription (several subjects: their common wildcard, filtered here), so lines come
    out in the order the server delivered them."""
    patterns = list(options.subjects)
    subject = tapformat.covering(patterns)
    only = None if subject in patterns else patterns

    async def on_msg(msg: Msg) -> None:
        if only is None or any(tapformat.matches(p, msg.subject) for p in only):
            printer.print(msg, time=datetime.now(UTC))

    await nc.subscribe(subject, cb=on_msg)


async def _replay(nc: Client, options: TapOptions, printer: _Printer) -> None:
    """One ordered consumer per (stream, subject) from the start time or sequence."""
    js = nc.jetstream()
    try:
        infos = await _all_streams(js)
    except nats.js.errors.Error as exc:
        raise _TapError(f"cannot list JetStream streams: {exc}") from exc
    streams = [(i.config.name, list(i.config.subjects or [])) for i in infos if i.config.name]
    for pattern in options.subjects:
        held = [(n, s) for n, s in streams if any(tapformat.overlaps(pattern, x) for x in s)]
        if not held:
            raise _TapError(f"no JetStream stream holds {pattern} (tap it without --since)")
        for name, subjects in held:
            filters = tapformat.stream_filters(pattern, subjects)
            await _replay_stream(js, name, pattern, filters, options, printer)


async def _all_streams(js: nats.js.JetStreamContext) -> list[StreamInfo]:
    """Every stream's info: the server lists them a page (256) at a time."""
    infos: list[StreamInfo] = []
    while True:
        # nats-py annotates it as a plain Iterable; it is the page with the stream total
        page = cast(StreamsListIterator, await js.streams_info_iterator(offset=len(infos)))
        before = len(infos)
        infos.extend(page)
        if len(infos) >= page.total or len(infos) == before:
            return infos


async def _replay_stream(
    js: nats.js.JetStreamContext,
    stream: str,
    pattern: str,
    filters: list[str],
    options: TapOptions,
    printer: _Printer,
) -> None:
    async def on_msg(msg: Msg) -> None:
        if not tapformat.matches(pattern, msg.subject):
            return
        meta = msg.metadata
        printer.print(msg, time=meta.timestamp, seq=meta.sequence.stream)

    config = ConsumerConfig(filter_subjects=filters if len(filters) > 1 else None)
    if options.since_seq:
        config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config.opt_start_seq = options.since_seq
    else:
        assert options.since is not None
        config.deliver_policy = DeliverPolicy.BY_START_TIME
        config.opt_start_time = options.since
    try:
        await js.subscribe(
            filters[0], stream=stream, cb=on_msg, ordered_consumer=True, config=config
        )
    except nats.js.errors.Error as exc:
        raise _TapError(f"cannot replay {stream} ({pattern}): {exc}") from exc


async def _wait(options: TapOptions, printer: _Printer, closed: asyncio.Event) -> int:
    """Until ``--count``, ``--timeout``, a signal, or the connection is lost for good."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waits = [asyncio.ensure_future(event.wait()) for event in (printer.done, stop, closed)]
    try:
        await asyncio.wait(
            waits, timeout=options.timeout_s or None, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for task in waits:
            task.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if closed.is_set() and not printer.done.is_set():
        print("jetserve tap: lost the NATS connection", file=sys.stderr)
        return 1
    if options.count and printer.printed < options.count and not stop.is_set():
        return 1
    return 0
