"""``jetserve chat`` typed at in a pseudo-terminal against a running stack: the answer streams
in, the next turn's request carries the conversation, Ctrl-C cancels the answer in flight (the
stack stops working on it) and gives the prompt back, Ctrl-D ends the session. Without ``--url``
it runs a private stack for the session and leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from services.cli.chat import CANCELLED
from services.cli.stack import Stack
from services.cli.top.stats import parse
from shared import codec
from shared.messages import Preprocess
from shared.subjects import Subjects
from tests.e2e.conftest import running_stack

HANG_S = 60.0
"""A wait only a hang runs into."""
LONG = 4000
"""Tokens of an answer that takes the mocker at real speed (~6 ms a token) far longer than
the test: only a cancellation ends it early."""
CONTROLLING_TTY = (
    "import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
)
"""Make the pty (stdin) the controlling terminal of the new session before exec'ing the
command, so that Ctrl-C typed on it is a SIGINT, as in a real terminal; and SIGINT's default
action back: a test run started in the background by a non-interactive shell (``cmd &``)
inherits SIGINT ignored, and Python then installs no ``KeyboardInterrupt`` handler."""
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


@pytest.fixture(scope="module")
def chat_stack(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[Stack]:
    """One mocker at real speed: a long answer streams for many seconds."""
    with running_stack(
        tmp_path_factory.mktemp("chat"),
        model_dir,
        workers=1,
        mocker_args="--speedup-ratio 1 --seed 1",
        log_level="INFO",
    ) as stack:
        yield stack


class Terminal:
    """``jetserve chat ARGS`` on the slave side of a pty; typing and reading on the master."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        cmd = [sys.executable, "-m", "services.cli", "chat", *args]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CONTROLLING_TTY, *cmd],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**os.environ, "TERM": "dumb", **(env or {})},
            start_new_session=True,
        )
        os.close(slave)
        self.fd = master
        self.seen = ""

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def expect(self, pattern: str, timeout_s: float = HANG_S) -> str:
        """Read until ``pattern`` (a regex) shows in what was read since the last ``expect``;
        return that text (escape sequences and carriage returns taken out) and consume it."""
        deadline = time.monotonic() + timeout_s
        while (found := re.search(pattern, self.seen)) is None:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and not self._read(0)):
                raise AssertionError(f"no {pattern!r} in {self.seen[-2000:]!r}")
            self._read(min(left, 0.2))
        shown, self.seen = self.seen[: found.end()], self.seen[found.end() :]
        return shown

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        if not ready:
            return False
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # the child closed its side
            return False
        self.seen += _ANSI.sub("", data.decode(errors="replace"))
        return bool(data)

    def close(self) -> int:
        try:
            return self.proc.wait(timeout=HANG_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            os.close(self.fd)


@pytest.fixture
async def asked(chat_stack: Stack) -> AsyncIterator[list[Preprocess]]:
    """Every request the gateway hands the preprocessors, as it goes by on the bus."""
    seen: list[Preprocess] = []

    async def on_msg(msg: Msg) -> None:
        seen.append(codec.decode(msg.data, Preprocess))

    nc = await nats.connect(chat_stack.nats_url)
    await nc.subscribe(Subjects(chat_stack.config.namespace).preprocess, cb=on_msg)
    await nc.flush()
    try:
        yield seen
    finally:
        await nc.close()


async def _in_thread(term: Terminal, pattern: str, timeout_s: float = HANG_S) -> str:
    """``term.expect`` off the event loop (the bus subscription keeps running)."""
    return await asyncio.to_thread(term.expect, pattern, timeout_s)


def _in_flight(stack: Stack) -> float | None:
    with urllib.request.urlopen(f"{stack.base_url}/metrics", timeout=5) as resp:
        samples = parse(resp.read().decode())
    return samples.total("jetserve_gateway_concurrent_requests")


async def test_turns_stream_and_carry_the_conversation(
    chat_stack: Stack, asked: list[Preprocess]
) -> None:
    term = Terminal("--url", f"{chat_stack.base_url}/v1", "--max-tokens", "12")
    try:
        banner = await _in_thread(term, r"Ctrl-D quits\)\n> ")
        assert "chatting with Qwen/Qwen3-0.6B" in banner
        term.type("Tell me about the river town.\r")
        first = await _in_thread(term, r"\n> ")
        answer = first.split("river town.", 1)[1].removesuffix("\n> ")
        assert len(answer.strip()) > 10, first
        term.type("And the clock?\r")
        await _in_thread(term, r"\n> ")
        term.type("\x04")  # Ctrl-D
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.close()
    first_asked, second_asked = [r.messages for r in asked]
    assert first_asked == ({"role": "user", "content": "Tell me about the river town."},)
    user, assistant, again = second_asked
    assert (user, again) == (*first_asked, {"role": "user", "content": "And the clock?"})
    assert assistant["role"] == "assistant"
    assert assistant["content"].strip() == answer.strip()  # what the terminal showed
    assert all(r.max_tokens == 12 and r.output.stream for r in asked)


async def test_ctrl_c_cancels_the_answer_in_flight_and_gives_the_prompt_back(
    chat_stack: Stack, asked: list[Preprocess]
) -> None:
    term = Terminal("--url", chat_stack.base_url, "--max-tokens", str(LONG))
    try:
        await _in_thread(term, r"Ctrl-D quits\)\n> ")
        term.type("Tell me a long story.\r")
        shown = await _in_thread(term, r"(?s)story\.\n.{20}")  # the answer is streaming
        assert await asyncio.to_thread(_in_flight, chat_stack) == 1
        started = time.monotonic()
        term.type("\x03")  # Ctrl-C
        cancelled = await _in_thread(term, rf"\n{re.escape(CANCELLED)}\n> ")
        assert time.monotonic() - started < 10  # not the ~24 s the whole answer takes
        for _ in range(100):  # the stack let go of it: the stream was closed
            if await asyncio.to_thread(_in_flight, chat_stack) == 0:
                break
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(_in_flight, chat_stack) == 0
        partial = (shown + cancelled).split("story.\n", 1)[1].split(f"\n{CANCELLED}")[0]
        partial = partial.replace("^C", "")
        term.type("Go on.\r")  # the next turn: the partial answer is in the conversation
        await _in_thread(term, r"(?s)Go on\.\n.{5}")
        term.type("\x03")
        await _in_thread(term, rf"{re.escape(CANCELLED)}\n> ")
        term.type("\x04")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.close()
    assistant = asked[1].messages[1]
    assert assistant["role"] == "assistant"
    assert assistant["content"].strip() == partial.strip() != ""


def test_without_a_url_a_private_stack_runs_for_the_session(
    tmp_path: Path, model_dir: Path
) -> None:
    args = ("--max-tokens", "8", "--model-path", str(model_dir))
    term = Terminal(*args, env={"TMPDIR": str(tmp_path)})
    try:
        started = term.expect(r"logs and pids: (\S+)\)", timeout_s=HANG_S)
        run_dir = Path(re.search(r"logs and pids: (\S+)\)", started).group(1))  # type: ignore[union-attr]
        term.expect(r"Ctrl-D quits\)\n> ", timeout_s=120)
        pids = [int(p.read_text()) for p in run_dir.glob("*.pid")]
        assert len(pids) >= 5  # nats, preprocessor, formatter, router, mocker, gateway
        term.type("Hello?\r")
        answer = term.expect(r"\n> ")
        assert len(answer.split("Hello?", 1)[1].strip()) > 3
        term.type("\x04")
        assert term.close() == 0
    finally:
        if term.proc.poll() is None:
            term.close()
    assert not run_dir.exists()  # a clean exit removes it
    assert [pid for pid in pids if _alive(pid)] == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")  # a zombie has exited
    return not (stat.exists() and stat.read_text().split()[2] == "Z")
