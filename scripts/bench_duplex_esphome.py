"""Duplex benchmarks through the real ESPHome path (issue 10 §4): rows 12-16 of ``scripts/bench``.

Printed, never asserted. The path is the product's: the emulated ESPHome device
(``tests/peers/esphome``, firmware 2026.9, a speaker: raw API audio, Noise encrypted)
<-> the real ``aioesphomeapi`` client inside ``EsphomeLink`` <-> ``DuplexConversation``
<-> a real ``Kernel`` whose ``OpenAIChatProvider`` talks HTTP to the loopback OpenAI
peer (``tests/peers/openai_server.py``, answering at once). STT and TTS are instant
in-process callables (the "instant STT/LLM/TTS peers" of the issue): STT returns the
scripted text at once, TTS yields pre-made espeak-ng clips of each answer sentence,
so the figures are the integration's own cost.

Onset truth: the bench's microphone (a subclass of the emulator's) knows in which mic
frame a spoken clip starts and where its first and last loud samples lie; the loop
time of a mic sample is the mic clock's (the emulator captures frame ``i`` at
``start + (i + 1) * 32 ms``). Answer frames are timed when the device receives them
(same process and loop as the link: loopback TCP, well under a millisecond).

- 12: speech onset in the mic stream -> last answer audio frame the device receives
  (``vad`` barge-in, no echo), over a chain of barge-ins in one conversation.
- 13: end of the utterance in the mic stream -> first frame of the new answer (VAD
  tail + the segmenter's hangover + STT + kernel + HTTP + TTS, instant peers).
- 14: false barge-in (200 ms noise burst, STT hears no words): the hole in the
  answer audio at the device (last frame before the resume -> first after it).
- 15: CPU per duplex stream with 20 streams at once, ``vad`` mode with server AEC,
  the devices (in a separate process, so their CPU is not counted) hearing their own
  echo: this process's CPU seconds per stream-second and its event-loop lag p99.
- 16: echo (``tests/duplex/echo_sim.py``'s room: 50-400 ms delay drifting, -14..-6 dB,
  a reverberant tail) in ``vad`` mode with server AEC: self-interruptions per 100
  answers (STT answers "words" to every utterance, as a real STT transcribes echoed
  speech), onset -> last frame over echo; and ``wake_word`` mode over the same echo.

Run: ``.venv/bin/python scripts/bench_duplex_esphome.py [--quick] [--only 12,16]``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
from collections.abc import AsyncIterator, Callable
import contextlib
from dataclasses import dataclass, field
import multiprocessing
from multiprocessing.connection import Connection
from pathlib import Path
import random
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.duplex import (
    BargeIn,
    DuplexOptions,
    EchoCanceller,
    SessionState,
    echo_unavailable_reason,
)
from custom_components.rtvoice.duplex_link import DuplexBinding, RoundEnds
from custom_components.rtvoice.esphome_link import EsphomeLink, LinkConfig
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from scripts.bench_kernel import Row, pct
from tests.duplex.conftest import noise
from tests.duplex.echo_sim import Room
from tests.peers.esphome import ATOM_ECHO_FEATURES, EmulatedDevice
from tests.peers.esphome.mic import FRAME_BYTES, FRAME_SECONDS, Frame, Microphone
from tests.peers.openai_server import DEFAULT_MODEL, OpenAIPeer, Text
from tests.peers.speech import speak

FIRMWARE = "2026.9.0"  # raw API audio plays; never answers the login
SAFETY = 60.0  # seconds: a safety net against hangs, never a synchronisation
SPEAKER_AT_ARRIVAL = False  # --speaker-at-arrival (see RoomMic)
RATE = 16000
LOUD = 300  # |sample| above this counts as sound (about -41 dBFS)
ASK = "turn on the kitchen lights"
SENTENCES = (
    "The kitchen light is now on.",
    "It is twenty one degrees in the living room.",
    "Your next meeting starts at three this afternoon.",
    "The washing machine will be done in ten minutes.",
    "Tomorrow will be sunny with a light breeze from the west.",
)
ANSWER = " ".join(SENTENCES)
SHORT_ANSWER = " ".join(SENTENCES[:2])
USERS = (
    ("no wait turn it off", "en-gb+f3"),
    ("stop", "en-us+m3"),
    ("what about the bedroom", "en-us+f2"),
    ("actually make it warmer", "en-gb"),
)


# --------------------------------------------------------------------------- speech


class InstantSpeech:
    """In-process STT and TTS that answer at once (the integration's own cost only)."""

    def __init__(self, clips: dict[str, bytes]) -> None:
        """TTS answers each known sentence with its clip; STT answers ``reply``."""
        self.clips = clips
        self.reply = "words"
        self.stt_calls = 0
        self.stt_at: float | None = None  # loop time of the last transcription

    async def stt(self, pcm: bytes) -> str:
        """Return the scripted transcript."""
        self.stt_calls += 1
        self.stt_at = asyncio.get_running_loop().time()
        return self.reply

    async def tts(self, text: str) -> AsyncIterator[bytes]:
        """Yield the sentence's clip in 100 ms chunks (a miss is made once, cached)."""
        key = text.strip()
        clip = self.clips.get(key)
        if clip is None:
            clip = await asyncio.to_thread(speak, key, lead_ms=0, tail_ms=100)
            self.clips[key] = clip
        for start in range(0, len(clip), 3200):
            yield clip[start : start + 3200]


def answer_clips() -> dict[str, bytes]:
    """espeak-ng clips of the answer sentences (the echo then sounds like speech)."""
    return {s: speak(s, lead_ms=0, tail_ms=100) for s in SENTENCES}


def loud_span(pcm: bytes) -> tuple[int, int]:
    """First and last loud sample of a clip."""
    samples = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    loud = np.flatnonzero(samples > LOUD)
    return int(loud[0]), int(loud[-1]) + 1


# --------------------------------------------------------------------------- the room


@dataclass
class Spoken:
    """A clip said into the mic: where its sound starts and ends, in loop time."""

    onset_sample: int
    end_sample: int
    onset_at: float | None = None
    end_at: float | None = None
    heard: asyncio.Event = field(default_factory=asyncio.Event)  # fully captured


class RoomMic(Microphone):
    """The emulator's mic, plus onset truth and (optionally) the echo of a ``Room``.

    The device's speaker plays what it received at real time, one mic frame at a
    time (its queue is what the paced player keeps ahead); ``Room`` turns what it
    played into the echo the mic hears.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        room: Room | None,
        *,
        at_arrival: bool = False,
    ) -> None:
        """No speech queued, nothing played yet.

        ``at_arrival``: audio reaching an idle speaker starts playing at its arrival
        (the paced player's model of the device); otherwise at the start of the mic
        frame being captured (up to 32 ms earlier, as a device whose speaker and mic
        run on the same 32 ms buffers).
        """
        super().__init__()
        self.loop = loop
        self.room = room
        self.at_arrival = at_arrival
        self.played_samples = 0  # speaker samples rendered into the echo so far
        self.speaker = bytearray()
        self.echo_samples = np.zeros(0)
        self.origin: float | None = None  # loop time of mic sample 0 of the run
        self.spoken: Spoken | None = None
        self._starting: Spoken | None = None

    def hear_speaker(self, pcm: bytes) -> None:
        """Queue answer audio the device received: it plays after what is queued."""
        if self.room is None:
            return
        if self.at_arrival and not self.speaker and self.origin is not None:
            arrival = round((self.loop.time() - self.origin) * RATE)
            gap = arrival - self.played_samples
            if gap > 0:  # the idle speaker starts at the arrival, not before
                self.speaker += bytes(2 * gap)
        self.speaker += pcm

    def say(self, pcm: bytes) -> Spoken:
        """Queue a clip for the mic (nothing else queued); its truth record."""
        if self.pending:
            raise RuntimeError("the mic is still saying something")
        onset, end = loud_span(pcm)
        self.spoken = self._starting = Spoken(onset, end)
        self.queue(pcm)
        return self.spoken

    def capture(self, index: int) -> Frame:
        """Capture frame ``index``; note when a queued clip starts and ends."""
        now = self.loop.time()
        if index == 0:
            self.origin = None
            self.played_samples = 0
        bound = now - (index + 1) * FRAME_SECONDS  # the mic clock's start, or later
        self.origin = bound if self.origin is None else min(self.origin, bound)
        starting, self._starting = self._starting, None
        if starting is not None:
            first = index * FRAME_BYTES // 2  # the clip starts with this frame
            starting.onset_at = self.origin + (first + starting.onset_sample) / RATE
            starting.end_at = self.origin + (first + starting.end_sample) / RATE
        frame = super().capture(index)
        if frame.last_speech and self.spoken is not None:
            self.spoken.heard.set()
        if self.room is None:
            return frame
        samples = FRAME_BYTES // 2
        while len(self.echo_samples) < samples:
            step = bytes(self.speaker[:320])
            del self.speaker[:320]
            self.played_samples += 160
            played = np.frombuffer(step + bytes(320 - len(step)), dtype="<i2")
            heard = self.room.mic_step(played.astype(np.float64))
            self.echo_samples = np.concatenate(
                [self.echo_samples, np.frombuffer(heard, dtype="<i2")]
            )
        echo, self.echo_samples = (
            self.echo_samples[:samples],
            self.echo_samples[samples:],
        )
        mixed = np.frombuffer(frame.pcm, dtype="<i2").astype(np.int32) + echo
        pcm = np.clip(mixed, -32768, 32767).astype("<i2").tobytes()
        return Frame(index, pcm, speech=frame.speech, last_speech=frame.last_speech)


def room(seed: int, gain_db: float, delay_ms: float) -> Room:
    """Return the echo path of tests/duplex/echo_sim.py (slow drift, as bench_duplex.py)."""
    return Room(
        delay_ms=delay_ms, gain_db=gain_db, drift_ms=2.0, drift_period_s=60, seed=seed
    )


@dataclass
class States:
    """Session states with their loop times, and an event-driven wait."""

    seen: list[tuple[SessionState, float]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, state: SessionState) -> None:
        """Record a state."""
        self.seen.append((state, asyncio.get_running_loop().time()))
        self.changed.set()

    def mark(self) -> int:
        """Index of the next state."""
        return len(self.seen)

    async def wait_for(self, *states: SessionState, after: int = 0) -> int:
        """Index of the first of ``states`` at ``after`` or later."""
        async with asyncio.timeout(SAFETY):
            while True:
                for index in range(after, len(self.seen)):
                    if self.seen[index][0] in states:
                        return index
                self.changed.clear()
                await self.changed.wait()


class Satellite:
    """One emulated device, its room mic, its link, what it received and when."""

    def __init__(self, device: EmulatedDevice, mic: RoomMic, link: EsphomeLink) -> None:
        """Bind the parts (see ``satellite``)."""
        self.device = device
        self.mic = mic
        self.link = link
        self.states = States()
        self.frames: list[float] = []  # loop time of each answer frame received

    def received(self, at: float) -> None:
        """Note that an answer frame arrived."""
        self.frames.append(at)

    def last_frame_before(self, at: float) -> float | None:
        """Return the last answer frame received before ``at``."""
        index = bisect.bisect_left(self.frames, at)
        return self.frames[index - 1] if index else None

    def first_frame_after(self, at: float) -> float | None:
        """Return the first answer frame received after ``at``."""
        index = bisect.bisect_right(self.frames, at)
        return self.frames[index] if index < len(self.frames) else None

    @property
    def stats(self) -> Any:
        """The live conversation's session counters."""
        conversation = self.link.conversation
        assert conversation is not None
        return conversation.session.stats


def wire_device(
    device: EmulatedDevice, mic: RoomMic, on_frame: Callable[[float], None] | None
) -> None:
    """Put the bench's mic into the device and tap what its speaker receives."""
    device.voice.mic = mic
    original = device.voice.on_audio

    def on_audio(message: Any) -> None:
        original(message)
        if message.data:
            mic.hear_speaker(message.data)
            # Answer frames only: the link also sends silence (speaker keepalive,
            # the push at a pause, the tail after an answer).
            if on_frame is not None and any(message.data):
                on_frame(mic.loop.time())

    device.voice.on_audio = on_audio  # type: ignore[method-assign]


def new_device(number: int) -> EmulatedDevice:
    """Return an encrypted firmware-2026.9 satellite with a speaker."""
    return EmulatedDevice(
        name=f"bench-{number}",
        encrypted=True,
        esphome_version=FIRMWARE,
        features=ATOM_ECHO_FEATURES,
        mac_address=f"02:00:00:DE:00:{number:02X}",
    )


def new_link(
    host: str, port: int, psk: str | None, binding: DuplexBinding, states: States | None
) -> EsphomeLink:
    """Return the product's link to one device."""
    return EsphomeLink(
        LinkConfig(
            host=host,
            port=port,
            noise_psk=psk,
            login_timeout=0.5,  # 2026.9 never answers the login: fall back quickly
            backoff_min=0.05,
            backoff_max=0.2,
        ),
        binding,
        on_state=states,
    )


@contextlib.asynccontextmanager
async def kernel_and_peer(
    speech: InstantSpeech, options: DuplexOptions, *, echo: bool, answer: str
) -> AsyncIterator[tuple[DuplexBinding, Kernel]]:
    """Yield a real kernel on the loopback OpenAI peer (answers ``answer`` at once)."""
    async with OpenAIPeer() as peer:
        peer.default_reply(Text(answer))
        round_ends = RoundEnds()
        kernel = Kernel(
            OpenAIChatProvider(
                base_url=peer.base_url, api_key="sk-bench", model=DEFAULT_MODEL
            ),
            ChannelRegistry(),
            on_round_end=round_ends,
        )
        binding = DuplexBinding(
            kernel=kernel,
            stt=speech.stt,
            tts=speech.tts,
            options=options,
            round_ends=round_ends,
            echo=EchoCanceller if echo else None,
        )
        try:
            yield binding, kernel
        finally:
            await kernel.stop_all()


@contextlib.asynccontextmanager
async def satellite(
    number: int, binding: DuplexBinding, echo_room: Room | None
) -> AsyncIterator[Satellite]:
    """Yield a device in this process and the product's link to it, connected."""
    loop = asyncio.get_running_loop()
    async with new_device(number) as device:
        mic = RoomMic(loop, echo_room, at_arrival=SPEAKER_AT_ARRIVAL)
        states = States()
        link = new_link(device.host, device.port, device.noise_psk, binding, states)
        sat = Satellite(device, mic, link)
        sat.states = states
        wire_device(device, mic, sat.received)
        link.start()
        try:
            await asyncio.wait_for(link.wait_connected(), SAFETY)
            await asyncio.wait_for(device.wait_for_voice_client(), SAFETY)
            yield sat
        finally:
            await link.aclose()
        if device.voice.errors:
            print(f"emulator errors: {device.voice.errors}", file=sys.stderr)


async def open_conversation(sat: Satellite, ask: bytes) -> int:
    """Wake word + the ask; return the state index once the answer plays."""
    mark = sat.states.mark()
    sat.device.say(b"")  # the wake word only: the run starts, the mic streams
    spoken = sat.mic.say(ask)
    await asyncio.wait_for(spoken.heard.wait(), SAFETY)
    return await sat.states.wait_for(SessionState.SPEAKING, after=mark)


# --------------------------------------------------------------------------- rows 12-14, 16b


@dataclass
class BargeResults:
    """What a chain of barge-ins measured (seconds)."""

    onset_to_last: list[float] = field(default_factory=list)
    end_to_first: list[float] = field(default_factory=list)
    stt_to_first: list[float] = field(default_factory=list)  # after the VAD's decision
    resume_holes: list[float] = field(default_factory=list)
    pause_gaps_mic_ms: list[int] = field(default_factory=list)
    missed_pauses: int = 0  # barge-ins whose pause came only with the words
    unpaused_coughs: int = 0
    stray_pauses: int = 0  # pauses before the user's onset


async def barge_chain(
    trials: int, *, echo: bool, coughs: bool, seed: int
) -> BargeResults:
    """One conversation, ``trials`` barge-ins (and a cough before each, if asked)."""
    rng = random.Random(seed)
    clips = await asyncio.to_thread(answer_clips)
    users = [
        await asyncio.to_thread(speak, text, voice=voice, lead_ms=0, tail_ms=300)
        for text, voice in USERS
    ]
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    cough = noise(200, -12.0)
    speech = InstantSpeech(clips)
    options = DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=0)
    results = BargeResults()
    echo_room = room(seed, gain_db=-10.0, delay_ms=150.0) if echo else None
    async with (
        kernel_and_peer(speech, options, echo=echo, answer=ANSWER) as (binding, _),
        satellite(0, binding, echo_room) as sat,
    ):
        speaking = await open_conversation(sat, ask)
        # Warm-up: one barge-in not counted (first-use costs of every path).
        for trial in range(-1, trials):
            await asyncio.sleep(rng.uniform(0.4, 0.9))  # into the answer (a scenario)
            if coughs:
                speech.reply = ""
                mark = sat.states.mark()
                sat.mic.say(cough)
                try:
                    paused = await asyncio.wait_for(
                        sat.states.wait_for(SessionState.PAUSED, after=mark), 3.0
                    )
                except TimeoutError:
                    if trial >= 0:
                        results.unpaused_coughs += 1
                else:
                    resumed = await sat.states.wait_for(
                        SessionState.SPEAKING, SessionState.RESUMING, after=paused
                    )
                    at = sat.states.seen[resumed][1]
                    first = await wait_frame_after(sat, at)
                    last = sat.last_frame_before(at)
                    if trial >= 0 and first is not None and last is not None:
                        results.resume_holes.append(first - last)
                        results.pause_gaps_mic_ms += sat.stats.pause_gaps_ms[-1:]
                await asyncio.sleep(rng.uniform(0.4, 0.9))
            speech.reply = f"words {trial}"
            user = users[trial % len(users)]
            mark = sat.states.mark()
            pauses_before = len(sat.stats.pause_mic_ms)
            spoken = sat.mic.say(user)
            cut = await sat.states.wait_for(SessionState.LISTENING, after=mark)
            cut_at = sat.states.seen[cut][1]
            speaking = await sat.states.wait_for(SessionState.SPEAKING, after=cut)
            first_new = await wait_frame_after(sat, cut_at)
            if trial < 0:
                continue
            assert spoken.onset_at is not None and spoken.end_at is not None
            last_old = sat.last_frame_before(cut_at)
            pause_times = [
                at
                for state, at in sat.states.seen[mark:cut]
                if state is SessionState.PAUSED
            ]
            if any(at < spoken.onset_at for at in pause_times):
                results.stray_pauses += 1
            if len(sat.stats.pause_mic_ms) == pauses_before:
                results.missed_pauses += 1
            if last_old is not None:
                results.onset_to_last.append(last_old - spoken.onset_at)
            if first_new is not None:
                results.end_to_first.append(first_new - spoken.end_at)
                if speech.stt_at is not None:
                    results.stt_to_first.append(first_new - speech.stt_at)
        del speaking
    return results


async def wait_frame_after(sat: Satellite, at: float) -> float | None:
    """Return the first answer frame received after ``at`` (waits, bounded)."""
    deadline = asyncio.get_running_loop().time() + 5.0
    while (first := sat.first_frame_after(at)) is None:
        if asyncio.get_running_loop().time() > deadline:
            return None
        await asyncio.sleep(0.005)  # polling the record: a tap, not a synchronisation
    return first


def ms(values: list[float]) -> str:
    """p50/p99/max of seconds, in ms."""
    if not values:
        return "n=0"
    return (
        f"p50 {pct(values, 50) * 1e3:.1f} ms, p99 {pct(values, 99) * 1e3:.1f} ms,"
        f" max {max(values) * 1e3:.1f} ms (n={len(values)})"
    )


# --------------------------------------------------------------------------- row 16


async def echo_answers(
    answers: int, streams: int, mode: BargeIn, *, seed: int
) -> dict[str, int]:
    """``answers`` answers over echo in ``streams`` parallel conversations; counters."""
    clips = await asyncio.to_thread(answer_clips)
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    speech = InstantSpeech(clips)  # "words" for every utterance, echo included
    options = DuplexOptions(barge_in=mode, end_silence_ms=0)
    rng = random.Random(seed)
    per_stream = max(1, answers // streams)
    totals = {"answers": 0, "asks": 0, "barge_ins": 0, "pauses": 0, "pushes": 0}
    totals |= {"wake_interrupts": 0, "dropped": 0, "echo_utterances": 0}
    totals["lost_asks"] = 0

    async def one(number: int, binding: DuplexBinding) -> None:
        echo_room = room(
            seed * 100 + number, rng.uniform(-14, -6), rng.uniform(50, 400)
        )
        async with satellite(100 + number, binding, echo_room) as sat:
            speaking = await open_conversation(sat, ask)
            asks = 1
            for n in range(per_stream):
                done = await sat.states.wait_for(SessionState.LISTENING, after=speaking)
                totals["answers"] += 1
                if n == per_stream - 1:
                    break
                for _ in range(3):
                    await asyncio.sleep(0.5)  # the user answers after a moment
                    spoken = sat.mic.say(ask)
                    asks += 1
                    await asyncio.wait_for(spoken.heard.wait(), SAFETY)
                    try:
                        speaking = await asyncio.wait_for(
                            sat.states.wait_for(SessionState.SPEAKING, after=done), 8.0
                        )
                        break
                    except TimeoutError:
                        # Not answered: in wake_word mode an utterance that began
                        # over the answer's echo tail is dropped whole.
                        totals["lost_asks"] += 1
                else:
                    raise RuntimeError("three asks in a row were not answered")
            await asyncio.sleep(1.0)  # the echo tail of the last answer
            stats = sat.stats
            totals["asks"] += asks
            totals["barge_ins"] += stats.barge_ins
            totals["pauses"] += stats.pauses
            totals["pushes"] += stats.pushes
            totals["wake_interrupts"] += stats.wake_interrupts
            totals["dropped"] += stats.dropped_utterances
            totals["echo_utterances"] += stats.echo_utterances

    async with kernel_and_peer(
        speech, options, echo=mode is BargeIn.VAD, answer=SHORT_ANSWER
    ) as (binding, _):
        await asyncio.gather(*(one(n, binding) for n in range(streams)))
    return totals


# --------------------------------------------------------------------------- row 15


def _device_host(conn: Connection, count: int) -> None:
    """Child process: ``count`` devices hearing their own echo (not measured)."""
    asyncio.run(_host(conn, count))


async def _host(conn: Connection, count: int) -> None:
    loop = asyncio.get_running_loop()
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    async with contextlib.AsyncExitStack() as stack:
        devices: list[tuple[EmulatedDevice, RoomMic]] = []
        for number in range(count):
            device = await stack.enter_async_context(new_device(number))
            mic = RoomMic(loop, room(number, -10.0, 50 + 15 * number))
            wire_device(device, mic, None)
            devices.append((device, mic))
        conn.send([(d.host, d.port, d.noise_psk) for d, _ in devices])
        await loop.run_in_executor(None, conn.recv)  # the links are connected
        for device, mic in devices:
            await device.wait_for_voice_client()
            device.say(b"")
            mic.queue(ask)
        await loop.run_in_executor(None, conn.recv)  # measured: stop
        conn.send([repr(e) for d, _ in devices for e in d.voice.errors])


async def cpu_per_stream(count: int, window: float) -> Row:
    """Row 15: this process's CPU per stream with ``count`` streams answering."""
    clips = await asyncio.to_thread(answer_clips)
    speech = InstantSpeech(clips)
    options = DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=0)
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_device_host, args=(child, count), daemon=True)
    process.start()
    loop = asyncio.get_running_loop()
    try:
        addresses = await loop.run_in_executor(None, parent.recv)
        async with kernel_and_peer(
            speech, options, echo=True, answer=ANSWER + " " + ANSWER
        ) as (binding, _):
            states = [States() for _ in addresses]
            links = [
                new_link(host, port, psk, binding, st)
                for (host, port, psk), st in zip(addresses, states, strict=True)
            ]
            for link in links:
                link.start()
            try:
                for link in links:
                    await asyncio.wait_for(link.wait_connected(), SAFETY)
                parent.send("go")
                for st in states:
                    await st.wait_for(SessionState.SPEAKING)
                await asyncio.sleep(0.5)  # every answer well under way
                lags: list[float] = []
                stop = asyncio.Event()

                async def ticker() -> None:
                    while not stop.is_set():
                        due = loop.time() + 0.005
                        await asyncio.sleep(0.005)
                        lags.append(loop.time() - due)

                ticking = asyncio.create_task(ticker())
                cpu0, t0 = time.process_time(), time.monotonic()
                await asyncio.sleep(window)
                cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
                stop.set()
                await ticking
                speaking = sum(
                    1
                    for link in links
                    if link.session_state
                    in (
                        SessionState.SPEAKING,
                        SessionState.PAUSED,
                        SessionState.RESUMING,
                    )
                )
                pauses = sum(
                    link.conversation.session.stats.pauses
                    for link in links
                    if link.conversation is not None
                )
            finally:
                for link in links:
                    await link.aclose()
        parent.send("stop")
        errors = await loop.run_in_executor(None, parent.recv)
        if errors:
            print(f"emulator errors: {errors}", file=sys.stderr)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    per = cpu / wall / count
    return Row(
        f"15 duplex: CPU per ESPHome duplex stream (VAD + server AEC + link + kernel),"
        f" {count} streams answering at once, devices in another process",
        f"{per * 1e3:.1f} ms CPU per stream-second ({per * 100:.2f} % of a core);"
        f" {count} streams: {per * count * 100:.0f} % of one core"
        f" ({per * count * 50:.0f} % of 2 cores); event-loop lag"
        f" {ms(lags)}; {speaking}/{count} still speaking at the end,"
        f" {pauses} pauses over echo ({wall:.1f} s window)",
        f"{count} streams fit in 2 cores",
    )


# --------------------------------------------------------------------------- main


def show(row: Row) -> None:
    """Print one row of the table at once."""
    print(f"{row.name} | {row.measured} | {row.target}", flush=True)


async def main(args: argparse.Namespace) -> None:
    """Run the selected rows."""
    rows = {"12", "13", "14", "15", "16"}
    if args.only:
        rows &= {r.strip() for r in args.only.split(",")}
    if not rows:
        return
    if (reason := echo_unavailable_reason()) is not None:
        print(f"duplex rows: server AEC unavailable: {reason}", file=sys.stderr)
    peers = "instant in-process STT/TTS, loopback OpenAI peer answering at once"
    if rows & {"12", "13", "14"}:
        res = await barge_chain(args.trials, echo=False, coughs="14" in rows, seed=1)
        if "12" in rows:
            show(
                Row(
                    "12 duplex: speech onset in the mic stream → last answer frame at"
                    " the device (ESPHome link, vad, no echo)",
                    f"{ms(res.onset_to_last)}; {res.missed_pauses} barge-ins paused"
                    f" only by the words, {res.stray_pauses} paused before the onset",
                    "p99 ≤ 50 ms",
                )
            )
        if "13" in rows:
            show(
                Row(
                    "13 duplex: end of utterance in the mic stream → first frame of"
                    f" the new answer at the device ({peers})",
                    f"{ms(res.end_to_first)}; of which the utterance's end decided"
                    f" (STT called) → first frame {ms(res.stt_to_first)}",
                    "the integration's own cost",
                )
            )
        if "14" in rows:
            gaps = [g / 1000 for g in res.pause_gaps_mic_ms]
            show(
                Row(
                    "14 duplex: false barge-in (200 ms noise, no words): hole in the"
                    " answer audio at the device",
                    f"{ms(res.resume_holes)}; the session's pause → resume decision"
                    f" (mic time) {ms(gaps)}; {res.unpaused_coughs} bursts did not"
                    " pause",
                    "—",
                )
            )
    if "15" in rows:
        show(await cpu_per_stream(args.streams, args.window))
    if "16" in rows:
        if echo_unavailable_reason() is None:
            res = await barge_chain(args.trials, echo=True, coughs=False, seed=2)
            vad = await echo_answers(
                args.answers, args.echo_streams, BargeIn.VAD, seed=3
            )
            scale = 100 / max(1, vad["answers"])
            self_vad = vad["barge_ins"] + max(
                0, vad["pushes"] - vad["asks"] + vad["lost_asks"]
            )
            vad_text = (
                f"vad + server AEC: {self_vad * scale:.1f} self-interruptions per 100"
                f" answers ({vad['answers']} answers, {vad['pauses']} pauses,"
                f" {vad['echo_utterances']} echo utterances dropped,"
                f" {vad['lost_asks']} asks lost);"
                f" onset → last frame over echo -10 dB {ms(res.onset_to_last)}"
                f" ({res.missed_pauses} paused only by the words,"
                f" {res.stray_pauses} paused before the onset)"
            )
        else:
            vad_text = f"vad: server AEC unavailable ({echo_unavailable_reason()})"
        wake = await echo_answers(
            args.answers // 2, args.echo_streams, BargeIn.WAKE_WORD, seed=4
        )
        self_wake = (
            wake["barge_ins"]
            + wake["pauses"]
            + wake["wake_interrupts"]
            + max(0, wake["pushes"] - wake["asks"] + wake["lost_asks"])
        )
        show(
            Row(
                "16 duplex: echo (echo_sim room, 50–400 ms, −14..−6 dB):"
                " self-interruptions, and barge-in over echo",
                f"{vad_text}; wake_word mode: {self_wake} self-interruptions in"
                f" {wake['answers']} answers ({wake['dropped']} utterances over the"
                f" answer ignored, {wake['lost_asks']} asks lost: said 0.5 s after"
                " an answer ended, they began in its echo tail and were dropped)",
                "0 per 100; onset p99 ≤ 50 ms; wake_word 0",
            )
        )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50, help="barge-ins per chain")
    parser.add_argument("--answers", type=int, default=100, help="row 16 answers")
    parser.add_argument("--echo-streams", type=int, default=10, help="row 16")
    parser.add_argument("--streams", type=int, default=20, help="row 15")
    parser.add_argument("--window", type=float, default=5.0, help="row 15 seconds")
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument(
        "--speaker-at-arrival",
        action="store_true",
        help="rows 12-16: audio reaching an idle speaker plays from its arrival",
    )
    parser.add_argument("--only", help="comma-separated row numbers (12-16)")
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.trials, parsed.answers, parsed.echo_streams = 8, 10, 5
        parsed.streams, parsed.window = 5, 2.0
    return parsed


if __name__ == "__main__":
    arguments = _parse()
    SPEAKER_AT_ARRIVAL = arguments.speaker_at_arrival
    asyncio.run(main(arguments))
