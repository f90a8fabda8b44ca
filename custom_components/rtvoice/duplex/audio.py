"""PCM facts and helpers shared by the duplex units: 16 kHz mono s16le, 10 ms frames."""

from __future__ import annotations

from array import array
import math
import sys

SAMPLE_RATE = 16000
SAMPLE_WIDTH = 2
BYTES_PER_MS = SAMPLE_RATE * SAMPLE_WIDTH // 1000  # 32
FRAME_MS = 10
FRAME_BYTES = FRAME_MS * BYTES_PER_MS  # 320: what pymicro-vad and WebRTC's APM need
SILENT_DBFS = -100.0


def ms_to_bytes(ms: float) -> int:
    """Return the byte length of ``ms`` milliseconds, rounded down to whole samples."""
    return int(ms * SAMPLE_RATE / 1000) * SAMPLE_WIDTH


def bytes_to_ms(length: int) -> float:
    """Return the duration of ``length`` bytes of PCM in milliseconds."""
    return length / BYTES_PER_MS


def frame_dbfs(frame: bytes) -> float:
    """Return the RMS level of s16le PCM in dBFS (``SILENT_DBFS`` for digital silence)."""
    samples = array("h")
    samples.frombytes(frame[: len(frame) - len(frame) % SAMPLE_WIDTH])
    if sys.byteorder == "big":  # pragma: no cover - HA runs on little-endian hosts
        samples.byteswap()
    if not samples:
        return SILENT_DBFS
    energy = math.fsum(s * s for s in samples) / len(samples)
    if energy <= 0:
        return SILENT_DBFS
    return max(SILENT_DBFS, 10 * math.log10(energy / (32768.0 * 32768.0)))


class FrameChunker:
    """Turns PCM chunks of any size into exact frames of ``frame_bytes``.

    The remainder waits for the next chunk; ``flush`` pads it with silence.
    """

    __slots__ = ("_buffer", "frame_bytes")

    def __init__(self, frame_bytes: int = FRAME_BYTES) -> None:
        """Cut into frames of ``frame_bytes`` (a whole number of samples)."""
        if frame_bytes <= 0 or frame_bytes % SAMPLE_WIDTH:
            raise ValueError("frame_bytes must be a positive whole number of samples")
        self.frame_bytes = frame_bytes
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes waiting for a full frame."""
        return len(self._buffer)

    def feed(self, pcm: bytes) -> list[bytes]:
        """Add ``pcm`` and return every complete frame."""
        self._buffer += pcm
        size = self.frame_bytes
        whole = len(self._buffer) - len(self._buffer) % size
        if not whole:
            return []
        frames = [bytes(self._buffer[i : i + size]) for i in range(0, whole, size)]
        del self._buffer[:whole]
        return frames

    def flush(self) -> bytes | None:
        """Return the remainder padded with silence to a full frame, or None."""
        if not self._buffer:
            return None
        frame = bytes(self._buffer) + bytes(self.frame_bytes - len(self._buffer))
        self._buffer.clear()
        return frame

    def clear(self) -> None:
        """Drop the remainder."""
        self._buffer.clear()
