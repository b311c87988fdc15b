"""A set of background tasks a service owns: strong references, bounded wait, cancel at stop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class TaskSet:
    """Tasks started by one service; each is forgotten when done, all are ended by ``close``.

    asyncio keeps only weak references to tasks, so a task nobody holds can vanish mid-flight;
    this holds them until they finish.
    """

    __slots__ = ("_tasks",)

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        """Tasks still running."""
        return len(self._tasks)

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None
    ) -> asyncio.Task[Any]:
        """Start ``coro`` as a task held by this set."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self, grace_s: float = 0.0) -> int:
        """Wait up to ``grace_s`` for the tasks, then cancel the rest; how many were cancelled."""
        if not self._tasks:
            return 0
        pending = set(self._tasks)
        if grace_s > 0:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)
