"""Tests of the ESPHome device emulator driven by the real aioesphomeapi client.

The client side plays Home Assistant's part by hand (what HA's esphome integration would
send: responses, pipeline events, announcements); nothing is mocked. TTS audio comes
from a local aiohttp server, as HA serves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
import io
import math
from typing import Any
import wave

from aioesphomeapi import (
    APIClient,
    EncryptionPlaintextAPIError,
    InvalidEncryptionKeyAPIError,
    RequiresEncryptionAPIError,
    SwitchInfo,
    SwitchState,
    VoiceAssistantAnnounceFinished,
    VoiceAssistantAudioSettings,
    VoiceAssistantEventType,
)
from aioesphomeapi.api_pb2 import ConnectRequest
from aiohttp import web
import pytest

from tests.peers.esphome import (
    ATOM_ECHO_FEATURES,
    FRAME_BYTES,
    FRAME_SECONDS,
    VOICE_PE_FEATURES,
    EmulatedDevice,
    EventType,
    Feature,
    Interrupt,
    Kind,
    Say,
    State,
    WaitEvent,
    run_script,
)
from tests.peers.esphome.framing import generate_psk

# pytest-homeassistant-custom-component blocks sockets; loopback peers need them.
pytestmark = pytest.mark.usefixtures("socket_enabled")

TIMEOUT = 10.0
USE_WAKE_WORD = 1 << 1


def make_wav(seconds: float = 0.25, rate: int = 16000) -> bytes:
    """Make a 16-bit mono WAV of a quiet tone."""
    frames = int(seconds * rate)
    pcm = b"".join(
        int(3000 * math.sin(2 * math.pi * 440 * i / rate)).to_bytes(
            2, "little", signed=True
        )
        for i in range(frames)
    )
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return buffer.getvalue()


def speech(frames: float) -> bytes:
    """Non-silent PCM lasting ``frames`` mic frames."""
    return b"\x10\x00" * int(frames * FRAME_BYTES // 2)


@dataclass
class MediaServer:
    """Serves audio files as HA's TTS/media proxy does."""

    base_url: str
    files: dict[str, bytes]
    requests: list[dict[str, str]] = field(default_factory=list)

    def url(self, name: str) -> str:
        """URL of a served file."""
        return f"{self.base_url}/{name}"


@pytest.fixture
async def media() -> AsyncIterator[MediaServer]:
    """Start a loopback HTTP server with two WAV files."""
    server = MediaServer(
        "",
        {
            "answer.wav": make_wav(0.25),
            "chime.wav": make_wav(0.1),
            "long.wav": make_wav(3.0),
        },
    )

    async def serve(request: web.Request) -> web.StreamResponse:
        server.requests.append(dict(request.headers))
        body = server.files.get(request.match_info["name"])
        if body is None:
            raise web.HTTPNotFound
        return web.Response(body=body, content_type="audio/x-wav")

    app = web.Application()
    app.router.add_get("/{name}", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    server.base_url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
async def device() -> AsyncIterator[EmulatedDevice]:
    """Start a plaintext Voice-PE-like device."""
    async with EmulatedDevice(name="kitchen", friendly_name="Kitchen") as started:
        yield started
    assert started.voice.errors == []


class FakeHA:
    """An aioesphomeapi client doing what HA's esphome assist satellite does."""

    def __init__(self, device: EmulatedDevice, **kwargs: Any) -> None:
        """Prepare a client for ``device``."""
        self.client = APIClient(
            device.host, device.port, None, noise_psk=device.noise_psk, **kwargs
        )
        self.starts: asyncio.Queue[tuple[str, int, str | None]] = asyncio.Queue()
        self.audio: list[bytes] = []
        self.audio_frame = asyncio.Event()
        self.stops: asyncio.Queue[bool] = asyncio.Queue()
        self.finished: asyncio.Queue[bool] = asyncio.Queue()
        self.stopped = asyncio.Event()
        self.port: int | None = 0
        self.respond: Callable[[], Awaitable[None]] | None = None

    async def connect(self, *, login: bool = True) -> FakeHA:
        """Connect and log in."""

        async def on_stop(expected: bool) -> None:
            self.stopped.set()

        await asyncio.wait_for(
            self.client.connect(on_stop=on_stop, login=login), TIMEOUT
        )
        return self

    def subscribe_voice(self) -> Callable[[], None]:
        """Subscribe to the voice assistant with API audio."""

        async def handle_start(
            conversation_id: str,
            flags: int,
            settings: VoiceAssistantAudioSettings,
            wake_word_phrase: str | None,
        ) -> int | None:
            self.starts.put_nowait((conversation_id, flags, wake_word_phrase))
            if self.respond is not None:
                await self.respond()
            return self.port

        async def handle_stop(abort: bool) -> None:
            self.stops.put_nowait(abort)

        async def handle_audio(data: bytes) -> None:
            self.audio.append(data)
            self.audio_frame.set()

        async def handle_finished(msg: VoiceAssistantAnnounceFinished) -> None:
            self.finished.put_nowait(msg.success)

        return self.client.subscribe_voice_assistant(
            handle_start=handle_start,
            handle_stop=handle_stop,
            handle_audio=handle_audio,
            handle_announcement_finished=handle_finished,
        )

    def event(self, event_type: int, **data: str) -> None:
        """Send a pipeline event."""
        self.client.send_voice_assistant_event(
            VoiceAssistantEventType(event_type)
            if event_type in VoiceAssistantEventType._value2member_map_
            else event_type,  # INTENT_PROGRESS (100) is not in 29.9.0's enum
            data,
        )

    async def barrier(self) -> None:
        """Round trip: everything sent before has been handled by the device."""
        await asyncio.wait_for(self.client.device_info(), TIMEOUT)

    async def close(self) -> None:
        """Disconnect."""
        await self.client.disconnect()


@pytest.fixture
async def ha(device: EmulatedDevice) -> AsyncIterator[FakeHA]:
    """Connect a client subscribed to the voice assistant."""
    fake = await FakeHA(device).connect()
    fake.subscribe_voice()
    await asyncio.wait_for(device.wait_for_voice_client(), TIMEOUT)
    try:
        yield fake
    finally:
        await fake.close()


async def wait(awaitable: Awaitable[Any]) -> Any:
    """Await with the safety timeout."""
    return await asyncio.wait_for(awaitable, TIMEOUT)


# -- connection, framing, identity -------------------------------------------


async def test_plaintext_connect_and_device_info(device: EmulatedDevice) -> None:
    """Hello, login and device info as a 2025.4 device reports them."""
    fake = await FakeHA(device, client_info="test-ha").connect()
    info = await wait(fake.client.device_info())
    assert info.name == "kitchen"
    assert info.friendly_name == "Kitchen"
    assert info.mac_address == device.config.mac_address
    assert info.esphome_version == "2025.4.0"
    assert info.uses_password is False
    assert info.voice_assistant_feature_flags == int(VOICE_PE_FEATURES)
    assert fake.client.api_version is not None
    assert (fake.client.api_version.major, fake.client.api_version.minor) == (1, 10)
    hello = device.events.find(lambda e: e.kind is Kind.HELLO)
    assert hello is not None and hello.detail["client_info"] == "test-ha"
    assert device.events.find(lambda e: e.name == "ConnectResponse") is not None
    await fake.close()
    gone = await wait(device.wait_for_disconnect())
    assert gone.connection == 1


async def test_noise_connect() -> None:
    """The Noise handshake with the right key, then ordinary traffic."""
    async with EmulatedDevice(encrypted=True, name="secure") as device:
        assert device.noise_psk is not None
        fake = await FakeHA(device, expected_name="secure").connect()
        info = await wait(fake.client.device_info())
        assert info.name == "secure"
        await fake.close()


async def test_wrong_noise_key_is_rejected_with_mac_failure() -> None:
    """A wrong key gets the device's "Handshake MAC failure": InvalidEncryptionKeyAPIError."""
    async with EmulatedDevice(encrypted=True) as device:
        client = APIClient(device.host, device.port, None, noise_psk=generate_psk())
        with pytest.raises(InvalidEncryptionKeyAPIError):
            await wait(client.connect(login=True))
        failed = await wait(device.wait_for(lambda e: e.kind is Kind.HANDSHAKE_FAILED))
        assert failed.detail["reason"] == "Handshake MAC failure"


async def test_plaintext_client_to_encrypted_device() -> None:
    """A device that requires encryption rejects plaintext: RequiresEncryptionAPIError."""
    async with EmulatedDevice(encrypted=True) as device:
        client = APIClient(device.host, device.port, None)
        with pytest.raises(RequiresEncryptionAPIError):
            await wait(client.connect(login=True))


async def test_encrypted_client_to_plaintext_device(device: EmulatedDevice) -> None:
    """A plaintext device answers a Noise hello as firmware does: EncryptionPlaintextAPIError."""
    client = APIClient(device.host, device.port, None, noise_psk=generate_psk())
    with pytest.raises(EncryptionPlaintextAPIError):
        await wait(client.connect(login=True))


async def test_new_firmware_never_answers_login() -> None:
    """ESPHome >= 2026.1 authenticates at hello and leaves ConnectRequest unanswered."""
    async with EmulatedDevice(
        esphome_version="2026.9.0", api_version=(1, 13)
    ) as device:
        fake = await FakeHA(device).connect(login=False)
        info = await wait(fake.client.device_info())
        assert info.esphome_version == "2026.9.0"
        fake.client._get_connection().send_message(ConnectRequest())  # noqa: SLF001
        await fake.barrier()
        assert device.events.find(lambda e: e.name == "ConnectRequest") is not None
        assert device.events.find(lambda e: e.name == "ConnectResponse") is None
        await fake.close()


async def test_entities_states_and_switch_command(device: EmulatedDevice) -> None:
    """A media player and a switch are listed; a switch command changes and reports state."""
    fake = await FakeHA(device).connect()
    entities, _services = await wait(fake.client.list_entities_services())
    kinds = {type(entity).__name__: entity for entity in entities}
    assert set(kinds) == {"MediaPlayerInfo", "SwitchInfo"}
    switch = kinds["SwitchInfo"]
    assert isinstance(switch, SwitchInfo) and switch.name == "Mute"
    player = kinds["MediaPlayerInfo"]
    assert [f.format for f in player.supported_formats] == ["wav"]

    states: asyncio.Queue[Any] = asyncio.Queue()
    fake.client.subscribe_states(states.put_nowait)
    fake.client.subscribe_home_assistant_states(lambda *_: None)
    first = {type(await wait(states.get())).__name__ for _ in range(2)}
    assert first == {"MediaPlayerEntityState", "SwitchState"}

    fake.client.switch_command(switch.key, True)
    changed = await wait(states.get())
    assert isinstance(changed, SwitchState) and changed.state is True
    assert device.switch_states["Mute"] is True

    device.set_switch("Mute", False)
    changed = await wait(states.get())
    assert isinstance(changed, SwitchState) and changed.state is False
    await fake.close()


async def test_ping_is_answered(device: EmulatedDevice) -> None:
    """The client's keep-alive ping gets a pong."""
    fake = FakeHA(device, keepalive=0.05)
    await fake.connect()
    await wait(device.wait_for_message("PingRequest"))
    await wait(device.wait_for(lambda e: e.name == "PingResponse"))
    await fake.close()


# -- voice assistant ------------------------------------------------------------


async def test_first_subscriber_owns_the_voice_assistant(
    device: EmulatedDevice,
) -> None:
    """A second subscriber is ignored: no requests reach it, its messages are ignored."""
    first = await FakeHA(device).connect()
    first.subscribe_voice()
    await wait(device.wait_for_voice_client())
    second = await FakeHA(device).connect()
    second.subscribe_voice()
    await second.barrier()
    assert device.voice.owner is not None and device.voice.owner.number == 1

    config = await wait(second.client.get_voice_assistant_configuration(TIMEOUT))
    assert config.available_wake_words == []
    config = await wait(first.client.get_voice_assistant_configuration(TIMEOUT))
    assert [w.id for w in config.available_wake_words] == ["okay_nabu", "hey_jarvis"]
    assert config.active_wake_words == ["okay_nabu"]

    run = device.wake()
    assert (await wait(first.starts.get()))[2] == "Okay Nabu"
    await wait(first.audio_frame.wait())
    second.event(EventType.STT_VAD_END)  # ignored: not the owner
    await second.barrier()
    assert device.state is State.STREAMING_MICROPHONE
    assert second.starts.empty()

    await first.close()  # the owner leaves: the run ends, ownership is free
    await wait(run.ended.wait())
    assert run.end_reason == "disconnected"
    second.subscribe_voice()
    owner = await wait(device.wait_for_voice_client(since=device.mark() - 1))
    assert owner.connection == 2
    await second.close()


async def test_full_run_with_tts_fetch(
    device: EmulatedDevice, ha: FakeHA, media: MediaServer
) -> None:
    """Wake word -> response -> paced mic audio -> events -> TTS fetched over HTTP."""
    clip = speech(5.5)
    run = device.say(clip, wake_word="Hey Jarvis")
    assert run is not None
    conversation_id, flags, phrase = await wait(ha.starts.get())
    assert (conversation_id, phrase) == ("", "Hey Jarvis")
    assert not flags & USE_WAKE_WORD  # detected on the device, as Voice PE does

    ha.event(EventType.RUN_START, url=media.url("answer.wav"))
    ha.event(EventType.STT_START)
    ha.event(EventType.STT_VAD_START)
    while run.speech_frames_sent < 6:  # event-driven: each frame wakes the client
        ha.audio_frame.clear()
        await wait(ha.audio_frame.wait())
    ha.event(EventType.STT_VAD_END)
    await wait(device.wait_for_event(EventType.STT_VAD_END))
    assert device.state is State.AWAITING_RESPONSE
    assert run.mic_stop_reason == "stt_vad_end"
    frames_at_stop = run.frames_sent

    ha.event(EventType.STT_END, text="turn on the light")
    ha.event(EventType.INTENT_START)
    ha.event(EventType.INTENT_END, conversation_id="conv-1", continue_conversation="0")
    ha.event(EventType.TTS_START, text="Done")
    ha.event(EventType.TTS_END, url=media.url("answer.wav"))
    ha.event(EventType.RUN_END)
    assert await wait(ha.finished.get()) is True
    await wait(run.ended.wait())

    assert run.end_reason == "response finished"
    assert device.state is State.IDLE
    assert device.conversation_id == "conv-1"
    assert run.frames_sent == frames_at_stop == len(ha.audio)
    assert all(len(frame) == FRAME_BYTES for frame in ha.audio)
    assert b"".join(ha.audio)[: len(clip)] == clip
    (playback,) = device.playbacks
    assert playback.source == "tts_end"
    assert playback.bytes == len(media.files["answer.wav"])
    assert playback.format is not None
    assert (playback.format.codec, playback.format.sample_rate) == ("wav", 16000)
    assert playback.first_byte_at is not None and playback.last_byte_at is not None
    assert playback.finished_at is not None
    assert playback.first_byte_at <= playback.last_byte_at <= playback.finished_at
    assert playback.audio_seconds == pytest.approx(0.25)
    assert len(media.requests) == 1
    assert [EventType(t) for t in run.event_types()][-3:] == [
        EventType.TTS_START,
        EventType.TTS_END,
        EventType.RUN_END,
    ]


async def test_end_of_utterance_and_abort(device: EmulatedDevice, ha: FakeHA) -> None:
    """``end=True`` after the clip stops STT; ``abort`` sends start=False."""
    run = device.say(speech(2), end=True)
    assert run is not None
    await wait(ha.starts.get())
    assert await wait(ha.stops.get()) is False  # VoiceAssistantAudio(end=True)
    assert run.speech_frames_sent == 2
    assert run.mic_stop_reason == "end of utterance"
    assert device.state is State.AWAITING_RESPONSE
    device.abort()
    assert await wait(ha.stops.get()) is True  # VoiceAssistantRequest(start=False)
    assert device.state is State.IDLE and run.end_reason == "aborted"


async def test_tts_streaming_starts_playback_early(
    device: EmulatedDevice, ha: FakeHA, media: MediaServer
) -> None:
    """INTENT_PROGRESS with tts_start_streaming plays the RUN_START url and stops the mic."""
    run = device.wake()
    await wait(ha.starts.get())
    ha.event(EventType.RUN_START, url=media.url("answer.wav"))
    await wait(ha.audio_frame.wait())
    ha.event(EventType.INTENT_PROGRESS, tts_start_streaming="1")
    ha.event(EventType.TTS_END, url=media.url("answer.wav"))
    ha.event(EventType.RUN_END)
    assert await wait(ha.finished.get()) is True
    await wait(run.ended.wait())
    assert run.mic_stop_reason == "tts_start_streaming"
    assert [p.source for p in device.playbacks] == ["tts_streaming"]


async def test_wake_word_while_busy_follows_the_firmware(
    device: EmulatedDevice, ha: FakeHA, media: MediaServer
) -> None:
    """Stock firmware ignores a wake word mid-run; during the answer it stops playback."""
    run = device.wake()
    assert run is not None
    await wait(ha.starts.get())
    await wait(run.streaming.wait())  # events before the response would be refused
    ha.event(EventType.STT_VAD_END)
    await wait(device.wait_for_state(State.AWAITING_RESPONSE))
    assert device.say(speech(1)) is None  # ignored: the words are lost
    ha.event(EventType.TTS_END, url=media.url("long.wav"))
    await wait(device.wait_for_state(State.STREAMING_RESPONSE))
    assert device.wake() is None  # stops the answer, reports it finished
    assert await wait(ha.finished.get()) is True
    (playback,) = device.playbacks
    assert playback.stopped and playback.finished_at is None
    assert device.state is State.IDLE and run.end_reason == "response finished"
    await ha.barrier()
    assert ha.starts.empty() and len(device.runs) == 1


async def test_wake_word_restart_sends_a_new_request(
    device: EmulatedDevice, ha: FakeHA
) -> None:
    """``Interrupt.RESTART`` starts a new run mid-run; ``STOP_FIRST`` aborts first."""
    first = device.wake()
    assert first is not None
    await wait(ha.starts.get())
    await wait(first.streaming.wait())
    ha.event(EventType.STT_VAD_END)
    await wait(device.wait_for_state(State.AWAITING_RESPONSE))
    second = device.wake("Hey Jarvis", interrupt=Interrupt.RESTART)
    assert second is not None
    assert (await wait(ha.starts.get()))[2] == "Hey Jarvis"
    assert first.end_reason == "interrupted" and ha.stops.empty()
    third = device.wake(interrupt="stop_first")
    assert third is not None and third.number == 3
    assert await wait(ha.stops.get()) is True
    await wait(ha.starts.get())


async def test_stale_run_end_ends_the_new_run(
    device: EmulatedDevice, ha: FakeHA
) -> None:
    """The firmware ends whatever run is streaming on RUN_END, even a cancelled run's."""
    first = device.wake()
    assert first is not None
    await wait(ha.starts.get())
    await wait(first.streaming.wait())
    second = device.wake(interrupt=Interrupt.RESTART)
    assert second is not None
    await wait(ha.starts.get())
    await wait(second.streaming.wait())
    ha.event(EventType.RUN_END)  # the cancelled first pipeline's end
    await wait(second.ended.wait())
    assert second.end_reason == "run_end" and second.mic_stop_reason == "run_end"


async def test_client_side_wake_word_flag() -> None:
    """``use_wake_word=True`` asks the client to detect it, except in a continued run."""
    async with EmulatedDevice(use_wake_word=True) as device:
        ha = await FakeHA(device).connect()
        ha.subscribe_voice()
        await wait(device.wait_for_voice_client())
        run = device.wake()
        assert run is not None
        _conversation_id, flags, _phrase = await wait(ha.starts.get())
        assert flags & USE_WAKE_WORD
        await wait(run.streaming.wait())
        ha.event(EventType.STT_VAD_END)
        ha.event(EventType.INTENT_END, conversation_id="c", continue_conversation="1")
        ha.event(EventType.RUN_END)  # no answer audio: the run is over
        await wait(device.wait_for_state(State.IDLE))
        assert device.runs[0].end_reason == "run_end"
        await ha.close()


async def test_error_event_stops_the_mic_and_signals_stop(
    device: EmulatedDevice, ha: FakeHA
) -> None:
    """An ERROR event ends the run; the firmware answers with start=False."""
    run = device.wake()
    await wait(ha.starts.get())
    await wait(ha.audio_frame.wait())
    ha.event(EventType.ERROR, code="stt-no-text-recognized", message="nothing")
    assert await wait(ha.stops.get()) is True
    await wait(run.ended.wait())
    assert run.mic_stop_reason == "error"
    assert device.state is State.IDLE


async def test_continue_conversation_reopens_the_mic(
    device: EmulatedDevice, ha: FakeHA, media: MediaServer
) -> None:
    """continue_conversation=1 -> after the answer played, a new run in that conversation."""
    first = device.wake()
    await wait(ha.starts.get())
    await wait(ha.audio_frame.wait())
    ha.event(EventType.STT_VAD_END)
    await wait(device.wait_for_event(EventType.STT_VAD_END))
    device.say(speech(1), wake_word=None)  # the follow-up, heard by the reopened mic
    ha.event(EventType.INTENT_END, conversation_id="conv-7", continue_conversation="1")
    ha.event(EventType.TTS_END, url=media.url("answer.wav"))
    ha.event(EventType.RUN_END)
    conversation_id, flags, phrase = await wait(ha.starts.get())
    assert conversation_id == "conv-7"
    assert not flags & USE_WAKE_WORD
    assert phrase == "Okay Nabu"  # the firmware resends its last wake word phrase
    assert first.ended.is_set()
    second = device.runs[-1]
    assert second.continued and second.conversation_id == "conv-7"
    while second.speech_frames_sent < 1:
        ha.audio_frame.clear()
        await wait(ha.audio_frame.wait())
    assert device.playbacks[0].finished_at is not None
    assert device.playbacks[0].finished_at <= second.requested_at


async def test_announce_with_start_conversation(
    device: EmulatedDevice, ha: FakeHA, media: MediaServer
) -> None:
    """An announcement plays preannounce + media, reports finished, then listens."""
    result = await wait(
        ha.client.send_voice_assistant_announcement_await_response(
            media.url("answer.wav"),
            TIMEOUT,
            text="Dinner is ready",
            preannounce_media_id=media.url("chime.wav"),
            start_conversation=True,
        )
    )
    assert result.success is True
    assert [p.source for p in device.playbacks] == ["preannounce", "announce"]
    _conversation_id, flags, _phrase = await wait(ha.starts.get())
    assert not flags & USE_WAKE_WORD
    assert device.runs[-1].continued


async def test_timers_and_wake_word_configuration(
    device: EmulatedDevice, ha: FakeHA
) -> None:
    """Timer events are recorded; SetConfiguration changes the active wake word."""
    ha.client.send_voice_assistant_timer_event(0, "t1", "pasta", 300, 300, True)
    await ha.client.set_voice_assistant_configuration(["hey_jarvis"])
    await ha.barrier()
    assert set(device.voice.timers) == {"t1"}
    assert device.voice.active_wake_words == ["hey_jarvis"]
    ha.client.send_voice_assistant_timer_event(3, "t1", "pasta", 300, 0, False)
    await ha.barrier()
    assert device.voice.timers == {}
    assert len(device.events.select(lambda e: e.kind is Kind.TIMER)) == 2


async def test_api_speaker_audio_is_recorded() -> None:
    """A speaker device (Atom Echo) records TTS streamed as raw API audio."""
    async with EmulatedDevice(features=ATOM_ECHO_FEATURES, speed=4.0) as device:
        ha = await FakeHA(device).connect()
        ha.subscribe_voice()
        await wait(device.wait_for_voice_client())
        run = device.wake()
        assert run is not None
        await wait(ha.starts.get())
        await wait(run.streaming.wait())
        ha.event(EventType.STT_VAD_END)
        ha.event(EventType.TTS_END, url="http://127.0.0.1:9/unused.wav")
        ha.event(EventType.TTS_STREAM_START)
        for _ in range(4):
            ha.client.send_voice_assistant_audio(bytes(1024))
        ha.event(EventType.TTS_STREAM_END)
        ha.event(EventType.RUN_END)
        await wait(run.ended.wait())
        (playback,) = device.playbacks
        assert (playback.source, playback.bytes) == ("api", 4096)
        assert playback.finished_at is not None
        assert playback.audio_seconds == pytest.approx(0.128)
        await ha.close()


@pytest.mark.parametrize(
    ("version", "features", "audible"),
    [
        ("2025.4.0", VOICE_PE_FEATURES, False),
        ("2026.10.0", VOICE_PE_FEATURES, False),  # a media player: never, any version
        ("2025.4.0", ATOM_ECHO_FEATURES, True),
    ],
)
async def test_raw_api_audio_plays_only_with_the_speaker_flag(
    version: str, features: Feature, audible: bool
) -> None:
    """Raw API speaker audio is recorded; only a voice-assistant ``speaker:`` plays it."""
    async with EmulatedDevice(esphome_version=version, features=features) as device:
        ha = await FakeHA(device).connect(login=version < "2026")
        ha.subscribe_voice()
        await wait(device.wait_for_voice_client())
        ha.client.send_voice_assistant_audio(bytes(2048))
        await ha.barrier()
        (playback,) = device.playbacks
        assert (playback.source, playback.bytes, playback.audible) == (
            "api",
            2048,
            audible,
        )
        await ha.close()
        assert device.voice.errors == []


async def test_mic_is_paced_by_the_loop_clock(
    device: EmulatedDevice, ha: FakeHA
) -> None:
    """Frames are 1024 bytes and never sent before the mic could have captured them."""
    loop = asyncio.get_running_loop()
    run = device.wake()
    await wait(ha.starts.get())
    while len(ha.audio) < 12:
        ha.audio_frame.clear()
        await wait(ha.audio_frame.wait())
        captured = math.floor((loop.time() - run.requested_at) / FRAME_SECONDS)
        assert run.frames_sent <= captured
    assert all(len(frame) == FRAME_BYTES for frame in ha.audio)
    start = device.events.find(lambda e: e.kind is Kind.MIC_START)
    assert start is not None and 0 <= start.detail["buffered"] <= 16
    assert run.frames_lost == 0


async def test_ring_buffer_overflows_when_the_client_answers_late() -> None:
    """Audio captured beyond the ring buffer before the response is lost, as on a device."""
    async with EmulatedDevice(mic_buffer_ms=64, speed=4.0) as device:
        ha = await FakeHA(device).connect()
        ha.subscribe_voice()
        await wait(device.wait_for_voice_client())
        late = asyncio.Event()

        async def respond_late() -> None:
            await late.wait()

        ha.respond = respond_late
        run = device.wake()
        await wait(ha.starts.get())
        await wait(
            device.wait_for(lambda e: e.detail.get("what") == "mic ring buffer full")
        )
        late.set()
        start = await wait(device.wait_for(lambda e: e.kind is Kind.MIC_START))
        assert start.detail["buffered"] == 2  # 64 ms ring buffer: two frames survive
        assert run.frames_lost >= 1
        await ha.close()


async def test_drop_and_reconnect(device: EmulatedDevice) -> None:
    """Dropping the link ends the run; a reconnected client owns the assistant again."""
    ha = await FakeHA(device).connect()
    ha.subscribe_voice()
    await wait(device.wait_for_voice_client())
    run = device.wake()
    await wait(ha.starts.get())
    assert device.drop_connection() == 1
    await wait(ha.stopped.wait())
    await wait(run.ended.wait())
    assert run.end_reason == "disconnected"
    assert device.state is State.IDLE and device.voice.owner is None

    since = device.mark()
    again = await FakeHA(device).connect()
    again.subscribe_voice()
    owner = await wait(device.wait_for_voice_client(since))
    assert owner.connection == 2
    device.wake()
    await wait(again.starts.get())
    await again.close()


async def test_timeline_script(device: EmulatedDevice, ha: FakeHA) -> None:
    """A script says a clip, waits for the client's events and barges in."""

    async def play_ha() -> None:
        await wait(ha.starts.get())
        assert await wait(ha.stops.get()) is False
        ha.event(EventType.STT_END, text="hello")

    helper = asyncio.create_task(play_ha())
    result = await wait(
        run_script(
            device,
            [
                Say(speech(1), end=True),
                WaitEvent(EventType.STT_END),
                Say(speech(1), interrupt=Interrupt.RESTART),
            ],
        )
    )
    await helper
    first, second = result.runs
    assert first.end_reason == "interrupted"
    assert second.number == 2
    assert (await wait(ha.starts.get()))[2] == "Okay Nabu"
    at_wait, _, stt_end = result.steps[1]
    at_barge_in, _, _ = result.steps[2]
    assert stt_end is not None and stt_end.at <= at_wait <= at_barge_in
