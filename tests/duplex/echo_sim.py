"""A simulated room for duplex tests and the benchmark: the device plays, its mic hears.

``Device`` is the satellite: frames sent to it queue up and play at real time, one
10 ms step at a time. ``Room`` turns what the device played into what its mic hears:
the echo (a delay of 50–400 ms that drifts, attenuation, a direct path plus an
exponentially decaying diffuse tail), the user's speech and a little noise.
``SteppedClock`` is a virtual clock the driver advances step by step, so the paced
player and the mic run on one time line.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
import heapq
import itertools

import numpy as np

from custom_components.rtvoice.duplex.audio import FRAME_BYTES, SAMPLE_RATE

STEP_SAMPLES = FRAME_BYTES // 2  # 10 ms


class SteppedClock:
    """Virtual time that only moves when ``advance`` is called."""

    def __init__(self) -> None:
        """Start at 0 with nobody sleeping."""
        self._now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        """Return the virtual time."""
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the driver has advanced to ``deadline``."""
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._ids), future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time on and wake whoever is due."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now + 1e-9:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)


@dataclass
class Device:
    """The satellite's speaker: a queue of sent frames played 10 ms per step."""

    queue: bytearray = field(default_factory=bytearray)
    sent: list[tuple[float, int]] = field(default_factory=list)  # (time, bytes)
    clock: SteppedClock | None = None

    async def send(self, frame: bytes) -> None:
        """Receive one frame from the player."""
        self.queue += frame
        if self.clock is not None:
            self.sent.append((self.clock.now(), len(frame)))

    def play_step(self) -> np.ndarray:
        """Play the next 10 ms (silence when the queue is empty)."""
        chunk = bytes(self.queue[:FRAME_BYTES])
        del self.queue[:FRAME_BYTES]
        chunk += bytes(FRAME_BYTES - len(chunk))
        return np.frombuffer(chunk, dtype="<i2").astype(np.float64)


class Room:
    """The echo path from the device's speaker to its mic, plus the user and noise."""

    def __init__(
        self,
        *,
        delay_ms: float,
        gain_db: float = -8.0,
        drift_ms: float = 20.0,
        drift_period_s: float = 4.0,
        tail_db: float = -12.0,
        rt60_ms: float = 200.0,
        noise_dbfs: float = -65.0,
        seed: int = 0,
    ) -> None:
        """Describe the path: delay (drifting ±``drift_ms``), gain, reverb tail, noise."""
        self.rng = np.random.default_rng(seed)
        self.delay = delay_ms * SAMPLE_RATE / 1000
        self.drift = drift_ms * SAMPLE_RATE / 1000
        self.drift_period = drift_period_s * SAMPLE_RATE
        length = int(rt60_ms * SAMPLE_RATE / 1000)
        decay = np.exp(-6.9 * np.arange(length) / length)  # -60 dB over rt60
        tail = self.rng.standard_normal(length) * decay
        tail *= 10 ** (tail_db / 20) / np.sqrt(np.sum(tail**2))
        ir = np.zeros(length)
        ir[0] = 1.0
        ir[8:] += tail[:-8]  # diffuse tail after the direct path
        self.ir = ir * 10 ** (gain_db / 20)
        self.noise = 32768 * 10 ** (noise_dbfs / 20)
        self.history = np.zeros(
            int(self.delay + self.drift + length + 2 * STEP_SAMPLES)
        )
        self.samples = 0

    def mic_step(self, played: np.ndarray, user: np.ndarray | None = None) -> bytes:
        """Return the next 10 ms at the mic, given the 10 ms the device just played."""
        self.history = np.concatenate([self.history[STEP_SAMPLES:], played])
        phase = 2 * np.pi * self.samples / self.drift_period
        delay = int(self.delay + self.drift * np.sin(phase))
        self.samples += STEP_SAMPLES
        end = len(self.history) - delay
        start = end - STEP_SAMPLES - len(self.ir) + 1
        echo = np.convolve(self.history[start:end], self.ir, mode="valid")
        mic = echo + self.rng.standard_normal(STEP_SAMPLES) * self.noise
        if user is not None:
            mic = mic + user
        return np.clip(mic, -32768, 32767).astype("<i2").tobytes()


def pcm_steps(pcm: bytes) -> list[np.ndarray]:
    """Cut PCM into 10 ms float steps (the last one padded)."""
    pcm += bytes(-len(pcm) % FRAME_BYTES)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return [samples[i : i + STEP_SAMPLES] for i in range(0, len(samples), STEP_SAMPLES)]


async def settle(player, lead_bytes: int) -> None:
    """Let the player send every frame due by now (it runs on the stepped clock)."""
    for _ in range(64):
        due = (
            player.state.value == "playing"
            and player.queued_bytes >= player.frame_bytes
            and player.device_queued_bytes() < lead_bytes
        )
        if not due:
            return
        await asyncio.sleep(0)


@dataclass
class Drive:
    """Steps a session, its device and its room together, 10 ms at a time."""

    session: object
    device: Device
    room: Room
    clock: SteppedClock
    chunk_ms: int = 32  # ESPHome mic chunks
    lead_bytes: int = 100 * 32
    mic: bytearray = field(default_factory=bytearray)
    steps: int = 0
    device_reference: bool = False  # send what played as a second channel
    played: bytearray = field(default_factory=bytearray)

    async def step(self, user: np.ndarray | None = None) -> None:
        """Advance 10 ms: the device plays, the mic hears, the session gets whole chunks."""
        self.clock.advance(0.01)
        for _ in range(4):  # TTS tasks and the player catch up
            await asyncio.sleep(0)
        await settle(self.session.player, self.lead_bytes)
        played = self.device.play_step()
        self.mic += self.room.mic_step(played, user)
        self.played += played.astype("<i2").tobytes()
        self.steps += 1
        chunk = self.chunk_ms * 32
        while len(self.mic) >= chunk:
            if self.device_reference:  # MULTI_CHANNEL_AUDIO: mic and reference
                self.session.feed_mic(
                    bytes(self.mic[:chunk]), bytes(self.played[:chunk])
                )
            else:
                self.session.feed_mic(bytes(self.mic[:chunk]))
            del self.mic[:chunk]
            del self.played[:chunk]


SENTENCES = (
    "The kitchen light is now on.",
    "It is twenty one degrees in the living room.",
    "Your next meeting starts at three o'clock this afternoon.",
)


class AnswerTts:
    """TTS from pre-made clips (espeak speech, so the echo sounds like speech)."""

    def __init__(self, clips: dict[str, bytes]) -> None:
        """Answer each sentence with its clip."""
        self.clips = clips

    async def __call__(self, text: str):
        """Yield the clip in 50 ms chunks."""
        clip = self.clips[text]
        for i in range(0, len(clip), 1600):
            yield clip[i : i + 1600]


@dataclass
class AnswerRun:
    """What happened while one answer played in the simulated room."""

    pushes: int
    pauses: int
    false_barge_ins: int
    pause_gaps_ms: list[int]  # pause -> resume, mic time, per false barge-in
    utterances: int
    onset_to_last_frame_ms: (
        float | None
    )  # user onset in the mic -> last answer frame sent
    onset_to_pause_ms: float | None  # user onset -> the pause decision (mic time)
    heard_chars: int | None
    answer_chars: int
    dsp_seconds: float  # wall time spent in feed_mic (VAD, gate, AEC)
    mic_seconds: float  # mic audio processed


async def run_answer(
    clips: dict[str, bytes],
    *,
    aec: bool,
    delay_ms: float,
    seed: int,
    user: bytes | None = None,
    user_at_ms: int = 0,
    drift_ms: float = 2.0,
    gain_db: float = -8.0,
    sentences: tuple[str, ...] = SENTENCES,
    stt_text: str = "words",
    echo_gate: bool = False,
    engine: str = "aec3",
    room: object | None = None,
    echo: object | None = None,
    device_reference: bool = False,
    room_level: object | None = None,
) -> AnswerRun:
    """Play one answer in a simulated room, optionally with the user talking over it.

    ``room``: a room with ``mic_step`` (``tests.duplex.room.RealRoom``) instead of
    this module's ``Room``; ``echo``: a canceller to use (kept across answers by a
    benchmark) instead of a fresh one of ``engine``; ``device_reference``: the
    device sends what it played as a second channel (``MULTI_CHANNEL_AUDIO``);
    ``room_level``: the satellite's ``RoomLevel`` (kept across answers, as the
    product keeps it across conversations).
    """
    import time  # noqa: PLC0415

    from custom_components.rtvoice.duplex import (  # noqa: PLC0415
        DuplexOptions,
        DuplexSession,
        EchoCanceller,
    )
    from tests.duplex.fakes import FakeChild  # noqa: PLC0415

    clock = SteppedClock()
    device = Device(clock=clock)
    child = FakeChild()

    async def stt(pcm: bytes) -> str:
        return stt_text  # a real STT transcribes echo of speech as words too

    session = DuplexSession(
        child,
        stt=stt,
        tts=AnswerTts(clips),
        send=device.send,
        clock=clock,
        echo=echo
        if echo is not None
        else EchoCanceller(engine=engine)
        if aec
        else None,
        echo_gate=echo_gate,
        room=room_level,  # type: ignore[arg-type]
        options=DuplexOptions(end_silence_ms=0),
    )
    if room is None:
        room = Room(
            delay_ms=delay_ms,
            seed=seed,
            drift_ms=drift_ms,
            drift_period_s=60,
            gain_db=gain_db,
        )
    drive = Drive(session, device, room, clock, device_reference=device_reference)  # type: ignore[arg-type]
    dsp = 0.0
    original_feed = session.feed_mic

    def timed_feed(pcm: bytes, reference: bytes | None = None) -> None:
        nonlocal dsp
        started = time.perf_counter()
        original_feed(pcm, reference)
        dsp += time.perf_counter() - started

    session.feed_mic = timed_feed  # type: ignore[method-assign]
    for _ in range(80):  # room noise before the answer
        await drive.step()
    text = " ".join(sentences)
    for sentence in sentences:
        session.output_delta(1, sentence + " ")
    session.output_end(1)
    start_step = drive.steps
    user_steps = pcm_steps(user) if user is not None else []
    user_start = start_step + user_at_ms // 10
    onset_time: float | None = None
    while not child.acked_final.is_set() and drive.steps < start_step + 3000:
        index = drive.steps - user_start
        voice = user_steps[index] if 0 <= index < len(user_steps) else None
        if voice is not None and onset_time is None and np.abs(voice).max() > 300:
            onset_time = clock.now()  # the step whose 10 ms hold the user's onset
        await drive.step(voice)
    for _ in range(60):  # let a pending transcription land
        await drive.step()
    stats = session.stats
    last_frame: float | None = None
    onset_to_pause: float | None = None
    onset_ms = onset_time * 1000 if onset_time is not None else None
    pauses_after = [
        m for m in stats.pause_mic_ms if onset_ms is not None and m > onset_ms
    ]
    if onset_ms is not None and stats.barge_ins and pauses_after:
        # Mic sample time and the clock share their origin in this simulation;
        # onset_ms is the start of the 10 ms step that holds the user's onset.
        pause_ms = pauses_after[0]
        last_frame = max(0.0, max(t for t, _ in device.sent) * 1000 - onset_ms)
        onset_to_pause = pause_ms - onset_ms
    finals = child.finals()
    await session.aclose()
    return AnswerRun(
        pushes=stats.pushes,
        pauses=stats.pauses,
        false_barge_ins=stats.false_barge_ins,
        pause_gaps_ms=list(stats.pause_gaps_ms),
        utterances=stats.utterances,
        onset_to_last_frame_ms=last_frame,
        onset_to_pause_ms=onset_to_pause,
        heard_chars=finals[0][1] if finals else None,
        answer_chars=len(text) + 1,
        dsp_seconds=dsp,
        mic_seconds=drive.steps / 100,
    )
