"""Pipeline mode end to end through Home Assistant's own ``esphome`` integration.

An emulated ESP32 voice satellite (Voice PE firmware behaviour, ``tests.peers.esphome``)
is added through HA's esphome config flow; it speaks espeak-ng clips into HA's Assist
pipeline, whose STT and TTS are HA's ``wyoming`` entities on the offline speech
servers and whose agent is Realtime Voice (the loopback OpenAI peer, or HA's own agent
through the HA-agent brain). The device fetches the answer audio from HA's HTTP server
as Voice PE's media player does. See ``esphome_rig`` for the few harness needs.

Mic audio streams at real-time pace unless a test says otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from homeassistant.const import STATE_ON
from homeassistant.core import HomeAssistant
from tests.components.common import KITCHEN, agent_entry, openai_entry
from tests.components.esphome_rig import Rig, esphome_rig, spoken, wait
from tests.peers.esphome import EventType
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall

pytestmark = pytest.mark.usefixtures("mock_async_zeroconf", "socket_enabled")

ANSWER = "The kitchen lights are on."


def intent_end(rig: Rig, since: int = 0) -> dict[str, str]:
    """Data of the first INTENT_END the device got at ``since`` or later."""
    for entry in list(rig.device.events)[since:]:
        if entry.detail.get("type") == EventType.INTENT_END:
            return entry.detail["data"]
    raise AssertionError("no INTENT_END")


async def test_voice_turn_turns_the_light_on(
    hass: HomeAssistant,
    tmp_path: Path,
    hass_client_no_auth: ClientSessionGenerator,
    openai_peer: OpenAIPeer,
) -> None:
    """Wake, speak, the light turns on, the answer is heard; real-time pace."""
    entry = openai_entry(hass, openai_peer)
    async with esphome_rig(hass, tmp_path, hass_client_no_auth, entry) as rig:
        device = rig.device
        # HA 2025.4's Assist API names the tool "HassTurnOn" (2026.x prefixes it).
        openai_peer.enqueue(
            ToolCall("call_1", "HassTurnOn", '{"name": "Kitchen Lights"}')
        )
        openai_peer.enqueue(Text(ANSWER))

        run = device.say(await spoken("turn on the kitchen lights"))
        assert run is not None
        stt_end = await wait(device.wait_for_event(EventType.STT_END))
        assert stt_end.detail["data"]["text"] == "turn on the kitchen lights"
        await wait(run.ended.wait(), 30)

        assert hass.states.get(KITCHEN).state == STATE_ON
        playback = device.playbacks[-1]
        assert playback.source == "tts_end"
        assert playback.error is None and playback.finished_at is not None
        assert playback.format is not None
        assert (playback.format.sample_rate, playback.format.channels) == (16000, 1)
        await rig.stt_server.set_phrases([*rig.stt_server.phrases, ANSWER.lower()])
        assert await rig.recognise(playback.pcm) == ANSWER.lower()
