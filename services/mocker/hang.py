"""A simulated engine hang, for tests and debugging only (``--hang-after-tokens``,
``--hang-for-s``; decision 029): once the engine has emitted that many tokens it stops stepping,
as an engine stuck in a kernel or a deadlocked scheduler would, while the process, its event
loop and the worker runtime (pings, cancels, heartbeats) go on. It hangs once: for
``--hang-for-s`` seconds, or until the process stops."""

from __future__ import annotations

import asyncio

import structlog

log = structlog.get_logger(__name__)


class Hang:
    """When to hang and for how long. ``after_tokens`` None: never."""

    def __init__(self, after_tokens: int | None, for_s: float = 0.0) -> None:
        self.after_tokens = after_tokens
        self.for_s = for_s
        self.emitted = 0
        """Tokens emitted so far (every request's, canaries included)."""
        self.done = after_tokens is None

    def count(self, tokens: int) -> None:
        self.emitted += tokens

    @property
    def is_due(self) -> bool:
        """Whether the engine should hang now (at most once)."""
        return not self.done and self.after_tokens is not None and self.emitted >= self.after_tokens

    async def wait(self) -> None:
        """Hang: for ``for_s`` seconds, or (0) until cancelled."""
        self.done = True
        log.warning("engine_hang_simulated", after_tokens=self.after_tokens, for_s=self.for_s)
        if self.for_s > 0:
            await asyncio.sleep(self.for_s)
        else:
            await asyncio.Event().wait()  # never set: only the engine's stop ends this
        log.warning("engine_hang_ended", after_tokens=self.after_tokens)
