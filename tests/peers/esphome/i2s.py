"""The voice assistant's speaker path as ESPHome 2026.10.0 firmware has it, sample-timed.

Raw API audio goes: ``VoiceAssistantAudio`` -> the voice assistant's 16 KiB
``speaker_buffer_`` -> (at most 4 KiB per write) the I2S speaker's ring buffer ->
5 DMA buffers of 10 ms -> the loudspeaker. Sources (the pinned ``esphome`` wheel):

- ``voice_assistant/voice_assistant.cpp`` ``VoiceAssistant::on_audio``: a message that
  does not fit in ``SPEAKER_BUFFER_SIZE`` (16 * 1024) is dropped whole ("Cannot
  receive audio, buffer is full"): counted in ``dropped_bytes``; else it is copied
  and ``write_speaker_`` runs once. ``write_speaker_`` hands
  ``min(speaker_buffer_size_, 4 * 1024)`` to ``speaker_->play``; what the speaker
  refuses stays. Outside STREAMING_RESPONSE / RESPONSE_FINISHED (``loop``) nothing
  else calls it: audio moves on only when a message arrives (``feed``);
  ``loop_write`` is the loop's call in those two states.
- ``clear_buffers_`` (START_MICROPHONE, RESPONSE_FINISHED) empties the buffer,
  ``deallocate_buffers_`` (IDLE) frees it: ``on_audio`` then drops everything
  (``allocated``).
- ``i2s_audio/speaker/i2s_audio_speaker.cpp`` ``I2SAudioSpeakerBase::play``: a
  stopped speaker is started and the write is refused (returns 0) until it runs;
  ``loop`` STATE_STARTING -> ``start_i2s_driver`` -> ``parent_->try_lock()``: with
  the bus held (the shared-bus microphone) it logs "Parent bus is busy" and
  retries after ``status_momentary_error(..., 1000)``: 1 s (``BUS_RETRY_S``).
  Starting takes ``START_LATENCY_S`` (the loop, the driver, the task: assumed two
  16 ms loop passes).
- ``i2s_audio_speaker_standard.cpp``: ring buffer of
  ``max(DMA_BUFFERS_COUNT * DMA_BUFFER_DURATION_MS, buffer_duration)`` =
  max(50 ms, ``buffer_duration``) (``ring_ms``), ``write_without_replacement``
  takes only what fits; 5 x 10 ms DMA buffers preloaded with silence, so audio
  leaves the ring and is heard ``DMA_S`` later; the task stops itself when no
  data was read for ``timeout`` (default 500 ms, ``IDLE_STOP_S``) and returns the
  bus lock. ``stop()`` (``speaker.stop``; ``I2SAudioSpeakerBase::stop`` ->
  ``stop_(false)`` sets COMMAND_STOP): ``run_speaker_task`` sees it at its next
  pass, paced by the blocking write of one 10 ms DMA buffer, and leaves (its ring
  buffer freed with ``audio_source``); ``loop`` then handles TASK_STOPPED and
  ``stop_i2s_driver_`` disables the channel, at its next pass (16 ms). Until then
  the DMA plays on: the loudspeaker is silent ``STOP_S`` after the stop (the worst
  case), and nothing queued is heard after that. The state is STOPPED at once.
- ``speaker.mute_on`` / ``mute_off`` (``set_mute_state`` -> ``post_software_gain_``:
  software gain to silence; at a start the ramp is seeded at the target, so a
  speaker started muted is silent from its first sample): ``muted``. Here the gain
  applies as audio enters the ring; the firmware applies it as audio leaves the
  ring for the DMA (``apply_software_volume_``), and ramps at 1 ms per dB
  (``GAIN_RAMP_MS_PER_DB``, not modelled).

``played`` records what the loudspeaker emitted: each ``Played`` span has the loop
time its first sample was heard and its PCM, cut where a stop silenced it.
Not modelled: the < 10 ms silence a partly filled DMA buffer pads at an underrun.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
import enum

SPEAKER_BUFFER_SIZE = 16 * 1024
WRITE_CHUNK = 4 * 1024
BYTES_PER_S = 16000 * 2
DMA_S = 5 * 0.010
START_LATENCY_S = 0.032
STOP_S = 0.010 + 0.016  # the task's next DMA write, then the main loop's next pass
BUS_RETRY_S = 1.0
IDLE_STOP_S = 0.5


class Bus:
    """One I2S bus: ``try_lock``/``unlock`` as ``I2SAudioComponent`` (one holder)."""

    def __init__(self, name: str) -> None:
        """Make a free bus."""
        self.name = name
        self.holder: str | None = None

    def try_lock(self, who: str) -> bool:
        """Take the bus if free (or already ``who``'s)."""
        if self.holder in (None, who):
            self.holder = who
            return True
        return False

    def unlock(self, who: str) -> None:
        """Give the bus back (only its holder can)."""
        if self.holder == who:
            self.holder = None


class SpeakerState(enum.StrEnum):
    """``speaker::State``."""

    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"


@dataclass
class Played:
    """A stretch of audio the loudspeaker emitted."""

    at: float
    """Loop time its first sample was heard."""
    pcm: bytearray = field(repr=False)

    @property
    def end(self) -> float:
        """Loop time its last sample ended."""
        return self.at + len(self.pcm) / BYTES_PER_S


class SpeakerPath:
    """Voice-assistant buffer + I2S speaker of one device (see the module docstring)."""

    def __init__(
        self,
        bus: Bus,
        *,
        ring_ms: int = 100,
        speed: float = 1.0,
        note: Callable[[str], None] | None = None,
    ) -> None:
        """``bus``: the speaker's I2S bus; ``ring_ms``: the speaker's ``buffer_duration``."""
        self.bus = bus
        self.ring_bytes = max(50, ring_ms) * BYTES_PER_S // 1000
        self._speed = speed
        self._note = note or (lambda what: None)
        self._loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.allocated = False
        self.state = SpeakerState.STOPPED
        self.received_bytes = 0
        self.dropped_bytes = 0
        """API audio dropped whole because the 16 KiB buffer was full (or freed)."""
        self.bus_busy = 0
        """Speaker starts refused with "Parent bus is busy"."""
        self.played: list[Played] = []
        self.muted = False
        """``speaker.mute_on``: the speaker runs and takes audio, nothing is heard."""
        self.starts = 0
        self.stops: list[tuple[float, str]] = []
        self.silenced_at: list[float] = []
        """When the loudspeaker fell silent at each ``stop`` (``STOP_S`` later at most)."""
        self._free_at = 0.0  # when the ring has emptied into the DMA
        self._timer: asyncio.TimerHandle | None = None
        self._running = asyncio.Event()
        self.stopped = asyncio.Event()
        self.stopped.set()

    # -- the voice assistant's side ----------------------------------------------

    def allocate(self) -> None:
        """``allocate_buffers_`` + ``clear_buffers_`` (START_MICROPHONE)."""
        self.allocated = True
        self.clear()

    def clear(self) -> None:
        """``clear_buffers_``: the buffer is emptied (not what the speaker holds)."""
        self.buffer.clear()

    def free(self) -> None:
        """``deallocate_buffers_`` (IDLE)."""
        self.allocated = False
        self.buffer.clear()

    def feed(self, data: bytes) -> None:
        """``on_audio``: copy into the buffer if it fits (else drop), then write once."""
        if not self.allocated or len(self.buffer) + len(data) > SPEAKER_BUFFER_SIZE:
            self.dropped_bytes += len(data)
            if self.allocated:
                self._note("Cannot receive audio, buffer is full")
            return
        self.buffer += data
        self.received_bytes += len(data)
        self.write()

    def write(self) -> None:
        """``write_speaker_``: at most 4 KiB to ``speaker_->play``; the rest stays."""
        if not self.buffer:
            return
        chunk = bytes(self.buffer[:WRITE_CHUNK])
        written = self.play(chunk)
        del self.buffer[:written]

    # -- the speaker ----------------------------------------------------------------

    def play(self, data: bytes) -> int:
        """``I2SAudioSpeakerBase::play``: start if stopped; write what fits in the ring."""
        if self.state is SpeakerState.STOPPED:
            self.start()
        if self.state is not SpeakerState.RUNNING:
            return 0
        now = self._loop.time()
        queued = max(0.0, self._free_at - now) * BYTES_PER_S * self._speed
        room = max(0, self.ring_bytes - int(queued))
        room -= room % 2
        take = data[:room]
        if not take:
            return 0
        leaves = max(self._free_at, now)  # when its first sample leaves the ring
        self._free_at = leaves + len(take) / BYTES_PER_S / self._speed
        heard = leaves + DMA_S / self._speed
        self._arm_idle_stop()
        if self.muted:
            return len(take)
        last = self.played[-1] if self.played else None
        if last is not None and abs(last.end - heard) < 1e-6 and self._speed == 1.0:
            last.pcm += take
        else:
            self.played.append(Played(heard, bytearray(take)))
        return len(take)

    def start(self) -> None:
        """``start()``: STARTING; the driver takes the bus after the start latency."""
        if self.state is not SpeakerState.STOPPED:
            return
        self.state = SpeakerState.STARTING
        self.stopped.clear()
        self._schedule(START_LATENCY_S, self._start_driver)

    def _start_driver(self) -> None:
        if self.state is not SpeakerState.STARTING:
            return
        if not self.bus.try_lock("speaker"):
            self.bus_busy += 1
            self._note("Parent bus is busy")  # status_momentary_error: 1 s
            self._schedule(BUS_RETRY_S, self._start_driver)
            return
        self.state = SpeakerState.RUNNING
        self.starts += 1
        self._free_at = self._loop.time()  # the DMA is preloaded with silence
        self._running.set()
        self._arm_idle_stop()

    def stop(self, why: str = "stop") -> None:
        """``stop()``: the task ends now; nothing still queued is heard."""
        now = self._loop.time()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.state is SpeakerState.STOPPED:
            return
        until = now + STOP_S / self._speed
        for span in reversed(self.played):
            if span.end <= until:
                break
            keep = max(0, int((until - span.at) * BYTES_PER_S * self._speed))
            del span.pcm[keep - keep % 2 :]
        self.played = [span for span in self.played if span.pcm]
        self.silenced_at.append(min(until, max(now, self.silent_from())))
        self._finish_stop(now, why)

    def _finish_stop(self, now: float, why: str) -> None:
        self.state = SpeakerState.STOPPED
        self._free_at = 0.0
        self._running.clear()
        self.bus.unlock("speaker")
        self.stops.append((now, why))
        self.stopped.set()

    def _arm_idle_stop(self) -> None:
        """Stop the task ``timeout`` after it last read data from the ring."""
        if self._timer is not None:
            self._timer.cancel()
        due = max(self._free_at, self._loop.time()) + IDLE_STOP_S / self._speed
        self._timer = self._loop.call_at(due, self._idle_stop)

    def _idle_stop(self) -> None:
        self._timer = None
        if self.state is SpeakerState.RUNNING:
            self._finish_stop(self._loop.time(), "idle")

    def _schedule(self, delay: float, callback: Callable[[], None]) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(delay / self._speed, callback)

    @property
    def running(self) -> bool:
        """``is_running()``."""
        return self.state is SpeakerState.RUNNING

    def has_buffered_data(self) -> bool:
        """``has_buffered_data()``: the ring still holds audio."""
        return self.running and self._free_at > self._loop.time()

    def close(self) -> None:
        """Cancel the pending timer (the device shuts down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- what was heard ------------------------------------------------------------

    def heard_pcm(self, since: float = 0.0, until: float | None = None) -> bytes:
        """Audio emitted between ``since`` and ``until`` (default: by now), in order."""
        until = self._loop.time() if until is None else until
        out = bytearray()
        for span in self.played:
            if span.end <= since or span.at >= until:
                continue
            first = max(0, int((since - span.at) * BYTES_PER_S * self._speed))
            if until >= span.end:
                last = len(span.pcm)
            else:
                last = int((until - span.at) * BYTES_PER_S * self._speed)
            out += span.pcm[first - first % 2 : last - last % 2]
        return bytes(out)

    def silent_from(self) -> float:
        """Loop time from which the loudspeaker emits nothing more (as scheduled now)."""
        return max((span.end for span in self.played), default=0.0)
