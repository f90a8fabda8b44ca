"""Duplex mode on firmware before 2026.9, through Home Assistant: answers via the media player.

An emulated Voice PE on ESPHome 2025.4 (a media player, no raw API audio) is added as
a duplex satellite; each answer reaches it as an announcement of a live WAV stream
served by HA's HTTP app (the harness's ``aiohttp_client`` on 127.0.0.1, started once
the stream view is registered). STT/TTS are HA's wyoming entities on the offline
speech servers, the model is the loopback OpenAI peer. The device-side queue (audio
fetched and not yet played) is printed, not asserted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
import dataclasses
from pathlib import Path

import pytest
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.rtvoice.duplex import BargeIn
from custom_components.rtvoice.esphome_link import EsphomeLink
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from tests.accounts import accounted, duplex_account
from tests.components.common import async_load_entry, openai_entry
from tests.components.esphome_rig import add_wyoming_service, entity_of, spoken, wait
from tests.components.test_duplex_satellite import (
    add_duplex,
    device_input,
    duplex_device,
    wait_for_state,
)
from tests.duplex.conftest import noise
from tests.peers.esphome import VOICE_PE_FEATURES, EmulatedDevice, Interrupt
from tests.peers.esphome.record import Kind
from tests.peers.esphome.speaker import Playback
from tests.peers.openai_server import OpenAIPeer, Text
from tests.peers.speech import after_a_moment
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

pytestmark = pytest.mark.usefixtures("socket_enabled")

ASK = "turn on the kitchen lights"
ANSWER = "the kitchen lights are on"
STOP = "stop"
LONG = " ".join(["The kitchen lights are on."] * 4)
SAFETY = 30.0


@dataclasses.dataclass
class Rig:
    """The wired satellite."""

    hass: HomeAssistant
    device: EmulatedDevice
    link: EsphomeLink
    satellite: str

    def announcements(self) -> list[Playback]:
        """Return what the media player played."""
        return [p for p in self.device.playbacks if p.source == "media_player"]

    async def ended(self, count: int) -> Playback:
        """Wait until the ``count``-th announcement finished, was stopped or failed."""
        while True:
            since = self.device.mark()
            playbacks = self.announcements()
            if len(playbacks) >= count:
                p = playbacks[count - 1]
                if p.finished_at is not None or p.stopped or p.error is not None:
                    return p
            await wait(
                self.device.wait_for(lambda e: e.kind is Kind.PLAYBACK, since), SAFETY
            )

    async def playing(self, count: int) -> Playback:
        """Wait until the ``count``-th announcement has received audio."""
        while True:
            since = self.device.mark()
            playbacks = self.announcements()
            if len(playbacks) >= count and playbacks[count - 1].ahead_bytes:
                return playbacks[count - 1]
            await wait(self.device.wait_for(lambda e: True, since), SAFETY)


def report(playback: Playback, what: str) -> None:
    """Print the device-side queue of one announcement."""
    ms = sorted(b / 32 for b in playback.ahead_bytes)
    print(  # noqa: T201 - the measurement this test reports
        f"\n[{what}] fetched ahead of played: p50 {ms[len(ms) // 2] if ms else 0:.0f} ms,"
        f" max {ms[-1] if ms else 0:.0f} ms ({len(ms)} arrivals); stalls"
        f" {playback.stalls}; played {playback.played_bytes / 32:.0f} ms"
    )


@asynccontextmanager
async def fallback_rig(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    client_factory: ClientSessionGenerator,
    barge_in: BargeIn | None = None,
) -> AsyncIterator[Rig]:
    """Add an ESPHome 2025.4 Voice PE as a duplex satellite and serve HA's HTTP app."""
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    entry = openai_entry(hass, openai_peer)
    await async_load_entry(hass, entry)
    async with (
        WyomingSttServer(phrases=[ASK, ANSWER, STOP]) as stt_server,
        WyomingTtsServer() as tts_server,
        duplex_device(
            encrypted=True, esphome_version="2025.4.0", features=VOICE_PE_FEATURES
        ) as device,
    ):
        stt_entry = await add_wyoming_service(hass, stt_server.port)
        tts_entry = await add_wyoming_service(hass, tts_server.port)
        await async_update_pipeline(
            hass,
            async_get_pipeline(hass),
            stt_engine=entity_of(hass, stt_entry, "stt"),
            stt_language="en",
            tts_engine=entity_of(hass, tts_entry, "tts"),
            tts_language="en",
        )
        result = await add_duplex(hass, entry, device_input(device))
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        await hass.async_block_till_done()  # reloaded with the satellite: view exists
        client = await client_factory()  # serve HA's HTTP app from now on
        hass.config.internal_url = f"http://127.0.0.1:{client.server.port}"
        satellite = entity_of(hass, entry, "assist_satellite")
        await wait_for_state(hass, satellite, {"idle"})
        await wait(device.wait_for_voice_client(), SAFETY)
        link = next(iter(entry.runtime_data.duplex.links.values()))
        assert link.media_player_key is not None  # old firmware: the media player
        if barge_in is not None:
            # The per-satellite barge-in option is applied by the entity's branch;
            # until then the test sets it on the link's binding.
            link.binding = dataclasses.replace(
                link.binding,
                options=dataclasses.replace(link.binding.options, barge_in=barge_in),
            )
        try:
            with accounted(
                lambda: duplex_account(link, stt_server, len(openai_peer.requests), [])
            ):
                yield Rig(hass, device, link, satellite)
        finally:
            for unload in (entry, stt_entry, tts_entry):
                if unload.state is ConfigEntryState.LOADED:
                    assert await hass.config_entries.async_unload(unload.entry_id)
            await hass.async_block_till_done()
    assert device.voice.errors == []


async def test_old_firmware_answer_and_wake_word_barge_in(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """Wake, ask: the answer is heard through the media player; the wake word cuts the next."""
    async with fallback_rig(hass, tmp_path, openai_peer, hass_client_no_auth) as r:
        openai_peer.enqueue(Text("The kitchen lights are on."))
        run = r.device.say(await spoken(ASK))
        assert run is not None
        await wait(run.streaming.wait(), SAFETY)
        first = await r.ended(1)
        report(first, "answer")
        assert first.status == 200 and not first.stopped
        assert await r.link.binding.stt(first.pcm) == ANSWER
        assert not [p for p in r.device.playbacks if p.source == "api"]

        openai_peer.enqueue(Text(LONG))
        openai_peer.enqueue(Text("Okay."))
        r.device.say(await spoken(ASK), wake_word=None)  # same conversation
        await r.playing(2)
        assert r.device.say(await spoken(STOP), interrupt=Interrupt.RESTART)
        cut = await r.ended(2)
        report(cut, "cut by the wake word")
        assert cut.stopped and cut.finished_at is None
        third = await r.ended(3)
        assert not third.stopped
        assert openai_peer.requests[-1].messages[-1]["content"] == STOP


async def test_old_firmware_vad_barge_in_and_cough(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """``vad``: a cough stalls and resumes the same stream; words stop the player."""
    async with fallback_rig(
        hass, tmp_path, openai_peer, hass_client_no_auth, BargeIn.VAD
    ) as r:
        openai_peer.enqueue(Text(LONG))
        run = r.device.say(await spoken(ASK))
        assert run is not None
        await r.playing(1)
        r.device.say(after_a_moment(noise(200, -12.0)), wake_word=None)
        resumed = await r.ended(1)
        report(resumed, "cough: paused and resumed")
        assert not resumed.stopped and resumed.finished_at is not None
        conversation = r.link.conversation
        assert conversation is not None
        assert conversation.session.stats.false_barge_ins >= 1

        openai_peer.enqueue(Text(LONG))
        openai_peer.enqueue(Text("Okay."))
        r.device.say(await spoken(ASK), wake_word=None)
        await r.playing(2)
        r.device.say(after_a_moment(await spoken(STOP)), wake_word=None)
        cut = await r.ended(2)
        report(cut, "cut by words")
        assert cut.stopped
        await r.ended(3)
        assert openai_peer.requests[-1].messages[-1]["content"] == STOP
