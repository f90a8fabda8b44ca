"""Event-driven fakes for the duplex tests: a transport that can hold a frame."""

from __future__ import annotations

import asyncio


class FakeTransport:
    """Records frames; ``hold_at(n)`` makes the n-th send wait until ``release()``."""

    def __init__(self) -> None:
        """Start with nothing sent and nothing held."""
        self.frames: list[bytes] = []
        self._hold_at: int | None = None
        self.holding = asyncio.Event()
        self._release = asyncio.Event()
        self._count_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def hold_at(self, n: int) -> None:
        """Make the n-th frame's send (1-based) block until released."""
        self._hold_at = n
        self.holding.clear()
        self._release.clear()

    def release(self) -> None:
        """Let the held send return."""
        self._hold_at = None
        self._release.set()

    async def sent(self, n: int) -> None:
        """Wait until ``n`` frames have been sent."""
        if len(self.frames) >= n:
            return
        future = asyncio.get_running_loop().create_future()
        self._count_waiters.append((n, future))
        await future

    async def send(self, frame: bytes) -> None:
        """Record a frame (and maybe hold)."""
        self.frames.append(frame)
        for n, future in list(self._count_waiters):
            if len(self.frames) >= n and not future.done():
                future.set_result(None)
        if self._hold_at is not None and len(self.frames) == self._hold_at:
            self.holding.set()
            await self._release.wait()

    @property
    def audio(self) -> bytes:
        """Everything sent, concatenated."""
        return b"".join(self.frames)
