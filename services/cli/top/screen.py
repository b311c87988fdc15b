"""``jetserve top``'s screens: the live one (redrawn every ``--interval``, ``q`` quits) and
``--once`` (gather for ``--window`` seconds, print one frame as plain text, exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator

import nats.errors
from rich.console import Console
from rich.live import Live

from services.cli.tap import connect
from services.cli.top.command import TopOptions
from services.cli.top.feed import Feed
from services.cli.top.view import render
from shared.subjects import Subjects

ONCE_WIDTH = 160
"""Columns of a ``--once`` frame (wide enough that no table wraps)."""


async def top(options: TopOptions) -> int:
    """Connect, gather, and show frames until ``q``, a signal, or (``--once``) one frame."""
    closed = asyncio.Event()
    try:
        nc = await connect(options.nats_url, closed, options.auth, command="top")
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        print(f"jetserve top: cannot connect to {options.nats_url}: {exc}", file=sys.stderr)
        return 1
    feed = Feed(
        nc, Subjects(options.namespace), options.metrics, metrics_prefix=options.metrics_prefix
    )
    try:
        await feed.start()
        await feed.scrape()
        if options.is_once:
            return await _once(feed, options)
        return await _live(feed, options, closed)
    finally:
        await feed.stop()
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            await nc.close()


async def _once(feed: Feed, options: TopOptions) -> int:
    print(f"jetserve top: gathering for {options.window_s:g}s", file=sys.stderr, flush=True)
    await asyncio.sleep(options.window_s)
    await feed.scrape()
    console = Console(width=ONCE_WIDTH, color_system=None, force_terminal=False)
    console.print(render(feed.frame(options.window_s), namespace=options.namespace))
    return 0


async def _live(feed: Feed, options: TopOptions, closed: asyncio.Event) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console = Console()
    try:
        with _keys(loop, stop), Live(console=console, screen=True, auto_refresh=False) as live:
            while not stop.is_set() and not closed.is_set():
                frame = feed.frame(options.window_s)
                live.update(render(frame, namespace=options.namespace), refresh=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), options.interval_s)
                await feed.scrape()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if closed.is_set():
        print("jetserve top: lost the NATS connection", file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _keys(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> Iterator[None]:
    """Read single keys from a terminal stdin: ``q`` sets ``stop`` (no terminal: Ctrl-C)."""
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    if fd < 0 or not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)

    def on_key() -> None:
        if b"q" in os.read(fd, 32).lower():
            stop.set()

    tty.setcbreak(fd)
    loop.add_reader(fd, on_key)
    try:
        yield
    finally:
        loop.remove_reader(fd)
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
