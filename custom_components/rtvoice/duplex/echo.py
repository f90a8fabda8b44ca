"""Server-side echo cancellation: WebRTC AEC3 through the ``livekit`` package (optional).

The integration knows exactly what it sent to the speaker, so it can remove the echo
of it from the mic itself (DESIGN §5.5). ``far_end`` takes what the player sent; each
10 ms mic frame through ``process`` first feeds one 10 ms frame of that reference
(silence when nothing plays) to ``process_reverse_stream`` and then cleans the mic
frame with ``process_stream``. Popping the reference one frame per mic frame makes it
follow the device's clock the way the device's own queue does; AEC3 finds the rest of
the delay itself.

``livekit`` is optional: ``unavailable_reason()`` says why it cannot be used here.
"""

from __future__ import annotations

from collections import deque
import functools
from typing import Any

from .audio import FRAME_BYTES, FRAME_MS, SAMPLE_RATE, FrameChunker

MAX_REFERENCE_MS = 2000


@functools.cache
def unavailable_reason() -> str | None:
    """Return None when the echo canceller can run here, else why not."""
    try:
        from livekit import rtc  # noqa: PLC0415 - optional, heavy native wheel
    except ImportError as err:
        return f"the livekit package is not installed ({err}); pip install livekit"
    if not hasattr(rtc, "AudioProcessingModule"):
        return (
            "the installed livekit package has no AudioProcessingModule (needs >= 1.0)"
        )
    return None


class EchoCanceller:
    """One AEC3 instance for one stream. Blocking calls, ~0.1 ms per 10 ms frame."""

    def __init__(self, *, noise_suppression: bool = False) -> None:
        """Create the APM; raise RuntimeError with the reason when it is unavailable."""
        if (reason := unavailable_reason()) is not None:
            raise RuntimeError(reason)
        from livekit import rtc  # noqa: PLC0415

        self._rtc: Any = rtc
        self._apm = rtc.AudioProcessingModule(
            echo_cancellation=True,
            noise_suppression=noise_suppression,
            high_pass_filter=True,
        )
        self._chunker = FrameChunker(FRAME_BYTES)
        self._reference: deque[bytes] = deque(maxlen=MAX_REFERENCE_MS // FRAME_MS)
        self._silence = bytes(FRAME_BYTES)

    def far_end(self, pcm: bytes) -> None:
        """Queue audio that was sent to the speaker (any size)."""
        self._reference.extend(self._chunker.feed(pcm))

    def reset_far_end(self) -> None:
        """Forget reference audio not yet matched (e.g. the device dropped its queue)."""
        self._reference.clear()
        self._chunker.clear()

    def process(self, frame: bytes) -> bytes:
        """Return one 10 ms mic frame with the echo of the reference removed."""
        if len(frame) != FRAME_BYTES:
            raise ValueError(f"frames must be {FRAME_BYTES} bytes, got {len(frame)}")
        reference = self._reference.popleft() if self._reference else self._silence
        frame_cls = self._rtc.AudioFrame
        self._apm.process_reverse_stream(
            frame_cls(bytearray(reference), SAMPLE_RATE, 1, FRAME_BYTES // 2)
        )
        mic = frame_cls(bytearray(frame), SAMPLE_RATE, 1, FRAME_BYTES // 2)
        self._apm.process_stream(mic)
        return bytes(mic.data.cast("B"))
