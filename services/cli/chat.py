"""``jetserve chat``: talk to a model from the terminal (Dynamo's ``-i`` / ``--interactive``).

Each turn is one streamed ``/v1/chat/completions`` request over the stack's OpenAI HTTP API,
carrying the whole conversation so far; the answer is printed as it arrives. Ctrl-C cancels the
answer in flight (the stream is closed, which cancels the request on the stack) and returns to
the prompt; what was shown of it stays in the conversation. Ctrl-D (end of input) ends the
session. Without ``--url`` it starts a private stack for the session (``jetserve up``'s: its own
nats-server on free ports, one mocker worker) and stops it on the way out; it never guesses that
whatever listens on port 8000 is the stack meant.

The HTTP client is ``http.client``: the command needs nothing beyond the base install.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO
from urllib.parse import urlsplit

from shared.config import Settings, setting, settings_of
from shared.model_dir import DEFAULT_MODEL_NAME

PROMPT = "> "
CANCELLED = "[cancelled]"
"""Printed on its own line when Ctrl-C ends an answer early."""
DIM, PLAIN = "\x1b[2m", "\x1b[0m"
"""Reasoning is shown dimmed on a terminal."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatConfig:
    """``jetserve chat``'s settings (``JETSERVE_CHAT_*``)."""

    SERVICE: ClassVar[str] = "chat"

    url: str = setting(
        "",
        "The stack's HTTP address, as jetserve up prints it (http://host:port or …/v1); "
        "empty = start a private stack for this session",
    )
    model: str = setting(
        "",
        "Model to talk to (empty = the one the stack serves; of several, the default model)",
    )
    api_key: str = setting(
        "", "API key for a gateway that asks for one (sent as a bearer token)", secret=True
    )
    system_prompt: str = setting("", "A system message that opens the conversation")
    max_tokens: int | None = setting(
        None, "Longest answer, in tokens (unset = the stack's default)", ge=1
    )
    temperature: float | None = setting(
        None, "Sampling temperature (unset = the stack's default)", ge=0
    )
    timeout_s: float = setting(60.0, "Longest wait for the stack to send anything", gt=0)
    model_path: Path | None = setting(
        None, "Private stack only: the local model directory (unset = the bundled Qwen3 one)"
    )

    def __post_init__(self) -> None:
        settings_of(ChatConfig).check(self)


def chat_settings() -> Settings:
    return settings_of(ChatConfig)


class ChatError(Exception):
    """The stack cannot be reached or refused a request; the message is for the user."""


# -- pure: the conversation and the wire ------------------------------------------------------


@dataclass(slots=True)
class Conversation:
    """The messages of one session, and the request body of the next turn."""

    model: str
    system_prompt: str = ""
    sampling: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.system_prompt:
            self.messages.append({"role": "system", "content": self.system_prompt})

    def ask(self, text: str) -> bytes:
        """Add the user's ``text``; the streamed request that asks for the answer."""
        self.messages.append({"role": "user", "content": text})
        body = {"model": self.model, "messages": self.messages, "stream": True, **self.sampling}
        return json.dumps(body).encode()

    def answered(self, text: str) -> None:
        """Record the answer to the last question; no answer at all takes the question back
        (a failed or cancelled turn that showed nothing leaves no trace)."""
        if text:
            self.messages.append({"role": "assistant", "content": text})
        elif self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()


def stream_chunks(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, up to ``data: [DONE]``."""
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        yield json.loads(data)


def chunk_texts(chunk: dict[str, Any]) -> tuple[str, str]:
    """``(reasoning, content)`` of the first choice's delta (either may be empty); an error
    chunk raises ``ChatError``."""
    if error := chunk.get("error"):
        raise ChatError(str(error.get("message", error) if isinstance(error, dict) else error))
    choices = chunk.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return delta.get("reasoning_content") or "", delta.get("content") or ""


def choose_model(served: list[str], wanted: str) -> str:
    """The model to talk to: ``wanted`` if given, else the only one served, else the default
    model if it is served (``ChatError`` otherwise)."""
    if wanted:
        return wanted
    if len(served) == 1:
        return served[0]
    if DEFAULT_MODEL_NAME in served:
        return DEFAULT_MODEL_NAME
    if not served:
        raise ChatError("the stack serves no model yet")
    raise ChatError(f"the stack serves several models, pick one with --model: {served}")


# -- the HTTP side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the stack's OpenAI API is, and how to sign requests to it."""

    base_url: str
    api_key: str = ""
    timeout_s: float = 60.0

    @classmethod
    def of(cls, url: str, api_key: str = "", timeout_s: float = 60.0) -> Endpoint:
        """``http://host:port`` or ``http://host:port/v1`` (``ChatError`` for anything else)."""
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ChatError(f"--url {url}: give the stack's address, e.g. http://127.0.0.1:8000")
        path = parts.path.rstrip("/").removesuffix("/v1")
        return cls(f"{parts.scheme}://{parts.netloc}{path}", api_key, timeout_s)

    def connect(self) -> http.client.HTTPConnection:
        parts = urlsplit(self.base_url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        return kind(parts.netloc, timeout=self.timeout_s)

    def headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return {"Content-Type": "application/json", "Accept": "text/event-stream", **auth}

    def path(self, tail: str) -> str:
        return urlsplit(self.base_url).path + tail

    def models(self) -> list[str]:
        """The ids ``/v1/models`` lists (``ChatError`` when the stack cannot be reached)."""
        conn = self.connect()
        try:
            conn.request("GET", self.path("/v1/models"), headers=self.headers())
            resp = conn.getresponse()
            body = resp.read()
        except OSError as exc:
            raise ChatError(f"cannot reach {self.base_url}: {exc}") from exc
        finally:
            conn.close()
        if resp.status != 200:
            raise ChatError(f"{self.base_url}/v1/models answered {resp.status}: {_message(body)}")
        return [m["id"] for m in json.loads(body).get("data", [])]


def turn(endpoint: Endpoint, body: bytes, out: TextIO) -> tuple[str, bool]:
    """Ask, and print the answer to ``out`` as it streams in; ``(content shown, cancelled)``.
    Ctrl-C (``KeyboardInterrupt``) closes the connection, which cancels the request."""
    conn = endpoint.connect()
    shown: list[str] = []
    in_reasoning = False
    dim = out.isatty()
    try:
        conn.request("POST", endpoint.path("/v1/chat/completions"), body, endpoint.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            raise ChatError(f"the stack answered {resp.status}: {_message(resp.read())}")
        for chunk in stream_chunks(resp):
            reasoning, content = chunk_texts(chunk)
            if reasoning:
                out.write((DIM if dim and not in_reasoning else "") + reasoning)
                in_reasoning = True
            if content:
                out.write((PLAIN if dim and in_reasoning else "") + content)
                in_reasoning = False
                shown.append(content)
            out.flush()
    except KeyboardInterrupt:
        return "".join(shown), True
    except OSError as exc:
        raise ChatError(f"the connection to {endpoint.base_url} failed: {exc}") from exc
    finally:
        conn.close()
        if dim and in_reasoning:
            out.write(PLAIN)
    return "".join(shown), False


def _message(body: bytes) -> str:
    """The ``error.message`` of an error body, else the body itself (shortened)."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        error = json.loads(body)["error"]
        return str(error["message"] if isinstance(error, dict) else error)
    return body.decode(errors="replace")[:300]


# -- the command ------------------------------------------------------------------------------


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``chat`` subcommand's options."""
    p = sub.add_parser(
        "chat",
        help="talk to a model from the terminal (interactive mode)",
        description=(
            "Talk to a model: each line you type is a turn of one conversation, the answer "
            "streams back as it is generated. Ctrl-C cancels an answer, Ctrl-D ends the session. "
            "Without --url a private stack runs for the session."
        ),
        epilog="Each flag falls back to its env var (an empty one is unset), then its default.",
    )
    chat_settings().add_to(p)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``jetserve chat``; returns the exit status."""
    try:
        config = ChatConfig(**chat_settings().values(args))
    except ValueError as exc:
        print(f"jetserve chat: {exc}", file=sys.stderr)
        return 2
    if config.url:
        return _session(config, config.url)
    from services.cli.stack import Stack, StackConfig, StackError  # only a private stack needs it
    from shared.model_dir import default_model_dir, ensure_default_model_dir

    try:
        model_path = config.model_path or ensure_default_model_dir(default_model_dir())
    except FileNotFoundError as exc:
        print(f"jetserve chat: {exc}", file=sys.stderr)
        return 2
    stack = Stack(
        StackConfig(
            http_port=0,
            grpc_port=0,
            workers=1,
            model_path=str(model_path),
            model_name=config.model or DEFAULT_MODEL_NAME,
        )
    )
    print(
        f"starting a private stack for this session (logs and pids: {stack.run_dir})…",
        file=sys.stderr,
        flush=True,
    )
    try:
        stack.start()
    except (StackError, KeyboardInterrupt) as exc:
        stack.stop()
        print(f"jetserve chat: the private stack did not start: {exc}", file=sys.stderr)
        print(f"logs kept in {stack.run_dir}", file=sys.stderr)
        return 1
    try:
        code = _session(config, stack.base_url)
    finally:
        stack.stop()
    if code == 0:
        stack.remove_run_dir()
    return code


def _session(config: ChatConfig, url: str) -> int:
    """Prompt, ask, print, until end of input."""
    try:
        endpoint = Endpoint.of(url, config.api_key, config.timeout_s)
        model = choose_model(endpoint.models(), config.model)
    except ChatError as exc:
        print(f"jetserve chat: {exc}", file=sys.stderr)
        return 1
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (line editing and history for input())
    sampling = {"max_tokens": config.max_tokens, "temperature": config.temperature}
    conversation = Conversation(
        model, config.system_prompt, {k: v for k, v in sampling.items() if v is not None}
    )
    print(f"chatting with {model} at {endpoint.base_url}  (Ctrl-C cancels an answer, Ctrl-D quits)")
    while True:
        try:
            text = input(PROMPT).strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not text:
            continue
        try:
            answer, cancelled = turn(endpoint, conversation.ask(text), sys.stdout)
        except ChatError as exc:
            conversation.answered("")
            print(f"\njetserve chat: {exc}", file=sys.stderr, flush=True)
            continue
        conversation.answered(answer)
        print(f"\n{CANCELLED}" if cancelled else "", flush=True)
