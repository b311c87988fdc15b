"""One in-flight load per key: concurrent callers share it; a failure is not remembered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    """Runs ``load(key)`` at most once at a time per key; every caller awaits the same task."""

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Task[V]] = {}

    async def run(self, key: K, load: Callable[[], Coroutine[Any, Any, V]], *, name: str) -> V:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.create_task(load(), name=name)
            self._tasks[key] = task
            task.add_done_callback(lambda _: self._tasks.pop(key, None))
        # shield: one waiter giving up must not cancel the load the others wait on.
        return await asyncio.shield(task)

    async def cancel_all(self) -> None:
        """Cancel the loads still running (at shutdown, when nobody waits for them)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
