"""Tests of the offline Wyoming speech servers, driven by the wyoming package's client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import sys
from typing import NamedTuple

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from tests.peers.phrase_recognizer import UnknownWordsError
from tests.peers.speech import BYTES_PER_MS, silence, speak
from tests.peers.wyoming_speech import (
    DEFAULT_TTS_VOICES,
    STT_MODEL,
    WyomingSttServer,
    WyomingTtsServer,
)

# pytest-homeassistant-custom-component blocks sockets; loopback peers need them.
pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY_TIMEOUT = 20.0  # a safety net against hangs, never a synchronisation
PHRASES = [
    "turn on the kitchen lights",
    "turn off the bed light",
    "what time is it",
    "stop",
    "yes",
    "no",
]
CHUNK = 1024  # bytes: 32 ms of 16 kHz mono, as HA and satellites send


@pytest.fixture(scope="module")
def clips() -> dict[str, bytes]:
    """Spoken clips of the declared phrases (espeak-ng, cached on disk)."""
    return {phrase: speak(phrase) for phrase in PHRASES}


@pytest.fixture
async def stt() -> AsyncIterator[WyomingSttServer]:
    """Start an STT server for PHRASES."""
    async with WyomingSttServer(PHRASES) as server:
        yield server


@pytest.fixture
async def tts() -> AsyncIterator[WyomingTtsServer]:
    """Start a TTS server with the default voices."""
    async with WyomingTtsServer() as server:
        yield server


async def spoken(text: str) -> bytes:
    """Return a clip of ``text`` (espeak-ng runs in a thread on a cache miss)."""
    return await asyncio.to_thread(speak, text)


async def read_until(client: AsyncTcpClient, event_type: str) -> list[Event]:
    """Read events up to and including the first of ``event_type``."""
    events: list[Event] = []
    async with asyncio.timeout(SAFETY_TIMEOUT):
        while True:
            event = await client.read_event()
            assert event is not None, f"connection closed before {event_type}"
            events.append(event)
            if event.type == event_type:
                return events


async def send_utterance(
    client: AsyncTcpClient,
    pcm: bytes,
    *,
    rate: int = 16000,
    channels: int = 1,
    transcribe: bool = True,
) -> None:
    """Send one utterance the way HA's wyoming STT entity does."""
    if transcribe:
        await client.write_event(Transcribe(language="en").event())
    await client.write_event(AudioStart(rate=rate, width=2, channels=channels).event())
    for offset in range(0, len(pcm), CHUNK):
        chunk = AudioChunk(
            rate=rate, width=2, channels=channels, audio=pcm[offset : offset + CHUNK]
        )
        await client.write_event(chunk.event())
    await client.write_event(AudioStop().event())


class Address(NamedTuple):
    """Where a server listens."""

    host: str
    port: int


async def transcribe(
    server: WyomingSttServer | Address,
    pcm: bytes,
    *,
    rate: int = 16000,
    channels: int = 1,
) -> str:
    """Open a connection, send one utterance, return the transcript."""
    async with AsyncTcpClient(server.host, server.port) as client:
        await send_utterance(client, pcm, rate=rate, channels=channels)
        events = await read_until(client, "transcript")
    return Transcript.from_event(events[-1]).text


async def synthesize(
    server: WyomingTtsServer, text: str, voice: str | None = None
) -> tuple[AudioStart, bytes]:
    """Ask for speech; return the audio-start and the audio of every chunk."""
    async with AsyncTcpClient(server.host, server.port) as client:
        event = Synthesize(
            text=text, voice=SynthesizeVoice(name=voice) if voice else None
        ).event()
        await client.write_event(event)
        events = await read_until(client, "audio-stop")
    assert events[0].type == "audio-start"
    start = AudioStart.from_event(events[0])
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert len(events) == len(chunks) + 2
    assert {(c.rate, c.width, c.channels) for c in chunks} == {(start.rate, 2, 1)}
    return start, b"".join(chunk.audio for chunk in chunks)


async def describe(host: str, port: int) -> Info:
    """Ask a server what it offers."""
    async with AsyncTcpClient(host, port) as client:
        await client.write_event(Describe().event())
        events = await read_until(client, "info")
    return Info.from_event(events[-1])


# -- speech to text -----------------------------------------------------------------


async def test_stt_describes_an_english_asr_model(stt: WyomingSttServer) -> None:
    """The info is what HA's wyoming integration needs for an STT entity."""
    info = await describe(stt.host, stt.port)

    assert info.tts == []
    [program] = info.asr
    assert program.installed
    [model] = program.models
    assert (model.name, model.languages, model.installed) == (STT_MODEL, ["en"], True)


async def test_stt_transcribes_each_declared_phrase(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """A spoken clip of a declared phrase comes back as exactly that phrase."""
    for phrase in PHRASES:
        assert await transcribe(stt, clips[phrase]) == phrase

    request = stt.requests[0]
    assert (request.language, request.audio_format) == ("en", (16000, 2, 1))
    assert request.audio == clips[PHRASES[0]]
    assert request.chunks == -(-len(clips[PHRASES[0]]) // CHUNK)
    assert [r.transcript for r in stt.requests] == PHRASES


async def test_stt_answers_phrase_as_declared(clips: dict[str, bytes]) -> None:
    """Capitals and punctuation of a declared phrase survive the grammar."""
    async with WyomingSttServer(["What time is it?", "Stop!"]) as server:
        assert await transcribe(server, clips["what time is it"]) == "What time is it?"
        assert (await server.wait_for_request(1)).hypothesis == "what time is it"


async def test_stt_several_utterances_on_one_connection(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """A connection may carry utterance after utterance, with or without transcribe."""
    async with AsyncTcpClient(stt.host, stt.port) as client:
        await send_utterance(client, clips["yes"])
        first = await read_until(client, "transcript")
        await send_utterance(client, clips["no"], transcribe=False)
        second = await read_until(client, "transcript")

    assert Transcript.from_event(first[-1]).text == "yes"
    assert Transcript.from_event(second[-1]).text == "no"
    assert [r.language for r in stt.requests] == ["en", "en"]


async def test_stt_converts_other_audio_formats(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """Stereo audio at another rate is converted to 16 kHz mono before decoding."""
    mono = np.frombuffer(clips["turn off the bed light"], dtype="<i2")
    stereo = np.repeat(mono, 2).astype("<i2").tobytes()
    converter = AudioChunkConverter(rate=22050)
    upsampled = converter.convert(
        AudioChunk(rate=16000, width=2, channels=2, audio=stereo)
    ).audio

    text = await transcribe(stt, upsampled, rate=22050, channels=2)

    assert text == "turn off the bed light"
    assert stt.requests[0].audio_format == (22050, 2, 2)
    assert abs(len(stt.requests[0].audio) - len(mono) * 2) <= 2 * BYTES_PER_MS


async def test_stt_rejects_what_it_cannot_match(stt: WyomingSttServer) -> None:
    """Silence and speech outside the grammar give an empty transcript.

    Out-of-grammar speech can also be forced onto a declared phrase (the rig is
    for known phrases); whatever happens, the answer is never anything else.
    """
    assert await transcribe(stt, silence(1500)) == ""
    assert await transcribe(stt, await spoken("what is the capital of france")) == ""
    assert stt.requests[1].hypothesis == "what time is"  # a prefix, not a phrase

    for other in ("play some jazz music", "tell me a joke", "dim the lights"):
        assert await transcribe(stt, await spoken(other)) in {"", *PHRASES}


async def test_stt_concurrent_requests(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """Clients transcribing at the same time each get their own phrase."""
    texts = await asyncio.gather(*(transcribe(stt, clips[p]) for p in PHRASES))

    assert texts == PHRASES
    assert sorted(r.transcript for r in stt.requests) == sorted(PHRASES)


async def test_stt_phrases_can_change(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """set_phrases swaps the grammar of a running server."""
    await stt.set_phrases(["cancel", "stop"])

    assert stt.phrases == ["cancel", "stop"]
    assert await transcribe(stt, clips["stop"]) == "stop"
    assert await transcribe(stt, await spoken("cancel")) == "cancel"


async def test_stt_rejects_words_outside_the_dictionary() -> None:
    """A phrase the pronunciation dictionary cannot spell fails at start."""
    with pytest.raises(UnknownWordsError, match="blorp"):
        async with WyomingSttServer(["turn on the blorp"]):
            pass
    with pytest.raises(ValueError, match="at least one"):
        async with WyomingSttServer([]):
            pass


async def test_stt_without_records(clips: dict[str, bytes]) -> None:
    """record=False (the command line's servers) answers and keeps nothing."""
    async with WyomingSttServer(PHRASES, record=False) as server:
        assert await transcribe(server, clips["stop"]) == "stop"

        assert server.requests == []
        with pytest.raises(RuntimeError, match="does not record"):
            await server.wait_for_request(1)


async def test_stt_client_leaving_mid_utterance(
    stt: WyomingSttServer, clips: dict[str, bytes]
) -> None:
    """A client that hangs up before audio-stop leaves nothing behind."""
    async with AsyncTcpClient(stt.host, stt.port) as client:
        await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
        await client.write_event(
            AudioChunk(rate=16000, width=2, channels=1, audio=silence(100)).event()
        )

    assert await transcribe(stt, clips["yes"]) == "yes"
    assert len(stt.requests) == 1


# -- text to speech -----------------------------------------------------------------


async def test_tts_describes_its_voices(tts: WyomingTtsServer) -> None:
    """The info lists one installed TTS program with the espeak-ng voices."""
    info = await describe(tts.host, tts.port)

    assert info.asr == []
    [program] = info.tts
    assert program.installed
    assert [v.name for v in program.voices] == list(DEFAULT_TTS_VOICES)
    assert all(v.languages == ["en"] and v.installed for v in program.voices)


async def test_tts_synthesizes_speech_of_plausible_length(
    tts: WyomingTtsServer,
) -> None:
    """Five words at 160 wpm are roughly two seconds of 22.05 kHz mono audio."""
    start, audio = await synthesize(tts, "turn on the kitchen lights")

    assert (start.rate, start.width, start.channels) == (22050, 2, 1)
    seconds = len(audio) / (start.rate * 2)
    assert 1.0 < seconds < 4.0
    request = await tts.wait_for_request(1)
    assert (request.text, request.voice, request.voice_used) == (
        "turn on the kitchen lights",
        None,
        "en-us",
    )
    assert request.audio == audio


async def test_tts_speech_is_recognised(
    tts: WyomingTtsServer, stt: WyomingSttServer
) -> None:
    """The TTS server's audio, fed to the STT server, is the same phrase again."""
    start, audio = await synthesize(tts, "what time is it", voice="en-gb")

    assert await transcribe(stt, audio, rate=start.rate) == "what time is it"
    assert tts.requests[0].voice_used == "en-gb"


async def test_tts_unknown_voice_falls_back(tts: WyomingTtsServer) -> None:
    """An unknown voice name gets the default voice, as recorded."""
    await synthesize(tts, "yes", voice="klingon")

    assert (tts.requests[0].voice, tts.requests[0].voice_used) == ("klingon", "en-us")


async def test_tts_text_is_not_an_option(tts: WyomingTtsServer) -> None:
    """Text starting with a dash is spoken, not parsed as an espeak-ng option."""
    _, audio = await synthesize(tts, "--help me")

    assert len(audio) > 0


async def test_tts_concurrent_requests(tts: WyomingTtsServer) -> None:
    """Requests at the same time each get their own audio."""
    texts = ["yes", "turn off the bed light", "what time is it"]

    results = await asyncio.gather(*(synthesize(tts, text) for text in texts))

    by_text = {r.text: r.audio for r in tts.requests}
    assert [audio for _, audio in results] == [by_text[text] for text in texts]
    assert len(results[0][1]) < len(results[1][1])


# -- command line -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kind"),
    [(["stt", "--phrase", "stop", "--phrase", "yes"], "asr"), (["tts"], "tts")],
)
async def test_cli_serves_until_terminated(args: list[str], kind: str) -> None:
    """``python -m tests.peers.wyoming_speech`` prints its address and serves."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.peers.wyoming_speech",
        *args,
        "--port",
        "0",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(SAFETY_TIMEOUT):
            line = (await process.stdout.readline()).decode()
        assert line.startswith("Wyoming "), line
        host, port = line.rsplit("tcp://", 1)[1].strip().rsplit(":", 1)
        info = await describe(host, int(port))
        assert len(getattr(info, kind)) == 1
        if kind == "asr":
            address = Address(host, int(port))
            assert await transcribe(address, await spoken("stop")) == "stop"
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(SAFETY_TIMEOUT):
            assert await process.wait() == 0


async def test_cli_refuses_stt_without_phrases() -> None:
    """The STT server needs at least one phrase."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.peers.wyoming_speech",
        "stt",
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(SAFETY_TIMEOUT):
        _, errors = await process.communicate()
    assert process.returncode == 2
    assert b"--phrase" in errors
