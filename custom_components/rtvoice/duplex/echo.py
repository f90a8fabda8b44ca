"""Server-side echo cancellation: our numpy canceller, or WebRTC AEC3 (``livekit``).

The integration knows exactly what it sent to the speaker, so it can remove the echo
of it from the mic itself (DESIGN §5.5). ``far_end`` places what the player sent on
the mic's time line (when the device will play it); each 10 ms mic frame through
``process`` is cleaned against the reference of the same 10 ms (silence when nothing
plays). A device that sends its own echo reference (the second channel of
``MULTI_CHANNEL_AUDIO``: what its speaker played, sample-aligned with the mic) hands
it to ``process`` with the frame, and the time line is not used.

Two engines (``ENGINE_NUMPY``, the default, and ``ENGINE_AEC3``):

- ``numpy``: ``fdaf.FdafCanceller``, a partitioned-block frequency-domain adaptive
  filter with a residual echo suppressor that lets the user's onset through. It
  needs only numpy, so it runs on every Home Assistant install (musl included), and
  passes the mic through untouched when it finds no echo (a board that cancels its
  own).
- ``aec3``: WebRTC AEC3 through the optional ``livekit`` wheel (glibc only): the
  reference goes to ``process_reverse_stream``, the mic to ``process_stream``.
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

``livekit`` is optional: ``unavailable_reason(ENGINE_AEC3)`` says why it cannot be
used here; the numpy engine is always available.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import numpy as np

from .audio import FRAME_BYTES, SAMPLE_RATE
from .fdaf import FdafCanceller

ENGINE_NUMPY = "numpy"
ENGINE_AEC3 = "aec3"
ENGINES = (ENGINE_NUMPY, ENGINE_AEC3)
FRAME_SAMPLES = FRAME_BYTES // 2

MAX_REFERENCE_MS = 2000
# Reference silence after which a new stretch gets a fresh AEC3: longer than the
# echo path's delay and reverberant tail (the room of tests/duplex/echo_sim.py:
# up to 400 ms + 200 ms), so nothing of the last stretch is left to cancel.
RESTART_AFTER_MS = 1000


def unavailable_reason(engine: str = ENGINE_NUMPY) -> str | None:
    """Return None when the echo canceller ``engine`` can run here, else why not."""
    if engine == ENGINE_NUMPY:
        return None  # numpy is in every Home Assistant install
    if engine != ENGINE_AEC3:
        return f"unknown echo canceller {engine!r}"
    return _aec3_unavailable_reason()


@functools.cache
def _aec3_unavailable_reason() -> str | None:
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
    """One echo canceller for one stream. Blocking calls, ~0.2-0.6 ms per 10 ms frame.

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

    def __init__(
        self,
        *,
        engine: str = ENGINE_NUMPY,
        noise_suppression: bool = False,
        filter_ms: int = 300,
        learned: FdafCanceller | None = None,
    ) -> None:
        """Create the engine; raise RuntimeError with the reason when it is unavailable.

        ``filter_ms`` (numpy): the echo path it models, the device's output latency
        beyond the reference's placement plus the room's reverberation.
        ``learned`` (numpy): the canceller of the device's last stream, to go on
        from the echo path it learned (the room has not moved) instead of from none.
        """
        if (reason := unavailable_reason(engine)) is not None:
            raise RuntimeError(reason)
        self.engine = engine
        self._rtc: Any = None
        self._apm: Any = None
        self.fdaf: FdafCanceller | None = None
        if engine == ENGINE_AEC3:
            from livekit import rtc  # noqa: PLC0415

            self._rtc = rtc
            self._noise_suppression = noise_suppression
            self._apm = self._new_apm()
        else:
            self.fdaf = learned or FdafCanceller(filter_ms=filter_ms)
        self.restarts = 0  # fresh AEC3s for new stretches (diagnostics)
        self._silent_frames = 0  # mic frames since the last reference frame
        self._referenced = False  # the APM has had a reference frame
        self._restart_frames = RESTART_AFTER_MS * SAMPLE_RATE // 1000 // FRAME_SAMPLES
        self._frames: dict[int, bytearray] = {}  # mic frame index -> reference
        self._mic_frame = 0  # index of the next mic frame
        self._reference_end = 0  # sample after the last reference sample placed
        self._stretches: set[int] = set()  # mic frames where a new stretch begins
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
        horizon = self.mic_samples + MAX_REFERENCE_MS * SAMPLE_RATE // 1000
        if self._reference_end < start < horizon:
            # Not back to back (placed by time, or the past it follows is gone):
            # a new stretch, placed a few ms off the last.
            self._stretches.add(start // FRAME_SAMPLES)
        self._reference_end = start + samples
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
            self._stretches.clear()
            self._reference_end = self.mic_samples

    @property
    def echo_found(self) -> bool | None:
        """Whether an echo path was found (numpy engine; None: AEC3 does not say)."""
        return self.fdaf.echo_found if self.fdaf is not None else None

    @property
    def learning(self) -> bool:
        """True while an echo reaches the mic that the canceller cannot remove yet.

        The first second or two of far end a fresh numpy canceller hears (until
        its filter holds the echo path); AEC3 does not say (False).
        """
        return self.fdaf.learning if self.fdaf is not None else False

    def process(self, frame: bytes, reference: bytes | None = None) -> bytes:
        """Return the next 10 ms mic frame with the echo of the reference removed.

        ``reference``: the device's own echo reference for this frame (what its
        speaker played, sample-aligned); None takes it from the time line.
        """
        if len(frame) != FRAME_BYTES:
            raise ValueError(f"frames must be {FRAME_BYTES} bytes, got {len(frame)}")
        with self._lock:
            reference_given = reference
            placed = self._frames.pop(self._mic_frame, None)
            stretch = self._mic_frame in self._stretches
            if self._stretches:
                self._stretches = {i for i in self._stretches if i > self._mic_frame}
            self._mic_frame += 1
        if reference is not None:
            if len(reference) != FRAME_BYTES:
                raise ValueError(f"references must be {FRAME_BYTES} bytes")
            placed = bytearray(reference)
        reference = self._silence if placed is None else bytes(placed)
        self.last_reference = reference
        if self.fdaf is not None:
            if stretch and reference_given is None:
                self.fdaf.new_stretch()
            mic = np.frombuffer(frame, dtype="<i2").astype(np.float64)
            far = np.frombuffer(reference, dtype="<i2").astype(np.float64)
            out = self.fdaf.process(mic, far)
            return bytes(np.clip(np.round(out), -32768, 32767).astype("<i2").tobytes())
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
