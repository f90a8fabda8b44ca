"""Waiting for a set of tasks that done callbacks empty.

Links keep the tasks still closing something in a set, each removing itself with
``task.add_done_callback(tasks.discard)``. A task that has just ended stays in that
set until its callback runs, on a later turn of the loop; and ``asyncio.gather`` over
tasks that have all ended returns without yielding to the loop (Python 3.12+, it
completes eagerly). So ``while tasks: await asyncio.gather(*tasks)`` that meets such a
task spins forever with the loop blocked: every satellite, and Home Assistant, stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any


async def wait_ended(tasks: Collection[asyncio.Future[Any]]) -> None:
    """Return once every task in ``tasks`` has ended, those added meanwhile too.

    Only tasks still running are awaited, so each turn yields to the loop. Their
    exceptions are taken (never raised here): each task logs its own failures.
    """
    while running := [task for task in tasks if not task.done()]:
        await asyncio.gather(*running, return_exceptions=True)
