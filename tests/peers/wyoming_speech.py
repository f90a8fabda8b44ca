"""Offline Wyoming speech servers for tests and developers: STT and TTS on loopback.

``WyomingSttServer`` recognises the phrases a test declares (pocketsphinx with a
JSGF grammar, see ``phrase_recognizer``); ``WyomingTtsServer`` speaks with
espeak-ng. Both speak the Wyoming protocol of the ``wyoming`` package, so Home
Assistant's own ``wyoming`` integration adds them through its config flow exactly as
it adds the Whisper and Piper add-ons::

    async with (
        WyomingSttServer(phrases=["turn on the kitchen lights", "stop"]) as stt,
        WyomingTtsServer() as tts,
    ):
        ...  # host/port: stt.host, stt.port (a free port of 127.0.0.1 by default)
        request = await stt.wait_for_request(1)
        request.transcript  # "turn on the kitchen lights" (or "" if not recognised)

STT: ``describe`` → ``info`` with one ASR program (model ``en-us-phrases``,
language ``en``); ``transcribe`` (optional), ``audio-start``, ``audio-chunk``…,
``audio-stop`` → ``transcript``. Audio in any rate, width or channel count is
converted to 16 kHz 16-bit mono. The transcript is always one of the declared
phrases or ``""``. Recognition runs in a thread, one utterance at a time.

TTS: ``describe`` → ``info`` with one TTS program and its voices (espeak-ng voice
names, language ``en``); ``synthesize`` → ``audio-start``, ``audio-chunk``s of
22.05 kHz 16-bit mono, ``audio-stop``. espeak-ng runs as a subprocess (killed when
the request is abandoned). An unknown voice name falls back to the default voice.

Every request is recorded (``stt.requests``, ``tts.requests``) just before its
answer is sent, and ``wait_for_request(n)`` awaits the n-th one.

From a shell (next to a running Home Assistant; add them in Settings → Devices &
services → Wyoming Protocol, host 127.0.0.1)::

    python -m tests.peers.wyoming_speech stt --port 10300 --phrase "turn on the kitchen lights"
    python -m tests.peers.wyoming_speech tts --port 10200
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
import io
import logging
from pathlib import Path
import shutil
import signal
import struct

from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.event import Event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Info, TtsProgram, TtsVoice
from wyoming.tts import Synthesize

from tests.peers.phrase_recognizer import SAMPLE_RATE, PhraseRecognizer, Recognition
from tests.peers.wyoming_server import Records, WyomingServer

__all__ = [
    "DEFAULT_TTS_VOICES",
    "STT_MODEL",
    "STT_PROGRAM",
    "TTS_PROGRAM",
    "SttRequest",
    "TtsRequest",
    "WyomingSttServer",
    "WyomingTtsServer",
    "main",
]

_LOGGER = logging.getLogger(__name__)

STT_PROGRAM = "rtvoice-pocketsphinx"
STT_MODEL = "en-us-phrases"
TTS_PROGRAM = "rtvoice-espeak-ng"
DEFAULT_TTS_VOICES = ("en-us", "en-gb", "en-us+f3")
LANGUAGE = "en"
_SAMPLE_WIDTH = 2
_CHUNK_SAMPLES = 1024

_SPHINX = Attribution(
    name="CMU Sphinx", url="https://github.com/cmusphinx/pocketsphinx"
)
_ESPEAK = Attribution(name="eSpeak NG", url="https://github.com/espeak-ng/espeak-ng")


@dataclass(slots=True)
class SttRequest:
    """One utterance the STT server received and what it answered."""

    language: str | None
    """The ``transcribe`` event's language (None without that event)."""
    model: str | None
    """The ``transcribe`` event's model name."""
    audio_format: tuple[int, int, int] | None
    """(rate, width, channels) of the audio as sent (``audio-start`` or first chunk)."""
    audio: bytes
    """The utterance as decoded: 16 kHz 16-bit mono."""
    chunks: int
    """Number of ``audio-chunk`` events."""
    transcript: str = ""
    """The answer: a declared phrase or ""."""
    hypothesis: str = ""
    """The decoder's raw best path."""
    score: float = 0.0
    """The decoder's score of that path (0 … 1)."""

    @property
    def duration(self) -> float:
        """Seconds of audio received."""
        return len(self.audio) / (SAMPLE_RATE * _SAMPLE_WIDTH)


@dataclass(slots=True)
class TtsRequest:
    """One ``synthesize`` request and the audio sent back."""

    text: str
    voice: str | None
    """The voice name asked for (None: default)."""
    speaker: str | None
    voice_used: str
    rate: int = 0
    """Sample rate of the audio sent (Hz)."""
    audio: bytes = b""
    """16-bit mono PCM sent in the ``audio-chunk`` events."""

    @property
    def duration(self) -> float:
        """Seconds of audio sent."""
        return len(self.audio) / (self.rate * _SAMPLE_WIDTH) if self.rate else 0.0


@dataclass(slots=True)
class _Utterance:
    """Audio of one ``transcribe``/``audio-*`` sequence on a connection."""

    language: str | None = None
    model: str | None = None
    audio_format: tuple[int, int, int] | None = None
    converter: AudioChunkConverter = field(
        default_factory=lambda: AudioChunkConverter(
            rate=SAMPLE_RATE, width=_SAMPLE_WIDTH, channels=1
        )
    )
    audio: bytearray = field(default_factory=bytearray)
    chunks: int = 0


class WyomingSttServer(WyomingServer):
    """Wyoming speech-to-text for declared phrases (pocketsphinx + JSGF grammar)."""

    def __init__(
        self,
        phrases: Iterable[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        record: bool = True,
    ) -> None:
        """Prepare a server for these phrases (the model loads in ``start``).

        ``record=False`` keeps no requests (for servers that run for hours).
        """
        super().__init__(host=host, port=port)
        self._phrases = list(phrases)
        self._recognizer: PhraseRecognizer | None = None
        self._records: Records[SttRequest] = Records(keep=record)
        self._connection_state: dict[asyncio.StreamWriter, _Utterance] = {}

    @property
    def phrases(self) -> list[str]:
        """The phrases the grammar holds."""
        return list(self._phrases)

    @property
    def requests(self) -> list[SttRequest]:
        """Answered utterances, in order."""
        return self._records.items

    async def wait_for_request(self, count: int = 1) -> SttRequest:
        """Return the ``count``-th utterance once decoded (just before its answer)."""
        return await self._records.wait_for(count)

    async def wait_for_transcript(self, text: str) -> SttRequest:
        """Return the first request decoded as ``text``.

        Early transcripts at a pause inside an utterance are requests too, so
        counting requests can miss it.
        """
        return await self._records.wait_for_match(lambda r: r.transcript == text)

    async def set_phrases(self, phrases: Iterable[str]) -> None:
        """Replace the grammar (utterances already decoding keep the old one)."""
        phrases = list(phrases)
        if self._recognizer is not None:
            await asyncio.to_thread(self._recognizer.set_phrases, phrases)
        self._phrases = phrases

    async def start(self) -> None:
        """Load the model and grammar (in a thread), then listen."""
        if self._recognizer is None:
            self._recognizer = await asyncio.to_thread(PhraseRecognizer, self._phrases)
        try:
            await super().start()
        except BaseException:  # e.g. the port is taken: give the decoder back
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop listening, then release the decoder."""
        await super().stop()
        recognizer, self._recognizer = self._recognizer, None
        if recognizer is not None:
            # waits for a decode still running in a thread
            await asyncio.to_thread(recognizer.close)

    def _info(self) -> Info:
        model = AsrModel(
            name=STT_MODEL,
            attribution=_SPHINX,
            installed=True,
            description="pocketsphinx en-us with a grammar of the declared phrases",
            version=version("pocketsphinx"),
            languages=[LANGUAGE],
        )
        program = AsrProgram(
            name=STT_PROGRAM,
            attribution=_SPHINX,
            installed=True,
            description="Offline recognition of known phrases (test rig)",
            version=version("pocketsphinx"),
            models=[model],
        )
        return Info(asr=[program])

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._connection_state[writer] = _Utterance()
        try:
            await super()._serve(reader, writer)
        finally:
            del self._connection_state[writer]

    async def _handle(self, event: Event, writer: asyncio.StreamWriter) -> None:
        utterance = self._connection_state[writer]
        if Transcribe.is_type(event.type):
            transcribe = Transcribe.from_event(event)
            self._connection_state[writer] = _Utterance(
                language=transcribe.language, model=transcribe.name
            )
        elif AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            utterance.audio.clear()
            utterance.chunks = 0
            utterance.audio_format = (start.rate, start.width, start.channels)
        elif AudioChunk.is_type(event.type):
            chunk = AudioChunk.from_event(event)
            if utterance.audio_format is None:
                utterance.audio_format = (chunk.rate, chunk.width, chunk.channels)
            utterance.audio += utterance.converter.convert(chunk).audio
            utterance.chunks += 1
        elif AudioStop.is_type(event.type):
            self._connection_state[writer] = _Utterance(
                language=utterance.language, model=utterance.model
            )
            await self._answer(utterance, writer)

    async def _answer(
        self, utterance: _Utterance, writer: asyncio.StreamWriter
    ) -> None:
        assert self._recognizer is not None
        audio = bytes(utterance.audio)
        result: Recognition = await asyncio.to_thread(self._recognizer.recognize, audio)
        request = SttRequest(
            language=utterance.language,
            model=utterance.model,
            audio_format=utterance.audio_format,
            audio=audio,
            chunks=utterance.chunks,
            transcript=result.text,
            hypothesis=result.hypothesis,
            score=result.score,
        )
        await self._records.add(request)
        _LOGGER.info(
            "STT %.2f s of audio -> %r (decoder: %r, score %.2f)",
            request.duration,
            request.transcript,
            request.hypothesis,
            request.score,
        )
        await async_write_event(Transcript(text=result.text).event(), writer)


class WyomingTtsServer(WyomingServer):
    """Wyoming text-to-speech backed by espeak-ng."""

    def __init__(
        self,
        *,
        voices: Sequence[str] = DEFAULT_TTS_VOICES,
        rate: int = 160,
        host: str = "127.0.0.1",
        port: int = 0,
        record: bool = True,
    ) -> None:
        """Serve these espeak-ng voices (the first is the default) at ``rate`` wpm.

        ``record=False`` keeps no requests (for servers that run for hours).
        """
        super().__init__(host=host, port=port)
        if not voices:
            raise ValueError("at least one voice is needed")
        self.voices = list(voices)
        self.rate = rate
        self._records: Records[TtsRequest] = Records(keep=record)

    @property
    def requests(self) -> list[TtsRequest]:
        """Answered synthesize requests, in order."""
        return self._records.items

    async def wait_for_request(self, count: int = 1) -> TtsRequest:
        """Return the ``count``-th request once synthesized (just before its audio)."""
        return await self._records.wait_for(count)

    async def start(self) -> None:
        """Check espeak-ng is installed, then listen."""
        if shutil.which("espeak-ng") is None:
            raise RuntimeError("espeak-ng is not installed (apt-get install espeak-ng)")
        await super().start()

    def _info(self) -> Info:
        voices = [
            TtsVoice(
                name=voice,
                attribution=_ESPEAK,
                installed=True,
                description=f"espeak-ng {voice}",
                version=None,
                languages=[LANGUAGE],
            )
            for voice in self.voices
        ]
        program = TtsProgram(
            name=TTS_PROGRAM,
            attribution=_ESPEAK,
            installed=True,
            description="Offline speech from espeak-ng (test rig)",
            version=None,
            voices=voices,
        )
        return Info(tts=[program])

    async def _handle(self, event: Event, writer: asyncio.StreamWriter) -> None:
        if not Synthesize.is_type(event.type):
            return
        synthesize = Synthesize.from_event(event)
        asked = synthesize.voice.name if synthesize.voice else None
        request = TtsRequest(
            text=synthesize.text,
            voice=asked,
            speaker=synthesize.voice.speaker if synthesize.voice else None,
            voice_used=asked if asked in self.voices else self.voices[0],
        )
        request.rate, request.audio = await _espeak(
            request.text, voice=request.voice_used, rate=self.rate
        )
        await self._records.add(request)
        _LOGGER.info("TTS %d characters -> %.2f s", len(request.text), request.duration)
        await async_write_event(
            AudioStart(rate=request.rate, width=_SAMPLE_WIDTH, channels=1).event(),
            writer,
        )
        step = _CHUNK_SAMPLES * _SAMPLE_WIDTH
        for offset in range(0, len(request.audio), step):
            chunk = AudioChunk(
                rate=request.rate,
                width=_SAMPLE_WIDTH,
                channels=1,
                audio=request.audio[offset : offset + step],
            )
            await async_write_event(chunk.event(), writer)
        await async_write_event(AudioStop().event(), writer)


async def _espeak(text: str, *, voice: str, rate: int) -> tuple[int, bytes]:
    """Return (sample rate, 16-bit mono PCM) of ``text`` spoken by espeak-ng."""
    process = await asyncio.create_subprocess_exec(
        "espeak-ng",
        "-v",
        voice,
        "-s",
        str(rate),
        "--stdin",
        "--stdout",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        wav, errors = await process.communicate(text.encode())
    finally:
        if process.returncode is None:  # abandoned (cancelled): do not leave it
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"espeak-ng failed: {errors.decode(errors='replace')}")
    return _wav_pcm(wav)


def _wav_pcm(wav: bytes) -> tuple[int, bytes]:
    """Return (rate, frames) of a mono 16-bit WAV written to a pipe.

    espeak-ng streaming to stdout cannot seek back, so its RIFF and data sizes are
    placeholders (0x7FFFFFFF…): the data chunk is taken to the end of the bytes.
    """
    stream = io.BytesIO(wav)
    if stream.read(4) != b"RIFF" or stream.read(8)[4:] != b"WAVE":
        raise ValueError("not a WAV stream")
    rate = 0
    while header := stream.read(8):
        kind, size = header[:4], struct.unpack("<I", header[4:])[0]
        if kind == b"fmt ":
            fmt = stream.read(size)
            channels, rate = struct.unpack("<HI", fmt[2:8])
            width = struct.unpack("<H", fmt[14:16])[0] // 8
            if (channels, width) != (1, _SAMPLE_WIDTH):
                raise ValueError(f"unexpected WAV format: {channels} ch, {width} B")
        elif kind == b"data":
            data = stream.read(size)
            return rate, data[: len(data) - len(data) % _SAMPLE_WIDTH]
        else:
            stream.seek(size + size % 2, io.SEEK_CUR)
    raise ValueError("WAV stream without data")


# -- command line ---------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.peers.wyoming_speech",
        description="Offline Wyoming speech servers (a rig for known phrases).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log requests")
    servers = parser.add_subparsers(dest="server", required=True)
    stt = servers.add_parser("stt", help="speech-to-text for declared phrases")
    stt.add_argument("--host", default="127.0.0.1")
    stt.add_argument("--port", type=int, default=10300)
    stt.add_argument(
        "--phrase", action="append", default=[], help="a phrase to recognise (repeat)"
    )
    stt.add_argument(
        "--phrases-file", type=Path, help="a file with one phrase per line"
    )
    tts = servers.add_parser("tts", help="text-to-speech with espeak-ng")
    tts.add_argument("--host", default="127.0.0.1")
    tts.add_argument("--port", type=int, default=10200)
    tts.add_argument(
        "--voice",
        action="append",
        default=[],
        help=f"an espeak-ng voice (repeat; default {', '.join(DEFAULT_TTS_VOICES)})",
    )
    tts.add_argument("--rate", type=int, default=160, help="words per minute")
    return parser


async def _run(args: argparse.Namespace) -> None:
    server: WyomingServer
    if args.server == "stt":
        phrases = list(args.phrase)
        if args.phrases_file is not None:
            lines = args.phrases_file.read_text(encoding="utf-8").splitlines()
            phrases += [line.strip() for line in lines if line.strip()]
        server = WyomingSttServer(phrases, host=args.host, port=args.port, record=False)
        what = f"STT (pocketsphinx, {len(phrases)} phrases)"
    else:
        voices = args.voice or list(DEFAULT_TTS_VOICES)
        server = WyomingTtsServer(
            voices=voices, rate=args.rate, host=args.host, port=args.port, record=False
        )
        what = f"TTS (espeak-ng: {', '.join(voices)})"
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    async with server:
        print(f"Wyoming {what} on {server.uri}", flush=True)  # noqa: T201
        await stopping.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one server until SIGINT/SIGTERM; return the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(message)s",
    )
    if args.server == "stt" and not (args.phrase or args.phrases_file):
        _parser().error("stt needs --phrase or --phrases-file")
    try:
        asyncio.run(_run(args))
    except ValueError as err:  # bad phrases (unknown words, none at all)
        print(f"error: {err}")  # noqa: T201
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
