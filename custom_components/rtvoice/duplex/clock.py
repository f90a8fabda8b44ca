"""Time for the paced player: the event loop's clock, or a virtual one for tests and benches."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds and a way to sleep until a moment."""

    def now(self) -> float:
        """Return the current time in seconds."""

    async def sleep_until(self, deadline: float) -> None:
        """Return at ``deadline`` (at once when it has passed)."""


class LoopClock:
    """The running event loop's monotonic clock."""

    def now(self) -> float:
        """Return ``loop.time()``."""
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``deadline`` (always a cancellation point)."""
        await asyncio.sleep(max(0.0, deadline - self.now()))


class VirtualClock:
    """A clock that jumps: sleeping until a moment makes it that moment at once.

    Deterministic pacing without waiting. Meant for one sleeper at a time (the
    player); ``advance`` moves it by hand (e.g. in step with fed mic audio).
    """

    def __init__(self, start: float = 0.0) -> None:
        """Start at ``start`` seconds."""
        self._now = start

    def now(self) -> float:
        """Return the virtual time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += max(0.0, seconds)

    async def sleep_until(self, deadline: float) -> None:
        """Jump to ``deadline`` and yield once to the loop."""
        self._now = max(self._now, deadline)
        await asyncio.sleep(0)
