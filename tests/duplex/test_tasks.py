"""``wait_ended``: waiting for tasks that remove themselves from a set when done.

The CI run of stop 23 hung for 289 s in a conversation's close: a session's ending
task had just finished, its ``discard`` callback not yet run, and
``while ending: await gather(*ending)`` spun without yielding to the loop.
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.rtvoice.duplex.tasks import wait_ended


def tracked(tasks: set[asyncio.Future[None]]) -> asyncio.Future[None]:
    """Return a future in ``tasks`` that leaves it once done, as the links keep theirs."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    tasks.add(future)
    future.add_done_callback(tasks.discard)
    return future


# Signal method: the timeout interrupts the loop even while it spins.
@pytest.mark.timeout(10, method="signal")
async def test_a_task_that_just_ended_does_not_block_the_loop() -> None:
    """Ended, still in the set (its callback not run yet): the wait returns."""
    tasks: set[asyncio.Future[None]] = set()
    tracked(tasks).set_result(None)
    assert tasks  # the discard callback is only scheduled
    await wait_ended(tasks)


@pytest.mark.timeout(10, method="signal")
async def test_tasks_added_while_waiting_are_waited_for() -> None:
    """A close spawned by a task that ends is waited for too."""
    tasks: set[asyncio.Future[None]] = set()
    first, later = tracked(tasks), None

    def spawn_another(_: asyncio.Future[None]) -> None:
        nonlocal later
        later = tracked(tasks)
        asyncio.get_running_loop().call_soon(later.set_result, None)

    first.add_done_callback(spawn_another)
    asyncio.get_running_loop().call_soon(first.set_result, None)
    await wait_ended(tasks)
    assert later is not None and later.done()


@pytest.mark.timeout(10, method="signal")
async def test_a_failed_task_does_not_raise_here() -> None:
    """Each task reports its own failure; the wait only waits."""
    tasks: set[asyncio.Future[None]] = set()
    failing = tracked(tasks)
    asyncio.get_running_loop().call_soon(failing.set_exception, OSError("gone"))
    await wait_ended(tasks)
    assert isinstance(failing.exception(), OSError)
