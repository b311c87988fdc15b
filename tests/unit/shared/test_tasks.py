"""``cancel_and_wait`` / ``TaskSet.close``: a task that swallows a cancellation still ends, and
one that never ends does not hold its owner forever."""

from __future__ import annotations

import asyncio

from shared.tasks import TaskSet, cancel_and_wait


async def swallows(times: list[int], started: asyncio.Event) -> None:
    """Ignores cancellations while ``times[0]`` is above 0 (counting down; as a racing
    ``wait_for`` can), then ends at the next."""
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if times[0] <= 0:
                raise
            times[0] -= 1


async def test_a_swallowed_cancellation_is_sent_again() -> None:
    started = asyncio.Event()
    task = asyncio.create_task(swallows([1], started))
    await started.wait()
    pending = await cancel_and_wait([task], wait_s=0.05)
    assert (pending, task.cancelled()) == (set(), True)


async def test_a_task_that_never_ends_is_given_up_on_after_its_tries() -> None:
    started = asyncio.Event()
    times = [1_000_000]
    task = asyncio.create_task(swallows(times, started))
    await started.wait()
    pending = await cancel_and_wait([task], wait_s=0.02, tries=3)
    assert pending == {task}
    assert times == [1_000_000 - 3]  # cancelled once a try, three times, then left running
    times[0] = 0
    assert await cancel_and_wait([task], wait_s=1.0) == set()


async def test_taskset_close_ends_a_task_that_swallowed_one_cancellation() -> None:
    tasks = TaskSet()
    started = asyncio.Event()
    task = tasks.spawn(swallows([1], started))
    await started.wait()
    assert await tasks.close() == 1
    assert task.cancelled()
