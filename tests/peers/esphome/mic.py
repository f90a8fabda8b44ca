"""The device's microphone: 16 kHz 16-bit mono, 32 ms frames, paced by the loop clock.

The mic hears whatever speech was queued (``queue``), then silence. While a run
streams, it keeps streaming (silence between clips), as a duplex device does. With an
echo path (``DeviceConfig.echo_gain``) it also hears the device's own speaker: raw API
audio is mixed in, attenuated, after ``echo_delay_ms`` (``echo``). ``MicClock`` yields
frame ``i`` when it has been "captured", at ``start + (i + 1) * 32 ms / speed`` on the loop
clock: each due time is computed from the start, so waiting never accumulates drift.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

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
        self._echo = bytearray()

    def echo(self, pcm: bytes, *, gain: float, delay_ms: int) -> None:
        """Hear the speaker: ``pcm`` times ``gain``, after the room's delay.

        ``delay_ms`` of silence go first when no echo is pending.
        """
        if not self._echo and delay_ms > 0:
            self._echo.extend(bytes(delay_ms * SAMPLE_RATE // 1000 * SAMPLE_WIDTH))
        samples = np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], dtype="<i2")
        self._echo.extend((samples * gain).astype("<i2").tobytes())

    @property
    def echo_pending(self) -> int:
        """Bytes of echo not captured yet."""
        return len(self._echo)

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
        """Capture the next frame: queued speech (zero-padded) or silence, plus echo."""
        if not self._pending:
            frame = Frame(index, SILENCE, speech=False, last_speech=False)
        else:
            chunk = bytes(self._pending[:FRAME_BYTES])
            del self._pending[:FRAME_BYTES]
            if len(chunk) < FRAME_BYTES:
                chunk += bytes(FRAME_BYTES - len(chunk))
            frame = Frame(index, chunk, speech=True, last_speech=not self._pending)
        if not self._echo:
            return frame
        echo = bytes(self._echo[:FRAME_BYTES])
        del self._echo[:FRAME_BYTES]
        echo += bytes(FRAME_BYTES - len(echo))
        mixed = np.frombuffer(frame.pcm, dtype="<i2").astype(np.int32)
        mixed += np.frombuffer(echo, dtype="<i2")
        pcm = np.clip(mixed, -32768, 32767).astype("<i2").tobytes()
        return Frame(index, pcm, speech=frame.speech, last_speech=frame.last_speech)


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
