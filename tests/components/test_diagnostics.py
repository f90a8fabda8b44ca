"""Diagnostics of a real entry: a snapshot, and no secret or conversation text."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.components.diagnostics import (
    get_diagnostics_for_config_entry,
)
from pytest_homeassistant_custom_component.syrupy import HomeAssistantSnapshotExtension
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator
from syrupy.assertion import SnapshotAssertion

from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_ESPHOME_VERSION,
    CONF_MODEL,
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_PROMPT,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from custom_components.rtvoice.redact import safe_url
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant
from tests.components.common import (
    PEER_API_KEY,
    agent_entry,
    async_load_entry,
    openai_entry,
)
from tests.components.pipeline.helpers import QUIET_SATELLITE, SATELLITE, Home
from tests.peers.esphome import EmulatedDevice
from tests.peers.openai_server import OpenAIPeer, Text

ENTRY_ID = "01JRTV0ICEDIAGN0ST1CS00000"
PROMPT = "You are Marvin. Codeword PROMPT-MARKER-7731."
UTTERANCE = "UTTERANCE-MARKER-4242 please dim the kitchen"
ANSWER = "ANSWER-MARKER-9191 done."


@pytest.fixture
def snapshot(snapshot: SnapshotAssertion) -> SnapshotAssertion:
    """Use HA's snapshot format and folder (tests/components/snapshots)."""
    return snapshot.use_extension(HomeAssistantSnapshotExtension)


async def _loaded_entry(home: Home, peer: OpenAIPeer) -> MockConfigEntry:
    entry = openai_entry(
        home.hass, peer, entry_id=ENTRY_ID, options={CONF_PROMPT: PROMPT}
    )
    home.entry = entry
    return await async_load_entry(home.hass, entry)


async def _talk(home: Home, peer: OpenAIPeer) -> tuple[str, str]:
    """One finished (archived) conversation and one live one, with text in both."""
    control = home.control
    peer.enqueue(Text(ANSWER))
    peer.enqueue(Text(ANSWER))
    archived = await control.async_start(QUIET_SATELLITE)
    control.send(archived, UTTERANCE)
    await home.wait_snapshot(lambda s: s.id == archived and s.completed_rounds == 1)
    assert await control.async_stop(archived) == 2
    live = await control.async_start(SATELLITE)
    control.send(live, UTTERANCE)
    await home.wait_snapshot(lambda s: s.id == live and s.completed_rounds == 1)
    return archived, live


def _normalized(data: Any, replacements: dict[str, str]) -> Any:
    """Replace run-specific values (ids, port, timings) by stable names."""
    text = json.dumps(data)
    for actual, stable in replacements.items():
        text = text.replace(actual, stable)
    result = json.loads(text)
    for conversation in result["runtime"]["conversations"]:
        stats = conversation["stats"]
        assert isinstance(stats["first_delta_ms"], float)
        assert stats["first_delta_ms"] >= 0
        stats["first_delta_ms"] = "<ms>"
    # Section texts belong to the satellite directory and HA's LLM API: their
    # lengths are not part of the diagnostics contract, their presence is.
    for section in result["runtime"]["prompt_sections"]:
        assert section["chars"] > 0
        section["chars"] = "<chars>"
    return result


async def test_diagnostics_snapshot(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    home: Home,
    openai_peer: OpenAIPeer,
    snapshot: SnapshotAssertion,
) -> None:
    """Configuration, satellites, conversations, channels and sections, redacted."""
    entry = await _loaded_entry(home, openai_peer)
    archived, live = await _talk(home, openai_peer)
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, entry)
    assert diagnostics["entry"]["data"][CONF_API_KEY] == "**REDACTED**"
    assert diagnostics["entry"]["options"][CONF_PROMPT] == "**REDACTED**"
    assert [c["id"] for c in diagnostics["runtime"]["conversations"]] == [live]
    assert diagnostics["runtime"]["archived_conversations"] == [
        {"id": archived, "messages": 2}
    ]
    replacements = {
        archived: "<archived conversation>",
        live: "<live conversation>",
        str(openai_peer.port): "<port>",
        home.device_of(SATELLITE): "<kitchen device>",
        home.device_of(QUIET_SATELLITE): "<hall device>",
    }
    assert _normalized(diagnostics, replacements) == snapshot


async def test_no_secret_and_no_conversation_text(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    home: Home,
    openai_peer: OpenAIPeer,
) -> None:
    """The API key, the prompt and what was said never appear, wherever they went."""
    entry = await _loaded_entry(home, openai_peer)
    archived, live = await _talk(home, openai_peer)
    # The text really is in the runtime: a transcript holds it.
    assert UTTERANCE in home.control.transcript(archived, 0, 10, "text")["transcript"]
    assert ANSWER in json.dumps(home.control.transcript(live, 0, 10, "raw"))
    text = json.dumps(await get_diagnostics_for_config_entry(hass, hass_client, entry))
    for secret in (PEER_API_KEY, PROMPT, "PROMPT-MARKER", "UTTERANCE-MARKER", "ANSWER"):
        assert secret not in text
    assert archived in text
    assert live in text


async def test_entry_not_loaded(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    home: Home,
    openai_peer: OpenAIPeer,
) -> None:
    """A not loaded entry has no runtime; credentials in its URL are dropped."""
    await _loaded_entry(home, openai_peer)  # loads the integration's platforms
    other = MockConfigEntry(
        domain=DOMAIN,
        title="Other",
        data={
            CONF_BRAIN: BRAIN_OPENAI,
            CONF_BASE_URL: "https://user:pa55word@llm.example:8443/v1?api-key=k3y#frag",
            CONF_API_KEY: "sk-other",
            CONF_MODEL: "m",
        },
        options={**DEFAULT_OPTIONS_OPENAI, CONF_PROMPT: PROMPT},
    )
    other.add_to_hass(hass)
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, other)
    assert diagnostics == {
        "entry": {
            "title": "Other",
            "state": "not_loaded",
            "data": {
                CONF_BRAIN: BRAIN_OPENAI,
                CONF_BASE_URL: "https://llm.example:8443/v1",
                CONF_API_KEY: "**REDACTED**",
                CONF_MODEL: "m",
            },
            "options": {**DEFAULT_OPTIONS_OPENAI, CONF_PROMPT: "**REDACTED**"},
            "subentries": [],
        }
    }
    for secret in ("pa55word", "user", "k3y", "frag", "sk-other", "Marvin"):
        assert secret not in json.dumps(diagnostics)


async def test_ha_agent_entry(
    hass: HomeAssistant, hass_client: ClientSessionGenerator, home: Home
) -> None:
    """An entry that delegates to an HA agent: the agent is named, no tools."""
    entry = agent_entry(hass, "conversation.home_assistant", title="Offline")
    home.entry = entry
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, entry)
    assert diagnostics["entry"]["data"] == {
        CONF_BRAIN: BRAIN_HA_AGENT,
        CONF_AGENT_ID: "conversation.home_assistant",
    }
    runtime = diagnostics["runtime"]
    assert [s["entity_id"] for s in runtime["satellites"]] == [
        QUIET_SATELLITE,
        SATELLITE,
    ]
    assert runtime["conversations"] == []
    assert runtime["archived_conversations"] == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
        ("https://u:p@api.example/v1?key=1#x", "https://api.example/v1"),
        ("https://token@api.example/v1", "https://api.example/v1"),
        ("not a url", "**REDACTED**"),
        ("http://[::1", "**REDACTED**"),
    ],
)
def test_safe_url(url: str, expected: str) -> None:
    """User info, query and fragment are dropped; what is not a URL is redacted."""
    assert safe_url(url) == expected


@pytest.mark.usefixtures("socket_enabled")
async def test_duplex_and_wyoming_links(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    openai_peer: OpenAIPeer,
) -> None:
    """The satellites' links: connection and counters; the encryption key redacted.

    A real (emulated) ESPHome device, encrypted, and a Wyoming satellite whose
    port answers nothing (the link keeps trying).
    """
    async with EmulatedDevice(
        name="kitchen-duplex", encrypted=True, esphome_version="2026.9.0"
    ) as device:
        with socket.socket() as sock:  # a free port: nothing listens there
            sock.bind(("127.0.0.1", 0))
            free_port = sock.getsockname()[1]
        entry = openai_entry(
            hass,
            openai_peer,
            esphome=[
                {
                    CONF_HOST: device.host,
                    CONF_PORT: device.port,
                    CONF_NOISE_PSK: device.noise_psk,
                    CONF_NAME: "Kitchen duplex",
                    # 2026.x never answers a login: connect without one.
                    CONF_ESPHOME_VERSION: "2026.9.0",
                }
            ],
            wyoming=[{CONF_HOST: "127.0.0.1", CONF_PORT: free_port, CONF_NAME: "Hall"}],
        )
        await async_load_entry(hass, entry)
        [link] = entry.runtime_data.duplex.links.values()
        async with asyncio.timeout(30):  # a safety net, not a pass condition
            await link.wait_connected()
        diagnostics = await get_diagnostics_for_config_entry(hass, hass_client, entry)
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
    assert device.noise_psk is not None
    assert device.noise_psk not in json.dumps(diagnostics)
    esphome, wyoming_stored = diagnostics["entry"]["subentries"]
    assert (esphome["type"], esphome["title"]) == (SUBENTRY_ESPHOME, "Kitchen duplex")
    assert esphome["data"][CONF_NOISE_PSK] == "**REDACTED**"
    assert (wyoming_stored["type"], wyoming_stored["title"]) == (
        SUBENTRY_WYOMING,
        "Hall",
    )
    runtime = diagnostics["runtime"]
    [duplex] = runtime["duplex_satellites"]
    assert duplex == {
        "key": f"{device.host}:{device.port}",
        "available": True,
        "esphome_version": "2026.9.0",
        "login": False,
        "answer_output": "media_player",  # no SPEAKER flag: any version
        "last_error": None,
        "mic_oversized_messages": 0,
        "mic_odd_messages": 0,
        "dsp_dropped": 0,
        "conversation": None,
    }
    [wyoming] = runtime["wyoming_satellites"]
    assert wyoming["key"] == f"127.0.0.1:{free_port}"
    assert wyoming["connected"] is False
    assert wyoming["state"] in {"connecting", "disconnected"}
    assert wyoming["held_by_wyoming_integration"] is False
    assert wyoming["stats"]["connects"] == 0
    assert wyoming["stats"]["refused_chunks"] == 0
    assert wyoming["dsp_dropped"] == 0
    assert wyoming["conversation"] is None
