"""The device's microphone: 16 kHz 16-bit mono, 32 ms frames, paced by the loop clock.

The mic hears whatever speech was queued (``queue``), then silence. ``MicClock`` yields
frame ``i`` when it has been "captured", at ``start + (i + 1) * 32 ms / speed`` on the loop
clock: each due time is computed from the start, so waiting never accumulates drift.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

SAMPLE_RATE = 16000
SAMPLE_WIDTH = 2
FRAME_MS = 32
FRAME_BYTES = SAMPLE_RATE * SAMPLE_WIDTH * FRAME_MS // 1000  # 1024
FRAME_SECONDS = FRAME_MS / 1000
SILENCE = bytes(FRAME_BYTES)


@dataclass(frozen=True)
class Frame:
    """One captured mic frame."""

    index: int
    pcm: bytes
    speech: bool
    """True if any of it came from queued speech."""
    last_speech: bool
    """True if it holds the last bytes of the queued speech."""


class Microphone:
    """What the room says to the device."""

    def __init__(self) -> None:
        """Start with nothing to say (silence)."""
        self._pending = bytearray()

    @property
    def pending(self) -> int:
        """Bytes of speech not captured yet."""
        return len(self._pending)

    def queue(self, pcm: bytes) -> None:
        """Speak ``pcm`` (16 kHz mono s16le) after what is already queued."""
        if len(pcm) % SAMPLE_WIDTH:
            raise ValueError("PCM must be whole 16-bit samples")
        self._pending.extend(pcm)

    def clear(self) -> None:
        """Forget queued speech."""
        self._pending.clear()

    def capture(self, index: int) -> Frame:
        """Capture the next frame: queued speech (zero-padded) or silence."""
        if not self._pending:
            return Frame(index, SILENCE, speech=False, last_speech=False)
        chunk = bytes(self._pending[:FRAME_BYTES])
        del self._pending[:FRAME_BYTES]
        if len(chunk) < FRAME_BYTES:
            chunk += bytes(FRAME_BYTES - len(chunk))
        return Frame(index, chunk, speech=True, last_speech=not self._pending)


async def mic_clock(
    mic: Microphone, speed: float, loop: asyncio.AbstractEventLoop
) -> AsyncIterator[Frame]:
    """Yield captured frames forever at real-time pace times ``speed``."""
    if not speed > 0 or speed == float("inf"):
        raise ValueError("speed must be a positive finite factor")
    interval = FRAME_SECONDS / speed
    start = loop.time()
    index = 0
    while True:
        delay = start + (index + 1) * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield mic.capture(index)
        index += 1
