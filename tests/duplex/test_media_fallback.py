"""Duplex answers on a media-player satellite: an announcement of a live stream.

A voice assistant with a ``media_player:`` (Voice PE's stock firmware: no SPEAKER
flag) drops raw API audio on every ESPHome version (``VoiceAssistant::on_audio``
plays only into a ``speaker:``); the link sees the flag at connect time and plays
each answer as an announcement of an HTTP stream. An aiohttp server on 127.0.0.1 stands in for Home
Assistant's HTTP app and serves the link's ``StreamRegistry`` with the same handler
HA's view uses. Everything else is real (aioesphomeapi, the openai SDK against the
loopback peer, the Wyoming speech servers). The device's media player fetches the
stream and plays it as it arrives; ``Playback.ahead_bytes`` is what it held fetched
and not yet played (printed, not asserted: timing belongs to benchmarks).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
from dataclasses import dataclass
from typing import Any

from aiohttp import web
import pytest

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions, SessionState
from custom_components.rtvoice.duplex_link import DuplexBinding, RoundEnds
from custom_components.rtvoice.duplex_stream import STREAM_PATH, StreamRegistry
from custom_components.rtvoice.esphome_link import EsphomeLink, LinkConfig
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel, Message
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from tests.duplex.conftest import noise
from tests.duplex.test_esphome_link import (
    ANSWER,
    ASK,
    LONG,
    SAFETY,
    STOP,
    States,
    mic_ending_events,
    wyoming_stt,
    wyoming_tts,
)
from tests.peers.esphome import VOICE_PE_FEATURES, EmulatedDevice, EventType, Interrupt
from tests.peers.esphome.record import Kind
from tests.peers.esphome.speaker import Playback
from tests.peers.openai_server import DEFAULT_MODEL, OpenAIPeer, Text
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

OLD_FIRMWARE = "2025.4.0"  # Voice PE with a media player: raw API audio is not played

pytestmark = pytest.mark.usefixtures("socket_enabled", "clip")


@dataclass
class Rig:
    """Everything a test needs, wired."""

    device: EmulatedDevice
    link: EsphomeLink
    kernel: Kernel
    peer: OpenAIPeer
    states: States
    streams: StreamRegistry
    transcribe: Any

    async def wake_and_say(self, pcm: bytes) -> str:
        """Wake the device, speak; return the conversation's child id."""
        since = self.device.mark()
        run = self.device.say(pcm)
        assert run is not None
        await asyncio.wait_for(run.streaming.wait(), SAFETY)
        await self.device.wait_for_event(EventType.RUN_START, since)
        assert self.link.conversation is not None
        return self.link.conversation.child_id

    def history(self, child_id: str) -> list[Message]:
        """Return the child's transcript (live or archived)."""
        transcript = self.kernel.transcript(child_id)
        assert transcript is not None
        return transcript

    def announcements(self) -> list[Playback]:
        """Return what the media player played (the answers)."""
        return [p for p in self.device.playbacks if p.source == "media_player"]

    async def wait_played(self, count: int) -> Playback:
        """Wait for the ``count``-th media player playback to end (finished or stopped)."""
        async with asyncio.timeout(SAFETY):
            while True:
                since = self.device.mark()
                playbacks = self.announcements()
                if len(playbacks) >= count and (
                    playbacks[count - 1].finished_at is not None
                    or playbacks[count - 1].stopped
                    or playbacks[count - 1].error is not None
                ):
                    return playbacks[count - 1]
                await self.device.wait_for(lambda e: e.kind is Kind.PLAYBACK, since)

    async def playing(self) -> Playback:
        """Wait until the media player has received audio of an answer."""
        async with asyncio.timeout(SAFETY):
            while True:
                since = self.device.mark()
                playbacks = self.announcements()
                if playbacks and playbacks[-1].played_bytes + len(
                    playbacks[-1].ahead_bytes
                ):
                    return playbacks[-1]
                # Any entry (mic frames go every 32 ms): look again.
                await self.device.wait_for(lambda e: True, since)


def report(playback: Playback, what: str) -> None:
    """Print the device-side queue of one playback (bytes fetched, not yet played)."""
    ahead = playback.ahead_bytes
    ms = [b / 32 for b in ahead]  # 16 kHz mono s16le: 32 bytes per ms
    p50 = sorted(ms)[len(ms) // 2] if ms else 0.0
    start = (
        (playback.first_byte_at - playback.requested_at) * 1000
        if playback.first_byte_at is not None
        else float("nan")
    )
    print(  # noqa: T201 - the measurement this test reports
        f"\n[{what}] fetched ahead of played: p50 {p50:.0f} ms, max {max(ms, default=0):.0f} ms"
        f" over {len(ms)} arrivals; GET to first byte {start:.0f} ms;"
        f" stalls {playback.stalls}; played {playback.played_bytes / 32:.0f} ms"
    )


@contextlib.asynccontextmanager
async def stream_server() -> AsyncIterator[StreamRegistry]:
    """Serve a ``StreamRegistry`` as HA's view does, on 127.0.0.1."""
    base: list[str] = []
    registry = StreamRegistry(lambda: base[0])

    async def handle(request: web.Request) -> web.StreamResponse:
        return await registry.handle(request, request.match_info["token"])

    app = web.Application()
    app.router.add_get(STREAM_PATH + "/{token}.wav", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    base.append(f"http://127.0.0.1:{port}")
    try:
        yield registry
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def rig(
    *,
    barge_in: BargeIn = BargeIn.VAD,
    esphome_version: str = OLD_FIRMWARE,
    **device_options: Any,
) -> AsyncIterator[Rig]:
    """Start the peers, the old-firmware device, the stream server, the link."""
    if "profile" not in device_options:  # a profile brings its own firmware
        device_options = {
            "esphome_version": esphome_version,
            "features": VOICE_PE_FEATURES,
            **device_options,
        }
    async with (
        EmulatedDevice(name="kitchen", encrypted=True, **device_options) as device,
        OpenAIPeer() as peer,
        WyomingSttServer(phrases=[ASK, ANSWER, STOP]) as stt,
        WyomingTtsServer() as tts,
        stream_server() as streams,
    ):
        round_ends = RoundEnds()
        kernel = Kernel(
            OpenAIChatProvider(
                base_url=peer.base_url, api_key="sk-test", model=DEFAULT_MODEL
            ),
            ChannelRegistry(),
            on_round_end=round_ends,
        )
        transcribe = wyoming_stt(stt.host, stt.port)
        binding = DuplexBinding(
            kernel=kernel,
            stt=transcribe,
            tts=wyoming_tts(tts.host, tts.port),
            options=DuplexOptions(barge_in=barge_in, end_silence_ms=1500),
            round_ends=round_ends,
        )
        states = States()
        link = EsphomeLink(
            LinkConfig(
                host=device.host,
                port=device.port,
                noise_psk=device.noise_psk,
                login_timeout=0.5,
                backoff_min=0.05,
                backoff_max=0.2,
            ),
            binding,
            on_state=states,
            streams=streams,
        )
        link.start()
        try:
            await asyncio.wait_for(link.wait_connected(), SAFETY)
            await device.wait_for_voice_client()
            yield Rig(device, link, kernel, peer, states, streams, transcribe)
        finally:
            await link.aclose()
            await kernel.stop_all()
        assert len(streams) == 0  # every answer stream was closed
        assert device.voice.errors == []


def api_audio_bytes(device: EmulatedDevice) -> int:
    """Raw API speaker audio the device received."""
    return sum(p.bytes for p in device.playbacks if p.source == "api")


def stop_commands(device: EmulatedDevice, since: int = 0) -> int:
    """Media player STOP commands received."""
    return sum(
        1
        for e in list(device.events)[since:]
        if e.name == "MediaPlayerCommandRequest" and e.message.has_command  # type: ignore[union-attr]
    )


async def test_old_firmware_hears_the_answer_through_its_media_player(clip) -> None:
    """Wake, words: the answer is an announcement of a live stream, heard in full."""
    async with rig() as r:
        assert r.link.media_player_key is not None
        r.peer.enqueue(Text("The kitchen "), Text("lights are on."))
        child = await r.wake_and_say(clip(ASK))
        playback = await r.wait_played(1)
        await r.device.wait_for_event(EventType.RUN_END)
        report(playback, "answer")
        assert playback.status == 200 and playback.error is None
        assert playback.format is not None
        assert (playback.format.codec, playback.format.sample_rate) == ("wav", 16000)
        assert not playback.stopped and playback.finished_at is not None
        assert (await r.transcribe(playback.pcm)) == ANSWER
        assert [(m.role, m.content, m.interrupted) for m in r.history(child)] == [
            ("user", ASK, False),
            ("assistant", "The kitchen lights are on.", False),
        ]
        assert api_audio_bytes(r.device) == 0
        assert stop_commands(r.device) == 0  # played out, never cut
        assert mic_ending_events(r.device) == []


async def test_speech_during_playback_stops_the_media_player(clip) -> None:
    """Barge-in by voice: the stream ends, the player is stopped, the words answered."""
    async with rig() as r:
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        r.peer.enqueue(Text("Okay."))
        child = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await r.playing()
        mark = r.device.mark()
        r.device.say(clip(STOP), wake_word=None)
        cut = await r.wait_played(1)
        assert cut.stopped and cut.finished_at is None
        assert stop_commands(r.device, mark) >= 1
        report(cut, "cut answer")
        await r.peer.wait_for_request(2)
        second = await r.wait_played(2)  # "Okay.": a new announcement
        assert not second.stopped
        await r.device.wait_for_event(EventType.RUN_END, mark)
        history = r.history(child)
        assert [(m.role, m.interrupted) for m in history] == [
            ("user", False),
            ("assistant", True),
            ("user", False),
            ("assistant", False),
        ]
        heard = history[1].content
        assert heard and LONG.lower().startswith(heard.lower().rstrip())
        assert history[2].content == STOP
        assert mic_ending_events(r.device) == []


async def test_wake_word_during_playback_stops_the_media_player(clip) -> None:
    """``wake_word`` mode: the wake word again cuts the announcement and the stream."""
    async with rig(barge_in=BargeIn.WAKE_WORD) as r:
        r.peer.enqueue(Text(LONG))
        r.peer.enqueue(Text("Okay."))
        child = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await r.playing()
        mark = r.device.mark()
        run = r.device.say(clip(STOP), interrupt=Interrupt.RESTART)
        assert run is not None
        cut = await r.wait_played(1)
        assert cut.stopped
        report(cut, "cut by the wake word")
        await r.peer.wait_for_request(2)
        await r.wait_played(2)
        history = r.history(child)
        assert [(m.role, m.interrupted) for m in history] == [
            ("user", False),
            ("assistant", True),
            ("user", False),
            ("assistant", False),
        ]
        assert stop_commands(r.device, mark) >= 1


async def test_a_cough_pauses_and_the_same_stream_resumes(clip) -> None:
    """A false barge-in stalls the stream, then feeds it again: one announcement."""
    async with rig() as r:
        r.peer.enqueue(Text(LONG))
        child = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        r.device.say(noise(200, -12.0), wake_word=None)
        paused = await r.states.wait_for(SessionState.PAUSED, speaking)
        await r.states.wait_for(SessionState.SPEAKING, paused)  # resumed
        playback = await r.wait_played(1)
        await r.device.wait_for_event(EventType.RUN_END)
        report(playback, "paused and resumed")
        assert len(r.announcements()) == 1  # the same stream went on
        assert not playback.stopped and playback.finished_at is not None
        assert stop_commands(r.device) == 0
        assert [(m.role, m.content, m.interrupted) for m in r.history(child)] == [
            ("user", ASK, False),
            ("assistant", LONG, False),
        ]


async def test_a_media_player_gets_announcements_on_every_version(clip) -> None:
    """A media player on 2026.10 firmware: the flag, not the version, decides."""
    async with rig(esphome_version="2026.10.0") as r:
        assert r.link.media_player_key is not None
        r.peer.enqueue(Text("The kitchen lights are on."))
        await r.wake_and_say(clip(ASK))
        playback = await r.wait_played(1)
        await r.device.wait_for_event(EventType.RUN_END)
        assert playback.status == 200 and playback.error is None
        assert api_audio_bytes(r.device) == 0


@pytest.mark.parametrize("profile", ["voice-pe-stock", "linux-voice-assistant"])
async def test_media_player_profiles_full_turn_and_barge_in(clip, profile: str) -> None:
    """Voice PE stock and linux-voice-assistant: announcements; the mic keeps streaming.

    A full turn plays in full; speech over the next answer stops the media player.
    """
    async with rig(profile=profile) as r:
        assert r.link.media_player_key is not None
        r.peer.enqueue(Text("The kitchen lights are on."))
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        child = await r.wake_and_say(clip(ASK))
        first = await r.wait_played(1)
        assert first.error is None and not first.stopped
        r.device.say(clip(ASK), wake_word=None)
        await r.peer.wait_for_request(2)
        await r.states.wait_for(SessionState.SPEAKING, 2)
        await r.playing()
        mark = r.device.mark()
        r.device.say(clip(STOP), wake_word=None)
        cut = await r.wait_played(2)
        assert cut.stopped
        assert stop_commands(r.device, mark) >= 1
        assert api_audio_bytes(r.device) == 0
        assert [(m.role, m.interrupted) for m in r.history(child)][:4] == [
            ("user", False),
            ("assistant", False),
            ("user", False),
            ("assistant", True),
        ]
        assert mic_ending_events(r.device) == []
