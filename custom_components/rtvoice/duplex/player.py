"""Paced playback: TTS audio to a transport at real-time pace with a small lead.

Audio queued on the device cannot be stopped, so the player keeps at most ``lead_ms``
(default 100 ms) there: it models the device's queue (each frame sent adds one frame
time to when the device runs dry) and sends the next frame only when less than the
lead is left. ``pause()`` stops sending at once — no frame is sent after it returns —
``resume()`` continues with the next unsent byte, ``stop()`` drops the rest.

Positions are byte offsets in everything sent to the transport since the player was
made (padding included). ``played_bytes()`` is what the device has played by now:
sent minus what is still queued there.

A device that can drop what it holds (the project firmware's speaker action) lets
the paused player go back: ``rewind(position)`` queues again what was sent from
``position`` on (the last ``RESEND_MS`` of the answer are kept for it), so a resumed
answer continues where the user stopped hearing it. ``hold()``/``release()`` keep
frames back without pausing (the device must be ready first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
import contextlib
import enum
import logging

from .audio import BYTES_PER_MS, FRAME_MS
from .clock import Clock, LoopClock

_LOGGER = logging.getLogger(__name__)

Send = Callable[[bytes], Awaitable[None]]

RESEND_MS = 1000  # sent audio kept for ``rewind`` (bounded: 32 KB)


class PlayerState(enum.Enum):
    """Whether frames may be sent."""

    PLAYING = "playing"  # sends whenever audio is queued (idle when none is)
    PAUSED = "paused"
    CLOSED = "closed"


class PacedPlayer:
    """Sends queued PCM in frames of ``frame_ms``, ``lead_ms`` ahead of the device."""

    def __init__(
        self,
        send: Send,
        *,
        clock: Clock | None = None,
        frame_ms: int = FRAME_MS,
        lead_ms: int = 100,
    ) -> None:
        """Send frames through ``send``; pace them on ``clock`` (default: the loop's)."""
        if frame_ms <= 0 or lead_ms < 0:
            raise ValueError("frame_ms must be positive and lead_ms not negative")
        self._send = send
        self.clock: Clock = clock if clock is not None else LoopClock()
        self.frame_bytes = frame_ms * BYTES_PER_MS
        self._lead_s = lead_ms / 1000
        self.state = PlayerState.PLAYING
        self._buffer = bytearray()
        self._finished = True  # no partial frame is waiting for more audio
        self.sent_bytes = 0
        self.enqueued_bytes = 0
        self._device_free_at = 0.0  # when the device's queue runs dry
        self.frame_play_at = 0.0  # when the frame being sent will start playing
        # True when that frame plays right after the previous one (the device's queue
        # had not run dry): the device's output is one unbroken stream there.
        self.frame_follows = False
        self._changed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.paused_at_played: int | None = None  # played_bytes() when paused
        self._history = bytearray()  # the last sent bytes, up to ``sent_bytes``
        self._floor = 0  # no rewind before this (the start of the current answer)
        self.held = False  # ``hold``: nothing is sent until ``release``

    # --- feeding -----------------------------------------------------------------

    def enqueue(self, pcm: bytes) -> int:
        """Queue PCM after what is queued; return its start position."""
        self._check_open()
        start = self.enqueued_bytes
        if pcm:  # an odd byte waits for its other half (chunks may split samples)
            self._buffer += pcm
            self.enqueued_bytes += len(pcm)
            self._finished = False
            self._idle.clear()
            self._kick()
        return start

    def finish(self) -> None:
        """No more audio follows for now: pad the last partial frame and send it."""
        self._check_open()
        remainder = len(self._buffer) % self.frame_bytes
        if remainder:
            padding = self.frame_bytes - remainder
            self._buffer += bytes(padding)
            self.enqueued_bytes += padding
        self._finished = True
        self._kick()

    # --- control -----------------------------------------------------------------

    def pause(self) -> None:
        """Stop sending now; what is queued stays queued."""
        if self.state is PlayerState.PLAYING:
            self.state = PlayerState.PAUSED
            self.paused_at_played = self.played_bytes()

    def resume(self) -> None:
        """Continue with the next unsent byte."""
        if self.state is PlayerState.PAUSED:
            self.state = PlayerState.PLAYING
            self.paused_at_played = None
            self._kick()

    def hold(self) -> None:
        """Send nothing until ``release`` (pause and resume go on meanwhile)."""
        self.held = True

    def release(self) -> None:
        """End ``hold``."""
        if self.held:
            self.held = False
            self._kick()

    @property
    def can_rewind(self) -> bool:
        """Whether ``rewind`` may be called: paused, or held (no frame goes out)."""
        return self.state is PlayerState.PAUSED or (
            self.held and self.state is PlayerState.PLAYING
        )

    def rewind(self, position: int) -> int:
        """Paused or held, the device dropped what it held: send again from ``position``.

        ``position`` is raised to what can be sent again (the current answer's
        start, the last ``RESEND_MS``); the device's queue counts as empty from
        now. Return the position sending continues from.
        """
        if not self.can_rewind:
            raise RuntimeError("rewind needs a paused or held player")
        earliest = max(self._floor, self.sent_bytes - len(self._history))
        position = min(self.sent_bytes, max(position, earliest))
        position -= (position - earliest) % 2
        again = len(self._history) - (self.sent_bytes - position)
        if again < len(self._history):
            self._buffer[:0] = self._history[again:]
            del self._history[again:]
            self._idle.clear()
        self.sent_bytes = position
        self._floor = position  # what was sent before it has been heard
        self._device_free_at = self.clock.now()
        return position

    def stop(self) -> int:
        """Drop everything not yet sent (and leave pause); return the bytes dropped."""
        dropped = len(self._buffer)
        self._buffer.clear()
        self._history.clear()
        self._floor = self.sent_bytes
        self.enqueued_bytes = self.sent_bytes
        self._finished = True
        if self.state is PlayerState.PAUSED:
            self.state = PlayerState.PLAYING
            self.paused_at_played = None
        self._idle.set()
        self._kick()
        return dropped

    async def aclose(self) -> None:
        """Drop what is queued and end the sending task."""
        self.stop()
        self.state = PlayerState.CLOSED
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- what was played -----------------------------------------------------------

    @property
    def queued_bytes(self) -> int:
        """Bytes queued here, not yet sent."""
        return len(self._buffer)

    def device_queued_bytes(self) -> int:
        """Bytes sent but not yet played by the device, by now."""
        left = max(0.0, self._device_free_at - self.clock.now())
        return min(self.sent_bytes, int(left * 1000) * BYTES_PER_MS)

    def played_bytes(self) -> int:
        """Position the device has played up to, by now."""
        return self.sent_bytes - self.device_queued_bytes()

    async def played(self) -> None:
        """Return once everything queued has been sent and played (paused: waits)."""
        while True:
            await self._idle.wait()
            if self._buffer or self.state is not PlayerState.PLAYING:
                self._idle.clear()
                continue
            if self.clock.now() >= self._device_free_at:
                return
            await self.clock.sleep_until(self._device_free_at)

    # --- the sending task ------------------------------------------------------------

    def _check_open(self) -> None:
        if self.state is PlayerState.CLOSED:
            raise RuntimeError("the player is closed")

    def _kick(self) -> None:
        self._changed.set()
        if self._task is None and self.state is not PlayerState.CLOSED:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="rtvoice duplex player"
            )

    def _next_frame_ready(self) -> bool:
        if self.state is not PlayerState.PLAYING or not self._buffer or self.held:
            return False
        return len(self._buffer) >= self.frame_bytes or self._finished

    async def _run(self) -> None:
        clock = self.clock
        while True:
            if not self._next_frame_ready():
                if not self._buffer and self.state is PlayerState.PLAYING:
                    self._idle.set()
                self._changed.clear()
                await self._changed.wait()
                continue
            deadline = self._device_free_at - self._lead_s
            if deadline > clock.now():
                await clock.sleep_until(deadline)
                continue  # paused or stopped meanwhile? look again
            frame = bytes(self._buffer[: self.frame_bytes])
            del self._buffer[: self.frame_bytes]
            self.sent_bytes += len(frame)
            self._history += frame
            if len(self._history) > RESEND_MS * BYTES_PER_MS:
                del self._history[: len(self._history) - RESEND_MS * BYTES_PER_MS]
            now = clock.now()
            self.frame_follows = self.sent_bytes > len(frame) and (
                self._device_free_at >= now
            )
            self.frame_play_at = max(self._device_free_at, now)
            self._device_free_at = self.frame_play_at + (
                len(frame) / BYTES_PER_MS / 1000
            )
            try:
                await self._send(frame)
            except asyncio.CancelledError:
                raise
            except Exception:
                _LOGGER.exception("Sending an audio frame failed; dropping the rest")
                self.stop()
