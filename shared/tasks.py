"""A set of background tasks a service owns: strong references, bounded wait, cancel at stop."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Coroutine
from typing import Any

import structlog

log = structlog.get_logger(__name__)

CANCEL_WAIT_S = 1.0
"""How long one cancellation is given before it is sent again."""
CANCEL_TRIES = 5


async def cancel_and_wait(
    tasks: Collection[asyncio.Task[Any]],
    *,
    wait_s: float = CANCEL_WAIT_S,
    tries: int = CANCEL_TRIES,
) -> set[asyncio.Task[Any]]:
    """Cancel ``tasks`` and wait for them to end, cancelling again those that go on: a task can
    swallow one cancellation (Python 3.11's ``wait_for`` does when its inner await finishes at
    that moment; a vLLM KV feed then ran on and a test waited for it 120 s). Bounded: returns
    the tasks still running after ``tries`` rounds of ``wait_s``, logged, not awaited."""
    pending = {task for task in tasks if not task.done()}
    for _ in range(tries):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait_s)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: it was cancelled, its failure is not news
    if pending:
        log.warning("tasks_not_ended", tasks=sorted(task.get_name() for task in pending))
    return pending


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
        await cancel_and_wait(pending)
        return len(pending)
