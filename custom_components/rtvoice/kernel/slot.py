"""The latest-wins input slot of one child."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
import time


@dataclass(slots=True)
class PendingInput:
    """An input waiting to be taken, with its sequence number."""

    text: str
    seq: int
    pushed_at: float
    speculative: bool = False  # answered but held until confirmed (Kernel.confirm)


class LatestSlot:
    """One pending input; a push overwrites it. Wake-up is level-triggered.

    ``push`` returns the input it voided (never taken), so the caller can settle it.
    """

    __slots__ = ("_pending", "dropped", "seq", "wake")

    def __init__(self) -> None:
        """Create an empty slot."""
        self.seq = 0
        self.dropped = 0
        self._pending: PendingInput | None = None
        self.wake = asyncio.Event()

    def push(
        self, text: str, *, speculative: bool = False
    ) -> tuple[int, PendingInput | None]:
        """Store ``text`` as the newest input; return its seq and the voided input."""
        voided = self._pending
        if voided is not None:
            self.dropped += 1
        self.seq += 1
        self._pending = PendingInput(
            text, self.seq, time.perf_counter(), speculative=speculative
        )
        self.wake.set()
        return self.seq, voided

    def take(self) -> PendingInput | None:
        """Take the pending input and clear the slot."""
        pending = self._pending
        self._pending = None
        self.wake.clear()
        return pending

    def withdraw(self, seq: int) -> PendingInput | None:
        """Remove the pending input if it is ``seq`` (counted as dropped)."""
        pending = self._pending
        if pending is None or pending.seq != seq:
            return None
        self._pending = None
        self.wake.clear()
        self.dropped += 1
        return pending

    def confirm(self, seq: int) -> bool:
        """Make the pending input ``seq`` an ordinary one; False if it is not pending."""
        pending = self._pending
        if pending is None or pending.seq != seq:
            return False
        pending.speculative = False
        return True

    @property
    def pending(self) -> bool:
        """Whether an input waits (diagnostics only; never poll it)."""
        return self._pending is not None
