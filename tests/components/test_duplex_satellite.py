"""Duplex ESPHome satellites through Home Assistant (issue 10, preview).

Real peers on 127.0.0.1, nothing mocked: the emulated device (real aioesphomeapi
clients connect to it), the OpenAI-compatible peer, and for the full turn the
Wyoming speech servers set up through HA's ``wyoming`` integration as the preferred
pipeline's STT and TTS engines. Waits are on events; timeouts are safety nets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import (
    CONF_DUPLEX_SATELLITES,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
)
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_PORT, STATE_UNAVAILABLE
from homeassistant.core import Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.helpers.event import async_track_state_change_event
from tests.components.common import async_load_entry, openai_entry
from tests.components.esphome_rig import add_wyoming_service, entity_of, spoken, wait
from tests.peers.esphome import ATOM_ECHO_FEATURES, EmulatedDevice, EventType
from tests.peers.esphome.config import Feature
from tests.peers.openai_server import OpenAIPeer, Text
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

pytestmark = pytest.mark.usefixtures("socket_enabled")

FIRMWARE = "2026.9.0"  # plays raw API audio; never answers login
ASK = "turn on the kitchen lights"
ANSWER = "the kitchen lights are on"
SAFETY = 30.0
WRONG_KEY = "d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3c="  # 32 bytes, not the key


def duplex_device(**config: Any) -> EmulatedDevice:
    """Return an Atom Echo-like satellite on firmware 2026.9 (raw API audio)."""
    config.setdefault("name", "kitchen-duplex")
    config.setdefault("friendly_name", "Kitchen duplex")
    config.setdefault("mac_address", "AA:BB:CC:DD:EE:42")
    config.setdefault("esphome_version", FIRMWARE)
    config.setdefault("features", ATOM_ECHO_FEATURES)
    return EmulatedDevice(**config)


async def add_duplex(
    hass: HomeAssistant, entry: MockConfigEntry, user_input: dict[str, Any]
) -> dict[str, Any]:
    """Run the options flow's "add a duplex satellite" step; the last result."""
    menu = await hass.config_entries.options.async_init(entry.entry_id)
    assert menu["type"] is FlowResultType.MENU
    assert "add_duplex" in menu["menu_options"]
    form = await hass.config_entries.options.async_configure(
        menu["flow_id"], {"next_step_id": "add_duplex"}
    )
    assert form["type"] is FlowResultType.FORM and form["step_id"] == "add_duplex"
    return dict(
        await hass.config_entries.options.async_configure(form["flow_id"], user_input)
    )


def device_input(device: EmulatedDevice, key: str | None = None) -> dict[str, Any]:
    """Return what a user types in for ``device`` (its own key unless given)."""
    user_input: dict[str, Any] = {CONF_HOST: device.host, CONF_PORT: device.port}
    psk = key if key is not None else device.noise_psk
    if psk:
        user_input[CONF_NOISE_PSK] = psk
    return user_input


async def wait_for_state(hass: HomeAssistant, entity_id: str, wanted: set[str]) -> str:
    """Wait until ``entity_id``'s state is one of ``wanted`` (state events)."""
    found: asyncio.Future[str] = hass.loop.create_future()

    @callback
    def changed(event: Event[EventStateChangedData]) -> None:
        state = event.data["new_state"]
        if state is not None and state.state in wanted and not found.done():
            found.set_result(state.state)

    unsub = async_track_state_change_event(hass, entity_id, changed)
    try:
        current = hass.states.get(entity_id)
        if current is not None and current.state in wanted:
            return current.state
        return await wait(found, SAFETY)
    finally:
        unsub()


async def test_add_duplex_satellite_is_stored(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """An encrypted voice satellite passes the test and is stored with its identity."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device(encrypted=True) as device:
        result = await add_duplex(hass, entry, device_input(device))
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    [stored] = entry.options[CONF_DUPLEX_SATELLITES]
    assert stored == {
        CONF_HOST: device.host,
        CONF_PORT: device.port,
        CONF_NOISE_PSK: device.noise_psk,
        CONF_NAME: "Kitchen duplex",
        CONF_MAC: "AA:BB:CC:DD:EE:42",
        CONF_ESPHOME_VERSION: FIRMWARE,
    }
    assert "prompt" in entry.options  # the settings are kept


@pytest.mark.parametrize(
    ("encrypted", "key", "error"),
    [
        (True, WRONG_KEY, "invalid_key"),
        (True, "", "requires_encryption"),
        (False, WRONG_KEY, "encryption_not_offered"),
    ],
)
async def test_add_duplex_key_errors(
    hass: HomeAssistant,
    openai_peer: OpenAIPeer,
    encrypted: bool,
    key: str,
    error: str,
) -> None:
    """A wrong, missing or unwanted key: a distinct error, nothing stored."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device(encrypted=encrypted) as device:
        result = await add_duplex(hass, entry, device_input(device, key))
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": error}
    assert CONF_DUPLEX_SATELLITES not in entry.options


async def test_add_duplex_unreachable(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Nothing listens on the port: cannot_connect."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device() as device:
        host, port = device.host, device.port
    result = await add_duplex(hass, entry, {CONF_HOST: host, CONF_PORT: port})
    assert result["errors"] == {"base": "cannot_connect"}


async def test_add_duplex_not_a_voice_satellite(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """An ESPHome device without voice assistant flags is refused."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device(features=Feature(0)) as device:
        result = await add_duplex(hass, entry, device_input(device))
    assert result["errors"] == {"base": "not_voice_satellite"}


@asynccontextmanager
async def speech_pipeline(hass: HomeAssistant) -> AsyncIterator[None]:
    """Set up the Wyoming servers via HA's wyoming integration as the engines."""
    async with (
        WyomingSttServer(phrases=[ASK, ANSWER]) as stt_server,
        WyomingTtsServer() as tts_server,
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
        try:
            yield
        finally:
            for unload in (stt_entry, tts_entry):
                if unload.state is ConfigEntryState.LOADED:
                    await hass.config_entries.async_unload(unload.entry_id)


async def test_duplex_turn_through_home_assistant(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Add a satellite; its entity appears and becomes available; wake, ask, hear.

    The answer audio reaches the device as raw API audio and HA's STT hears the
    answer in it; the entity follows the session; unloading leaves no task.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    entry = openai_entry(hass, openai_peer)
    await async_load_entry(hass, entry)
    async with (
        speech_pipeline(hass),
        duplex_device(encrypted=True) as device,
    ):
        result = await add_duplex(hass, entry, device_input(device))
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        await hass.async_block_till_done()  # the entry reloads with the satellite
        assert entry.state is ConfigEntryState.LOADED
        satellite = entity_of(hass, entry, "assist_satellite")
        assert await wait_for_state(hass, satellite, {"idle"}) == "idle"
        await wait(device.wait_for_voice_client(), SAFETY)
        registry_entry = er.async_get(hass).async_get(satellite)
        assert registry_entry is not None and registry_entry.device_id is not None
        device_entry = dr.async_get(hass).async_get(registry_entry.device_id)
        assert device_entry is not None
        assert device_entry.name == "Kitchen duplex"
        assert (dr.CONNECTION_NETWORK_MAC, "aa:bb:cc:dd:ee:42") in (
            device_entry.connections
        )

        openai_peer.enqueue(Text("The kitchen lights are on."))
        run = device.say(await spoken(ASK))
        assert run is not None
        await wait(run.streaming.wait(), SAFETY)
        await wait_for_state(hass, satellite, {"responding"})
        await wait_for_state(hass, satellite, {"idle"})  # silence ended the session
        await wait(device.wait_for_event(EventType.RUN_END), SAFETY)

        playback = device.playbacks[-1]
        assert playback.source == "api"
        runtime = entry.runtime_data
        link = next(iter(runtime.duplex.links.values()))
        assert await link.binding.stt(playback.pcm) == ANSWER
        request = openai_peer.requests[-1]
        assert request.messages[-1]["content"] == ASK

        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
        assert runtime.duplex.links == {}
        leftover = [
            t
            for t in asyncio.all_tasks()
            if (t.get_name() or "").startswith("rtvoice") and not t.done()
        ]
        assert leftover == []
        assert hass.states.get(satellite).state == STATE_UNAVAILABLE
    assert device.voice.errors == []


async def test_remove_duplex_satellite_keeps_the_others(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The remove step lists the stored satellites and drops the chosen one."""
    entry = openai_entry(hass, openai_peer)
    async with (
        duplex_device(encrypted=True) as first,
        duplex_device(name="hall", mac_address="AA:BB:CC:DD:EE:43") as second,
    ):
        for device in (first, second):
            result = await add_duplex(hass, entry, device_input(device))
            assert result["type"] is FlowResultType.CREATE_ENTRY, result
    assert len(entry.options[CONF_DUPLEX_SATELLITES]) == 2
    menu = await hass.config_entries.options.async_init(entry.entry_id)
    assert "remove_duplex" in menu["menu_options"]
    form = await hass.config_entries.options.async_configure(
        menu["flow_id"], {"next_step_id": "remove_duplex"}
    )
    result = await hass.config_entries.options.async_configure(
        form["flow_id"], {CONF_DUPLEX_SATELLITES: ["aa:bb:cc:dd:ee:42"]}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    [kept] = entry.options[CONF_DUPLEX_SATELLITES]
    assert kept[CONF_MAC] == "AA:BB:CC:DD:EE:43"
    assert "prompt" in entry.options
