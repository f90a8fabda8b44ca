"""The device's speaker: media-player URLs fetched over HTTP, raw API audio buffered.

A media-player device (no ``SPEAKER`` feature) plays TTS by fetching the URL from the
``TTS_END`` event (or ``INTENT_PROGRESS`` with ``tts_start_streaming``, or an announcement's
``media_id``) with an HTTP GET, streaming the body as it arrives. A ``Playback`` records
when the first and last byte arrived, how many, their format, and when playing ended:
playing takes the audio's duration (from the WAV header) at the device's speed, so a
playback never ends before its audio could have been heard.

A WAV body is also played as it arrives, as a media player's pipeline does: the play
position advances at real-time pace while audio is there and stalls (the speaker
plays silence) when the body stalls, so a live stream served at real-time pace plays
in step with it. ``Playback.ahead_bytes`` records, at each arrival, how much audio
had been fetched and not yet played (the device-side queue); ``played_bytes`` is the
position reached when the playback finished or was stopped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
import io
import wave

import aiohttp

USER_AGENT = "esphome-emulator (ESPHome media player)"
PCM_RATE = 16000
PCM_WIDTH = 2
PCM_CHANNELS = 1


@dataclass(frozen=True)
class AudioFormat:
    """What the bytes were."""

    codec: str
    """``wav``, ``flac``, ``mp3``, ``pcm`` (raw API audio) or ``unknown``."""
    sample_rate: int = 0
    channels: int = 0
    sample_width: int = 0

    def seconds(self, byte_count: int) -> float | None:
        """Duration of ``byte_count`` bytes of PCM, when the format says."""
        frame = self.channels * self.sample_width
        if not frame or not self.sample_rate:
            return None
        return byte_count / frame / self.sample_rate


PCM16K = AudioFormat("pcm", PCM_RATE, PCM_CHANNELS, PCM_WIDTH)


def sniff_format(head: bytes, content_type: str = "") -> AudioFormat:
    """Recognise a WAV/FLAC/MP3 stream from its first bytes."""
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        try:
            with wave.open(io.BytesIO(head), "rb") as wav:
                return AudioFormat(
                    "wav", wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
                )
        except (wave.Error, EOFError):
            return AudioFormat("wav")
    if head.startswith(b"fLaC"):
        return AudioFormat("flac")
    if head.startswith(b"ID3") or (
        len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
    ):
        return AudioFormat("mp3")
    if "wav" in content_type:
        return AudioFormat("wav")
    return AudioFormat("unknown")


@dataclass
class Playback:
    """One thing the speaker played (or tried to)."""

    source: str
    """``tts_end``, ``tts_streaming`` (INTENT_PROGRESS), ``announce``, ``preannounce``,
    ``media_player`` (a media player command) or ``api`` (raw API audio)."""
    url: str = ""
    requested_at: float = 0.0
    status: int | None = None
    content_type: str = ""
    first_byte_at: float | None = None
    last_byte_at: float | None = None
    bytes: int = 0
    format: AudioFormat | None = None
    finished_at: float | None = None
    """When the audio had been played out (``None`` while playing or when stopped)."""
    stopped: bool = False
    """Cut before it finished (a new run, a stop command, a disconnect)."""
    error: str | None = None
    audible: bool = True
    """False for raw API audio this firmware would not play (no ``speaker:``)."""
    data: bytearray = field(default_factory=bytearray, repr=False)
    played_bytes: int = 0
    """PCM bytes played (WAV streams: when finished or stopped)."""
    ahead_bytes: list[int] = field(default_factory=list, repr=False)
    """PCM fetched but not yet played, measured at each arrival (WAV streams)."""
    stalls: int = 0
    """Times the body ran dry while playing (the speaker played silence)."""
    stopped_at: float | None = None

    @property
    def max_ahead_bytes(self) -> int:
        """The largest device-side queue seen (0 when not measured)."""
        return max(self.ahead_bytes, default=0)

    @property
    def audio_seconds(self) -> float | None:
        """Duration of the received audio when the format says (WAV header excluded)."""
        if self.format is None:
            return None
        payload = self.bytes - (44 if self.format.codec == "wav" else 0)
        return self.format.seconds(max(payload, 0))

    @property
    def pcm(self) -> bytes:
        """The audio frames (WAV body or raw API audio)."""
        if self.format is not None and self.format.codec == "wav":
            try:
                with wave.open(io.BytesIO(bytes(self.data)), "rb") as wav:
                    return wav.readframes(wav.getnframes())
            except (wave.Error, EOFError):
                return bytes(self.data[44:])
        return bytes(self.data)


class Speaker:
    """Fetches and "plays" audio at the device's speed, on the loop clock."""

    def __init__(self, session: aiohttp.ClientSession, speed: float) -> None:
        """Use ``session`` for HTTP; ``speed`` scales playing time."""
        self._session = session
        self._speed = speed
        self._loop = asyncio.get_running_loop()

    async def play_url(self, playback: Playback) -> None:
        """Fetch ``playback.url`` as a media player does, then wait out its duration.

        Fills ``playback`` as bytes arrive; raises nothing for HTTP/network errors
        (``playback.error`` says), ``CancelledError`` when stopped.
        """
        playback.requested_at = self._loop.time()
        clock = _PlayClock(playback, self._speed)
        try:
            async with self._session.get(
                playback.url, headers={"User-Agent": USER_AGENT}
            ) as response:
                playback.status = response.status
                playback.content_type = response.headers.get("Content-Type", "")
                if response.status != 200:
                    playback.error = f"HTTP {response.status}"
                    return
                async for chunk in response.content.iter_any():
                    now = self._loop.time()
                    if playback.first_byte_at is None:
                        playback.first_byte_at = now
                    playback.last_byte_at = now
                    clock.advance(now)
                    playback.bytes += len(chunk)
                    playback.data.extend(chunk)
                    if playback.format is None and len(playback.data) >= 44:
                        playback.format = sniff_format(
                            bytes(playback.data[:64]), playback.content_type
                        )
                    clock.arrived(now)
        except asyncio.CancelledError:
            playback.stopped = True
            playback.stopped_at = self._loop.time()
            clock.advance(playback.stopped_at)
            raise
        except (aiohttp.ClientError, TimeoutError, ValueError) as err:
            playback.error = f"{type(err).__name__}: {err}"
            return
        if playback.format is None or not playback.format.sample_rate:
            # A header longer than the first sniff (ffmpeg adds a LIST chunk) is
            # read again from the whole body.
            playback.format = sniff_format(bytes(playback.data), playback.content_type)
        await self.play_out(playback, clock)

    async def play_out(
        self, playback: Playback, clock: _PlayClock | None = None
    ) -> None:
        """Wait until the received audio has been heard, then stamp ``finished_at``."""
        start = playback.first_byte_at
        seconds = playback.audio_seconds
        delay = 0.0
        if start is not None and seconds is not None:
            delay = start + seconds / self._speed - self._loop.time()
        if clock is not None:
            clock.advance(self._loop.time())
            delay = max(delay, clock.remaining_seconds())
        if delay > 0:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                playback.stopped = True
                playback.stopped_at = self._loop.time()
                if clock is not None:
                    clock.advance(playback.stopped_at)
                raise
        playback.finished_at = self._loop.time()
        if clock is not None:
            clock.advance(playback.finished_at)


class _PlayClock:
    """Where a media player's pipeline is in a WAV body that arrives over time."""

    def __init__(self, playback: Playback, speed: float) -> None:
        self._playback = playback
        self._speed = speed
        self._position = 0.0  # PCM bytes played
        self._at: float | None = None  # when ``_position`` was last brought forward
        self._dry = False  # the position caught up with what had arrived

    def _rate(self) -> float:
        fmt = self._playback.format
        if fmt is None or fmt.codec != "wav" or not fmt.sample_rate:
            return 0.0
        return fmt.sample_rate * fmt.channels * fmt.sample_width * self._speed

    def _received(self) -> int:
        return max(0, self._playback.bytes - 44)

    def advance(self, now: float) -> None:
        """Bring the play position to ``now`` (it cannot pass what has arrived)."""
        rate = self._rate()
        if not rate or self._at is None:
            return
        received = float(self._received())
        position = self._position + (now - self._at) * rate
        if position >= received:
            position, self._dry = received, True
        self._position = position
        self._at = now
        self._playback.played_bytes = int(position)

    def arrived(self, now: float) -> None:
        """Record the queue after an arrival at ``now``."""
        if not self._rate() or not self._received():
            return
        if self._at is None:
            self._at = now  # playing starts with the first audio
        elif self._dry:
            self._playback.stalls += 1
        self._dry = False
        self._playback.ahead_bytes.append(self._received() - int(self._position))

    def remaining_seconds(self) -> float:
        """Time to play what has arrived and not been played."""
        rate = self._rate()
        return (self._received() - self._position) / rate if rate else 0.0
