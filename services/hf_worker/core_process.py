"""The engine process: ``python -m services.hf_worker.core_process --fd N --options JSON``.

Started by the worker's ``HfEngine`` (``engine.ProcessCore``) with one end of a socket pair as
file descriptor ``N``. It loads the model into an ``EngineCore``, says ``CoreReady`` (or
``CoreStartFailed``), then reads ``CoreAdd``/``CoreCancel`` frames in its main thread while the
manager generates in its own and the dispatcher writes ``CoreOutputs`` frames back. It stops on
``CoreStop`` or when the worker's end closes (the worker exited, however it did), so an engine
process never outlives its worker. If the manager's generation loop dies, it hangs up and exits
with status 2: the worker reads EOF and treats it as the engine gone. SIGINT is ignored: Ctrl-C
reaches the whole process group, and the worker, which drains its requests first, says when to
stop.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading

import structlog

from services.hf_worker.core import EngineCore
from services.hf_worker.core_wire import (
    HEADER,
    MAX_FRAME,
    CoreAdd,
    CoreCancel,
    CoreOutput,
    CoreOutputs,
    CoreReady,
    CoreStartFailed,
    CoreStop,
    FromCore,
    decode_options,
    decode_to_core,
    frame,
)
from shared.logging import configure_logging
from shared.worker.records import EngineError

log = structlog.get_logger(__name__)

NOT_ACCEPTING = "transformers' manager is not accepting requests"


class _Channel:
    """The engine's end of the socket pair: frames out from any thread, frames in on one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def send(self, message: FromCore) -> None:
        data = frame(message)
        with self._lock:
            if self.closed.is_set():
                return
            try:
                self.sock.sendall(data)
            except OSError:  # the worker is gone: the main thread sees EOF and stops
                self.closed.set()

    def hang_up(self) -> None:
        """End the conversation from this side (the worker reads EOF; ``receive`` returns None)."""
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def receive(self) -> bytes | None:
        """The next frame's body (None: the worker closed its end)."""
        head = self._exactly(HEADER.size)
        if head is None:
            return None
        (size,) = HEADER.unpack(head)
        if size > MAX_FRAME:
            raise ValueError(f"a {size}-byte frame: the stream is broken")
        return self._exactly(size)

    def _exactly(self, size: int) -> bytes | None:
        chunks, left = [], size
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 20))
            except OSError:
                return None
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def serve(channel: _Channel, core: EngineCore) -> None:
    """Read requests until ``CoreStop`` or the worker's end closes."""
    while (body := channel.receive()) is not None:
        message = decode_to_core(body)
        if isinstance(message, CoreStop):
            return
        if isinstance(message, CoreCancel):
            core.cancel(message.request_id)
        elif isinstance(message, CoreAdd):
            try:
                added, error = core.add(message), NOT_ACCEPTING
            except EngineError as exc:  # its grammar: the request is at fault, a 400
                added, error = False, str(exc)
            if not added:
                failed = CoreOutput(
                    request_id=message.request_id,
                    new_tokens=(),
                    total=0,
                    status=4,
                    error=error,
                    refused=error != NOT_ACCEPTING,
                )
                channel.send(CoreOutputs(outputs=[failed], dropped=core.dropped))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.hf_worker.core_process")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--options", required=True, help="HfEngineOptions as JSON")
    args = parser.parse_args(argv)
    options = decode_options(args.options)
    configure_logging(service="hf_worker.engine", level=options.log_level, fmt=options.log_format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = _Channel(socket.socket(fileno=args.fd))
    core = EngineCore(options, channel.send, on_died=channel.hang_up)
    try:
        facts = core.start()
    except Exception as exc:  # the boundary of the engine's start: the worker reports it
        log.exception("hf_engine_start_failed")
        channel.send(CoreStartFailed(error=f"{type(exc).__name__}: {exc}"))
        return 1
    channel.send(CoreReady(facts=facts))
    try:
        serve(channel, core)
    finally:
        core.stop()
        channel.sock.close()
    return 2 if core.died else 0


if __name__ == "__main__":
    sys.exit(main())
