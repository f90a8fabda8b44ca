"""The terminal side of ``scripts/satellite --duplex``: talk over an answer, see what happens.

``DuplexConsole`` drives the emulated satellite that Realtime Voice owns in duplex
mode. The device's mic streams for the whole conversation (silence between phrases);
each command speaks into it while an answer may be playing:

- ``TEXT``: say it. The wake word goes first when the satellite is idle, and in
  barge-in mode ``wake_word`` (or ``off``) also while an answer plays (that is how
  you talk over it there); otherwise the open mic simply hears the words.
- ``/wake [TEXT]``: the wake word (then TEXT), whatever plays.
- ``/cough``: a 250 ms noise burst into the mic (a cough, a door).
- ``/wait``: until the answer has played (or stopped) and nothing is pending.
- ``/wait playing``: until answer audio is playing.
- ``/sleep SECONDS``; ``/quit``.

It prints, with the time since the first command: what you said, the wake word
being answered, each utterance Home Assistant transcribed (the offline STT server
runs in this process), each answer sentence synthesised, the answer audio reaching
the speaker, stopping (with how long after your speech or noise began), resuming
(no words: a false barge-in) or being cut by your words, how much of each answer
was heard, and the conversation ending after silence. The heard audio of the last
answer goes to a WAV file.

Answer audio is judged from the frames the device receives: no frame for ``GAP``
seconds is a stop. The emulator (``tests/peers/esphome``) is the device; nothing here
touches Home Assistant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
import wave

import numpy as np

from tests.peers.esphome import EmulatedDevice, EventType, Interrupt, Kind, State
from tests.peers.esphome.record import Entry
from tests.peers.speech import speak
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

GAP = 0.25  # seconds without an answer frame: the audio stopped
BYTES_PER_SECOND = 32000  # 16 kHz mono s16le
COUGH_MS = 250
COUGH_DBFS = -12.0
WAKE_WORD = "Okay Nabu"
WAIT_TIMEOUT = 60.0  # seconds: a safety net for /wait


def cough(ms: int = COUGH_MS, dbfs: float = COUGH_DBFS) -> bytes:
    """Return a noise burst (no words), 16 kHz mono s16le."""
    rng = np.random.default_rng(7)
    samples = rng.standard_normal(ms * 16) * 32768 * 10 ** (dbfs / 20)
    envelope = np.minimum(1.0, np.linspace(0, 8, samples.size))  # 30 ms attack
    return bytes(np.clip(samples * envelope, -32768, 32767).astype("<i2").tobytes())


def _sound_span(pcm: bytes, threshold: int = 300) -> tuple[int, int]:
    """Byte offsets where the sound in ``pcm`` begins and ends (clips have silence)."""
    samples = np.abs(np.frombuffer(pcm[: len(pcm) - len(pcm) % 2], dtype="<i2"))
    loud = np.flatnonzero(samples > threshold)
    if loud.size == 0:
        return 0, len(pcm)
    return int(loud[0]) * 2, int(loud[-1]) * 2 + 2


def _heard_text(sentences: list[str], durations: list[float], heard: float) -> str:
    """Return the text heard in ``heard`` seconds: whole sentences, then a proportional cut."""
    words: list[str] = []
    for sentence, seconds in zip(sentences, durations, strict=False):
        if heard >= seconds:
            words.append(sentence)
            heard -= seconds
            continue
        if seconds > 0 and heard > 0:
            words.append(sentence[: round(len(sentence) * heard / seconds)] + "…")
        break
    return " ".join(words)


@dataclass
class _Answer:
    """One answer as the speaker received it."""

    number: int
    started_at: float
    offset: int  # bytes of API audio before it (all answers)
    received: int = 0
    sentences: list[str] = field(default_factory=list)
    durations: list[float] = field(default_factory=list)  # seconds per sentence
    seconds: float = 0.0  # synthesised so far
    stopped_at: float | None = None  # audio stopped over the user's input
    pauses: int = 0
    done: bool = False


class DuplexConsole:
    """Speak into the emulated satellite's open mic and print what happens."""

    def __init__(
        self,
        device: EmulatedDevice,
        stt: WyomingSttServer,
        tts: WyomingTtsServer,
        *,
        barge_in: str,
        wav: Path,
        out: Callable[[str], None] = print,
    ) -> None:
        """Watch ``device`` and the speech servers; ``barge_in`` is the stored mode."""
        self.device = device
        self.stt = stt
        self.tts = tts
        self.barge_in = barge_in
        self.wav = wav
        self._out = out
        self._loop = asyncio.get_running_loop()
        self._t0: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._answer: _Answer | None = None
        self._answers = 0
        self._audio_at: float | None = None  # last answer frame while playing
        self._input_at: float | None = None  # when the user's last input began
        self._input_what = ""
        self._speech_end_at: float | None = None
        self._pending_stt = 0  # utterances spoken, not transcribed yet
        self._awaiting_answer = False  # words went to the model, no answer yet
        self._changed = asyncio.Event()
        self._early_sentences: list[str] = []  # synthesised before its first frame
        self._early_durations: list[float] = []
        self.transcripts: list[str] = []
        self.answers_heard: list[float] = []

    # --- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start watching the device and the speech servers."""
        loop = self._loop
        self._tasks = [
            loop.create_task(self._watch_device(), name="satellite device"),
            loop.create_task(self._watch_stt(), name="satellite stt"),
            loop.create_task(self._watch_tts(), name="satellite tts"),
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop watching (nothing is left running)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._finish_answer()

    # --- commands --------------------------------------------------------------------

    async def command(self, line: str) -> bool:
        """Run one typed line; False for ``/quit``."""
        line = line.strip()
        if not line:
            return True
        if self._t0 is None:
            self._t0 = self._loop.time()
        word, _, rest = line.partition(" ")
        if word == "/quit":
            return False
        if word == "/cough":
            self._cough()
        elif word == "/wake":
            await self.say(rest.strip(), wake=True)
        elif word == "/wait":
            await self.wait(playing=rest.strip() == "playing")
        elif word == "/sleep":
            await asyncio.sleep(float(rest or 1))
        elif word.startswith("/"):
            self.print(f"unknown command {word} (/wake /cough /wait /sleep /quit)")
        else:
            await self.say(line, wake=None)
        return True

    async def say(self, text: str, *, wake: bool | None) -> None:
        """Say ``text`` (after the wake word when ``wake``, or when needed)."""
        if text and text not in self.stt.phrases:
            await self.stt.set_phrases([*self.stt.phrases, text])
        pcm = await asyncio.to_thread(speak, text) if text else b""
        device = self.device
        if device.voice.owner is None:
            self.print("Home Assistant does not hold the satellite now: not said")
            return
        if wake is None:
            wake = device.state is State.IDLE or (
                self._answering and self.barge_in != "vad"
            )
        words = f'"{text}"' if text else "nothing more"
        if wake:
            run = device.say(pcm, interrupt=Interrupt.RESTART)
            how = f'after the wake word "{WAKE_WORD}"'
            if run is not None and self._answering:
                how += ", over the answer"
            self._mark_input("wake word", pcm)
        else:
            start = device.voice.mic.pending
            device.say(pcm, wake_word=None)
            over = ", over the answer" if self._answering else ""
            how = f"into the open mic{over}"
            self._mark_input("speech", pcm, queued=start)
        if text:
            self._pending_stt += 1
        self.print(f"you: {words} ({how})")

    def _cough(self) -> None:
        if self.device.state is State.IDLE:
            self.print("cough: the satellite is idle (its mic is off)")
            return
        start = self.device.voice.mic.pending
        burst = cough()
        self.device.say(burst, wake_word=None)
        self._mark_input("noise", burst, queued=start)
        note = ""
        if self.barge_in != "vad":
            note = f" (barge-in mode {self.barge_in}: noise never pauses an answer)"
        self.print(f"you: a cough, {COUGH_MS} ms of noise{note}")

    def _mark_input(self, what: str, pcm: bytes, queued: int = 0) -> None:
        """Note when ``pcm`` reaches the mic: its sound begins and ends (estimates)."""
        first, last = _sound_span(pcm)
        start = self._loop.time() + queued / BYTES_PER_SECOND
        # The wake word is heard now; speech and noise when their sound begins.
        self._input_at = (
            start + (first if what != "wake word" else 0) / BYTES_PER_SECOND
        )
        self._input_what = what
        if what != "noise":
            self._speech_end_at = start + last / BYTES_PER_SECOND

    async def wait(self, *, playing: bool = False) -> None:
        """Wait for answer audio (``playing``), or until everything has settled."""

        def ready() -> bool:
            if playing:
                return self._playing
            return (
                not self._playing
                and self._pending_stt == 0
                and not self._awaiting_answer
                and self.device.voice.mic.pending == 0
                and (self._answer is None or self._answer.done)
                and self._answers > 0
            )

        try:
            async with asyncio.timeout(WAIT_TIMEOUT):
                while not ready():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            self.print(f"/wait: nothing settled within {WAIT_TIMEOUT:.0f} s")

    # --- printing ----------------------------------------------------------------------

    def print(self, text: str, at: float | None = None) -> None:
        """Print ``text`` with the time since the first command."""
        when = self._loop.time() if at is None else at
        since = when - self._t0 if self._t0 is not None else 0.0
        self._out(f"[{since:7.2f} s] {text}")

    @property
    def _playing(self) -> bool:
        return self._audio_at is not None

    @property
    def _answering(self) -> bool:
        """An answer is playing, or stopped for the user's input."""
        return self._answer is not None and not self._answer.done

    def _notify(self) -> None:
        self._changed.set()

    # --- the device ----------------------------------------------------------------------

    async def _watch_device(self) -> None:
        index = self.device.mark()
        while True:
            timeout = None
            if self._audio_at is not None:
                timeout = max(0.0, self._audio_at + GAP - self._loop.time())
            try:
                async with asyncio.timeout(timeout):
                    entry = await self.device.wait_for(lambda _e: True, index)
            except TimeoutError:
                self._audio_stopped()
                self._notify()
                continue
            index = entry.index + 1
            self._on_entry(entry)
            self._notify()

    def _on_entry(self, entry: Entry) -> None:
        if (
            entry.kind is Kind.SPEAKER_AUDIO
            and entry.detail.get("bytes")
            and (not entry.detail.get("silent") or self._within_answer())
        ):
            self._audio(entry)
        elif entry.kind is Kind.VOICE_EVENT:
            if entry.detail["type"] == EventType.RUN_START:
                run = self.device.voice.run
                waited = ""
                if run is not None and run.streaming_at is not None:
                    waited = f" in {(run.streaming_at - run.requested_at) * 1e3:.0f} ms"
                self.print(f"wake word answered{waited}: the mic streams", entry.at)
            elif entry.detail["type"] == EventType.RUN_END:
                self._finish_answer()
                self._awaiting_answer = False
                self.print(
                    "conversation ended after silence: the satellite waits for"
                    " its wake word",
                    entry.at,
                )
        elif entry.kind is Kind.VOICE_OWNER:
            if entry.detail["owner"]:
                self.print("Home Assistant holds the satellite's voice assistant")
            else:
                self._audio_at = None
                self.print("Home Assistant let go of the satellite (disconnected)")

    def _within_answer(self) -> bool:
        """Whether a silent frame belongs to the answer playing (a pause in its speech).

        Realtime Voice also sends silence of its own to keep the speaker running and
        to push an answer's end out of the satellite's buffer: that is no answer.
        """
        answer = self._answer
        return (
            answer is not None
            and not answer.done
            and answer.received < answer.seconds * BYTES_PER_SECOND
        )

    def _audio(self, entry: Entry) -> None:
        size = int(entry.detail["bytes"])
        answer = self._answer
        if self._audio_at is None:
            if answer is not None and answer.stopped_at is not None and not answer.done:
                gap = (entry.at - answer.stopped_at) * 1e3
                self.print(
                    f"answer audio resumes after {gap:.0f} ms (no words: a false"
                    " barge-in)",
                    entry.at,
                )
                answer.stopped_at = None
            elif answer is None or answer.done:
                answer = self._new_answer(entry.at)
                self.print(
                    f"answer audio starts{self._since_words(entry.at)}", entry.at
                )
        self._audio_at = entry.at
        if answer is not None:
            answer.received += size

    def _since_words(self, at: float) -> str:
        """When ``at`` was, against the end of your last words (an estimate)."""
        if self._speech_end_at is None:
            return ""
        ms = (at - self._speech_end_at) * 1e3
        if ms >= 0:
            return f" ({ms:.0f} ms after your words ended)"
        return f" (while you spoke: {-ms:.0f} ms before your words ended)"

    def _new_answer(self, at: float) -> _Answer:
        self._finish_answer()
        self._answers += 1
        self._awaiting_answer = False
        offset = sum(p.bytes for p in self.device.playbacks if p.source == "api")
        answer = _Answer(self._answers, at, offset)
        # Sentences synthesised before its first frame belong to it.
        answer.sentences, answer.durations = (
            self._early_sentences,
            self._early_durations,
        )
        answer.seconds = sum(answer.durations)
        self._early_sentences, self._early_durations = [], []
        self._answer = answer
        return answer

    def _audio_stopped(self) -> None:
        at = self._audio_at
        self._audio_at = None
        answer = self._answer
        if at is None or answer is None:
            return
        heard = answer.received / BYTES_PER_SECOND
        if heard >= answer.seconds - 0.15:
            self._finish_answer()  # all of it played
        elif self._input_at is not None and self._input_at > answer.started_at:
            after = (at - self._input_at) * 1e3
            answer.stopped_at = at
            answer.pauses += 1
            self.print(
                f"answer audio stops at {heard:.2f} s"
                f" ({after:.0f} ms after your {self._input_what} began)",
                at,
            )
        # else: the next sentence is still being synthesised

    def _finish_answer(self) -> None:
        answer = self._answer
        if answer is None or answer.done:
            return
        answer.done = True
        self._audio_at = None
        heard = answer.received / BYTES_PER_SECOND
        whole = answer.seconds
        if answer.stopped_at is not None or heard < whole - 0.15:
            text = _heard_text(answer.sentences, answer.durations, heard)
            self.print(f"answer cut at {heard:.2f} s of {whole:.2f} s, heard: {text!r}")
        else:
            text = " ".join(answer.sentences)
            said = (
                repr(text)
                if text
                else "its text not seen here (Home Assistant's TTS cache served it)"
            )
            self.print(f"answer heard whole ({heard:.2f} s): {said}")
        self.answers_heard.append(heard)
        self._write_wav(answer)

    def _write_wav(self, answer: _Answer) -> None:
        pcm = b"".join(p.pcm for p in self.device.playbacks if p.source == "api")
        pcm = pcm[answer.offset : answer.offset + answer.received]
        with wave.open(str(self.wav), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(pcm)

    # --- the speech servers ----------------------------------------------------------

    async def _watch_stt(self) -> None:
        count = len(self.stt.requests)
        while True:
            count += 1
            request = await self.stt.wait_for_request(count)
            self._pending_stt = max(0, self._pending_stt - 1)
            text = request.transcript
            after = self._since_words(self._loop.time())
            if not text:
                self.print(f"transcribed: no words{after}")
                self._notify()
                continue
            self.transcripts.append(text)
            self._awaiting_answer = True
            self.print(f"transcribed: {text!r}{after}")
            answer = self._answer
            if answer is not None and not answer.done:
                heard = answer.received / BYTES_PER_SECOND
                if answer.stopped_at is not None or self._playing:
                    self.print(
                        f"barge-in: your words cut the answer at {heard:.2f} s;"
                        " they go to the model"
                    )
                    answer.stopped_at = answer.stopped_at or self._loop.time()
                self._finish_answer()
            self._notify()

    async def _watch_tts(self) -> None:
        count = len(self.tts.requests)
        while True:
            count += 1
            request = await self.tts.wait_for_request(count)
            self.print(f"answer sentence: {request.text!r}")
            answer = self._answer
            if answer is not None and not answer.done:
                answer.sentences.append(request.text)
                answer.durations.append(request.duration)
                answer.seconds += request.duration
            else:
                self._early_sentences.append(request.text)
                self._early_durations.append(request.duration)
            self._notify()
