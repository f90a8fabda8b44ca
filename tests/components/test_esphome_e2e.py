"""Pipeline mode end to end through Home Assistant's own ``esphome`` integration.

An emulated ESP32 voice satellite (Voice PE firmware behaviour, ``tests.peers.esphome``)
is added through HA's esphome config flow; it speaks espeak-ng clips into HA's Assist
pipeline, whose STT and TTS are HA's ``wyoming`` entities on the offline speech
servers and whose agent is Realtime Voice (the loopback OpenAI peer, or HA's own agent
through the HA-agent brain). The device fetches the answer audio from HA's HTTP server
as Voice PE's media player does. See ``esphome_rig`` for the few harness needs.

Mic audio streams at real-time pace unless a test says otherwise (``speed``), and
utterances end by HA's own VAD unless a test sends ``end=True`` after the speech.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.rtvoice.kernel import Capability
from homeassistant.const import STATE_ON
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import intent
from tests.components.common import BED, KITCHEN, agent_entry, openai_entry
from tests.components.esphome_rig import (
    Rig,
    esphome_flow,
    esphome_rig,
    spoken,
    wait,
)
from tests.components.pipeline.helpers import GatedBedLightOn
from tests.peers.esphome import EmulatedDevice, EventType, Interrupt, Kind, Run
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall, WaitFor

pytestmark = pytest.mark.usefixtures("mock_async_zeroconf", "socket_enabled")

ANSWER = "The kitchen lights are on."
# HA 2025.4's Assist API names its tools after the intents; 2026.x prefixes them.
TURN_ON_TOOL = "HassTurnOn"
COOLDOWN = 2.0  # seconds: HA's WAKE_WORD_COOLDOWN for a repeated wake word phrase


def events_of(run: Run, event_type: EventType) -> list[dict[str, Any]]:
    """Data of a run's events of one type."""
    return [e.detail["data"] for e in run.events if e.detail["type"] == event_type]


def tts_text(run: Run) -> str:
    """The answer text the run announced (TTS_START)."""
    [data] = events_of(run, EventType.TTS_START)
    return str(data["text"])


async def heard(rig: Rig, run: Run, *extra_phrases: str) -> str:
    """What the STT server recognises in the answer audio the device played."""
    [playback] = [p for p in rig.device.playbacks if p.source == "tts_end"][-1:]
    assert playback.error is None and playback.finished_at is not None
    assert playback.format is not None
    assert (playback.format.sample_rate, playback.format.channels) == (16000, 1)
    phrases = [tts_text(run).lower().rstrip("."), *extra_phrases]
    await rig.stt_server.set_phrases([*rig.stt_server.phrases, *phrases])
    return await rig.recognise(playback.pcm)


async def test_voice_turn_turns_the_light_on(
    hass: HomeAssistant,
    tmp_path: Path,
    hass_client_no_auth: ClientSessionGenerator,
    openai_peer: OpenAIPeer,
) -> None:
    """Wake, speak, the light turns on, the answer is heard; all at real-time pace.

    The satellite is an RT channel pair with its prompt sections (area from the
    device's suggested area, features from its flags, the light in its area), and
    the transcript holds exactly the exchange.
    """
    entry = openai_entry(hass, openai_peer)
    async with esphome_rig(hass, tmp_path, hass_client_no_auth, entry) as rig:
        device = rig.device
        channels = {c.name: c for c in entry.runtime_data.channels.list()}
        for name in (f"{rig.satellite}:in", f"{rig.satellite}:out"):
            assert Capability.RT in channels[name].capabilities
        openai_peer.enqueue(
            ToolCall("call_1", TURN_ON_TOOL, '{"name": "Kitchen Lights"}')
        )
        openai_peer.enqueue(Text(ANSWER))

        run = device.say(await spoken("turn on the kitchen lights"))
        assert run is not None
        await wait(run.ended.wait(), 30)

        [stt_end] = events_of(run, EventType.STT_END)
        assert stt_end["text"] == "turn on the kitchen lights"
        assert run.mic_stop_reason  # HA's VAD ended the utterance (no end=True)
        assert hass.states.get(KITCHEN).state == STATE_ON
        assert tts_text(run) == ANSWER
        assert await heard(rig, run) == ANSWER.lower().rstrip(".")

        system = openai_peer.requests[0].messages[0]["content"]
        assert (
            f'You are speaking through the voice satellite "Kitchen satellite"'
            f" ({rig.satellite})." in system
        )
        assert "It is in the area Kitchen." in system
        assert (
            "It can: make announcements; start a conversation by itself." in system
        )
        # The light of the area, and the device's own exposed entities.
        assert "Exposed to you in the same area: Kitchen Lights (light), " in system

        [intent_end] = events_of(run, EventType.INTENT_END)
        assert intent_end["continue_conversation"] == "0"
        lines = await rig.transcript(intent_end["conversation_id"])
        assert lines[0] == "[user] turn on the kitchen lights"
        assert lines[1] == f"[tool_call] {TURN_ON_TOOL} name=Kitchen Lights"
        assert lines[2].startswith("[tool_result] ")
        assert lines[3:] == [f"[assistant] {ANSWER}"]
        assert device.voice.errors == []


async def test_noise_device_with_the_ha_agent_brain(
    hass: HomeAssistant,
    tmp_path: Path,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """An encrypted device, HA's own agent as the brain: the light turns on.

    The mic runs at 3x real time and the utterance ends with ``end=True``.
    """
    entry = agent_entry(hass)
    async with esphome_rig(
        hass, tmp_path, hass_client_no_auth, entry, encrypted=True, speed=3.0
    ) as rig:
        assert rig.esphome_entry.data["noise_psk"] == rig.device.noise_psk
        run = rig.device.say(await spoken("turn on the kitchen lights"), end=True)
        assert run is not None
        await wait(run.ended.wait(), 30)

        assert hass.states.get(KITCHEN).state == STATE_ON
        answer = tts_text(run)
        assert answer
        assert await heard(rig, run) == answer.lower().rstrip(".")
        [intent_end] = events_of(run, EventType.INTENT_END)
        # The HA-agent brain records HA's agent as one tool call of its own.
        lines = await rig.transcript(intent_end["conversation_id"])
        assert lines == [
            "[user] turn on the kitchen lights",
            "[tool_call] ha_assist text=turn on the kitchen lights",
            f'[tool_result] {{"speech": "{answer}", "response_type": "action_done"}}',
            f"[assistant] {answer}",
        ]


async def test_wrong_noise_key_is_refused(hass: HomeAssistant) -> None:
    """HA's esphome flow says the key is wrong; the device saw a MAC failure."""
    async with (
        EmulatedDevice(encrypted=True) as device,
        EmulatedDevice(encrypted=True) as other,
    ):
        result = await esphome_flow(hass, device, noise_psk=other.noise_psk)

        assert result["type"] is FlowResultType.FORM
        assert result["step_id"] == "encryption_key"
        assert result["errors"] == {"base": "invalid_psk"}
        failed = device.events.select(lambda e: e.kind is Kind.HANDSHAKE_FAILED)
        assert failed
        assert "MAC" in str(failed[-1].detail["reason"])
        assert hass.config_entries.async_entries("esphome") == []
