"""Server-side echo cancellation: WebRTC AEC3 through the ``livekit`` package (optional).

The integration knows exactly what it sent to the speaker, so it can remove the echo
of it from the mic itself (DESIGN §5.5). ``far_end`` places what the player sent on
the mic's time line (when the device will play it); each 10 ms mic frame through
``process`` first feeds the reference of the same 10 ms (silence when nothing plays)
to ``process_reverse_stream``, then cleans the mic frame with ``process_stream``.
AEC3 finds the acoustic delay itself; what it cannot follow is a delay that jumps:
once converged, a shift of even a few milliseconds leaks the echo at -30 dBFS for
a second or more (measured on the ESPHome bench, row 16). So frames the device
plays back to back continue the reference sample for sample (``far_end`` without a
sample), and only a new stretch (the device's queue ran dry) is placed on the mic
time line. Where a device starts a new stretch is only known to a few ms (its own
buffers, the network), so a stretch that begins after ``RESTART_AFTER_MS`` of
silence, when no echo of the last one is left to cancel, gets a fresh AEC3: it
converges on the first echo as on the first answer, instead of leaking while the
learnt filter slides to a new delay.

``livekit`` is optional: ``unavailable_reason()`` says why it cannot be used here.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from .audio import FRAME_BYTES, SAMPLE_RATE

FRAME_SAMPLES = FRAME_BYTES // 2

MAX_REFERENCE_MS = 2000
# Reference silence after which a new stretch gets a fresh AEC3: longer than the
# echo path's delay and reverberant tail (the room of tests/duplex/echo_sim.py:
# up to 400 ms + 200 ms), so nothing of the last stretch is left to cancel.
RESTART_AFTER_MS = 1000


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
    """One AEC3 instance for one stream. Blocking calls, ~0.1 ms per 10 ms frame.

    ``far_end`` (the loop) and ``process`` (the stream's DSP worker) may run on two
    threads: the reference time line is guarded by a lock.

    The reference is a time line in mic samples: ``far_end(pcm, at_sample=n)`` says
    the device plays ``pcm`` while its mic records sample ``n`` onwards (the session
    derives ``n`` from the player's schedule and the mic's arrival times). Each
    ``process`` of the next 10 ms mic frame feeds the reference of the same 10 ms
    first. Without ``at_sample`` the audio follows the previous reference sample
    for sample (the device plays it back to back); with it, never over the previous
    reference either (the device plays one thing at a time).
    """

    def __init__(self, *, noise_suppression: bool = False) -> None:
        """Create the APM; raise RuntimeError with the reason when it is unavailable."""
        if (reason := unavailable_reason()) is not None:
            raise RuntimeError(reason)
        from livekit import rtc  # noqa: PLC0415

        self._rtc: Any = rtc
        self._noise_suppression = noise_suppression
        self._apm = self._new_apm()
        self.restarts = 0  # fresh AEC3s for new stretches (diagnostics)
        self._silent_frames = 0  # mic frames since the last reference frame
        self._referenced = False  # the APM has had a reference frame
        self._restart_frames = RESTART_AFTER_MS * SAMPLE_RATE // 1000 // FRAME_SAMPLES
        self._frames: dict[int, bytearray] = {}  # mic frame index -> reference
        self._mic_frame = 0  # index of the next mic frame
        self._reference_end = 0  # sample after the last reference sample placed
        self._silence = bytes(FRAME_BYTES)
        self.last_reference = self._silence  # what the last process() cancelled
        # far_end runs on the loop, process on the stream's DSP worker.
        self._lock = threading.Lock()

    def _new_apm(self) -> Any:
        return self._rtc.AudioProcessingModule(
            echo_cancellation=True,
            noise_suppression=self._noise_suppression,
            high_pass_filter=True,
        )

    @property
    def mic_samples(self) -> int:
        """Mic samples processed so far."""
        return self._mic_frame * FRAME_SAMPLES

    def far_end(self, pcm: bytes, *, at_sample: int | None = None) -> None:
        """Place audio sent to the speaker on the mic's time line (any size)."""
        with self._lock:
            self._place(pcm, at_sample)

    def _place(self, pcm: bytes, at_sample: int | None) -> None:
        # The device plays one thing at a time: never over the previous reference.
        start = self._reference_end
        if at_sample is not None:
            start = max(start, at_sample)
        start = max(start, self.mic_samples)  # the past is gone
        samples = len(pcm) // 2
        self._reference_end = start + samples
        horizon = self.mic_samples + MAX_REFERENCE_MS * SAMPLE_RATE // 1000
        offset = 0
        while offset < samples:
            index, within = divmod(start + offset, FRAME_SAMPLES)
            take = min(FRAME_SAMPLES - within, samples - offset)
            if start + offset >= horizon:
                break  # never hold more than MAX_REFERENCE_MS ahead
            frame = self._frames.get(index)
            if frame is None:
                frame = self._frames[index] = bytearray(FRAME_BYTES)
            frame[within * 2 : (within + take) * 2] = pcm[
                offset * 2 : (offset + take) * 2
            ]
            offset += take

    def reset_far_end(self) -> None:
        """Forget reference audio not yet matched (e.g. the device dropped its queue)."""
        with self._lock:
            self._frames.clear()
            self._reference_end = self.mic_samples

    def process(self, frame: bytes) -> bytes:
        """Return the next 10 ms mic frame with the echo of the reference removed."""
        if len(frame) != FRAME_BYTES:
            raise ValueError(f"frames must be {FRAME_BYTES} bytes, got {len(frame)}")
        with self._lock:
            placed = self._frames.pop(self._mic_frame, None)
            self._mic_frame += 1
        reference = self._silence if placed is None else bytes(placed)
        self.last_reference = reference
        if placed is None:
            self._silent_frames += 1
        else:
            if self._referenced and self._silent_frames >= self._restart_frames:
                # A new stretch, its echo delay a few ms off the last one's.
                self._apm = self._new_apm()
                self.restarts += 1
            self._silent_frames = 0
            self._referenced = True
        frame_cls = self._rtc.AudioFrame
        self._apm.process_reverse_stream(
            frame_cls(bytearray(reference), SAMPLE_RATE, 1, FRAME_SAMPLES)
        )
        mic = frame_cls(bytearray(frame), SAMPLE_RATE, 1, FRAME_SAMPLES)
        self._apm.process_stream(mic)
        return bytes(mic.data.cast("B"))


class MicTimeline:
    """Maps loop time to mic sample positions from the arrival of mic chunks.

    A chunk ending at sample ``n`` that arrives at time ``t`` was recorded no later
    than ``t``: ``t - n / rate`` bounds the offset from above, and the smallest
    recent bound (least network delay) is the estimate. It creeps up by
    ``creep_ms_per_s`` so a drifting device clock is followed.
    """

    def __init__(self, *, creep_ms_per_s: float = 1.0) -> None:
        """Start with no estimate."""
        self.offset: float | None = None
        self._creep = creep_ms_per_s / 1000
        self._samples = 0
        self._last: float | None = None

    def chunk(self, now: float, samples: int) -> None:
        """Record that a mic chunk of ``samples`` samples arrived at ``now``."""
        self._samples += samples
        bound = now - self._samples / SAMPLE_RATE
        if self.offset is None or self._last is None:
            self.offset = bound
        else:
            self.offset = min(
                self.offset + self._creep * max(0.0, now - self._last), bound
            )
        self._last = now

    def sample_at(self, when: float) -> int | None:
        """Return the mic sample being recorded at loop time ``when`` (None: unknown yet)."""
        if self.offset is None:
            return None
        return round((when - self.offset) * SAMPLE_RATE)
