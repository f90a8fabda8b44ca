"""Wyoming satellites through Home Assistant (issue 8 §2).

Real peers on 127.0.0.1, nothing mocked: a real `wyoming-satellite` 1.0.0 process in
its own venv (tests/peers/wyoming_satellite.py, always-streaming mode) with its mic fed
by espeak-ng speech at real-time pace and its speaker captured; the offline Wyoming
speech servers set up through HA's ``wyoming`` integration as the preferred
pipeline's STT and TTS; the OpenAI-compatible peer as the model; openWakeWord
(pyopen-wakeword) on the server for "hey jarvis". The repair test uses a ``wyoming``
config entry that is not set up (HA's wyoming integration would take the satellite
over for real): the repair reads only the entries. Waits are on events; timeouts are
safety nets. Skipped when the satellite's venv or the speech tools are missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from ipaddress import ip_address
import logging
from pathlib import Path
import socket
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from custom_components.rtvoice.audio.wakeword import (
    MODELS,
    WakeWordEngine,
    WakeWordUnavailableError,
)
from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_NAME,
    CONF_PROMPT,
    CONF_TURN_EAGERNESS,
    CONF_WAKE_WORD,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    SUBENTRY_WYOMING,
)
from custom_components.rtvoice.runtime import RtVoiceConfigEntry
from custom_components.rtvoice.wyoming_link import WyomingSatelliteLink
from homeassistant.components.assist_pipeline.pipeline import (
    async_create_default_pipeline,
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.config_entries import (
    SOURCE_IGNORE,
    SOURCE_ZEROCONF,
    ConfigEntryState,
)
from homeassistant.const import CONF_HOST, CONF_PORT, STATE_ON, STATE_UNAVAILABLE
from homeassistant.core import Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import (
    device_registry as dr,
    entity_registry as er,
    intent,
    issue_registry as ir,
)
from homeassistant.helpers.event import async_track_state_change_event
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo
from tests.components.common import (
    BED,
    async_load_entry,
    async_setup_demo_entry,
    async_unload_demo_entry,
    openai_entry,
    reconfigure_satellite,
    start_satellite_flow,
    stored_satellites,
)
from tests.components.esphome_rig import add_wyoming_service, entity_of, spoken, wait
from tests.components.pipeline.helpers import GatedBedLightOn
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall, WaitFor
from tests.peers.speech import after_a_moment, speech_tools_available
from tests.peers.wyoming_satellite import (
    Microphone,
    SatelliteVenvError,
    Speaker,
    WyomingSatellite,
    satellite_python,
)
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

pytestmark = pytest.mark.usefixtures("socket_enabled")

_LOGGER = logging.getLogger(__name__)

WAKE = "hey jarvis"
ASK_LIGHTS = "turn on the kitchen lights"
ASK_TIME = "what time is it"
LIGHTS_ON = "the kitchen lights are on"
NOON = "it is noon"
STORY = (
    "Once upon a time there was a small house with a big kitchen. "
    "The kitchen had many lights and a red door. "
    "Every morning the family made breakfast there and talked about the day. "
    "Then they went out into the garden to look at the flowers."
)
PHRASES = [ASK_LIGHTS, ASK_TIME, LIGHTS_ON, NOON, WAKE]
SAFETY = 60.0
SATELLITE_NAME = "test satellite"


@pytest.fixture(scope="session")
def sat_python() -> str:
    """Return the wyoming-satellite venv's python (scripts/wyoming_satellite_venv)."""
    if not speech_tools_available():
        pytest.skip("espeak-ng and sox are needed for speech clips")
    try:
        return satellite_python()
    except SatelliteVenvError as err:
        pytest.skip(f"the wyoming-satellite venv cannot be made: {err}")


@pytest.fixture(scope="session")
def wake_available() -> None:
    """Skip when pyopen-wakeword cannot run here (warms the process-wide cache)."""
    try:
        WakeWordEngine(["hey_jarvis"]).warm_up()
    except WakeWordUnavailableError as err:
        pytest.skip(str(err))


@asynccontextmanager
async def satellite_rig(sat_python: str) -> AsyncIterator[WyomingSatellite]:
    """Run a real wyoming-satellite with a test microphone and speaker."""
    async with (
        Microphone() as mic,
        Speaker() as speaker,
        WyomingSatellite(
            sat_python, mic=mic, speaker=speaker, name=SATELLITE_NAME
        ) as satellite,
    ):
        # The satellite starts its mic command once its server is up: ready.
        await wait(mic.connected.wait(), SAFETY)
        yield satellite


@asynccontextmanager
async def speech_pipeline(
    hass: HomeAssistant,
) -> AsyncIterator[tuple[WyomingSttServer, WyomingTtsServer]]:
    """Set up the Wyoming speech servers via HA's wyoming integration as engines."""
    async with (
        WyomingSttServer(phrases=PHRASES) as stt_server,
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
            yield stt_server, tts_server
        finally:
            for unload in (stt_entry, tts_entry):
                if unload.state is ConfigEntryState.LOADED:
                    await hass.config_entries.async_unload(unload.entry_id)


async def add_wyoming(
    hass: HomeAssistant, entry: MockConfigEntry, user_input: dict[str, Any]
) -> dict[str, Any]:
    """Press "Add Wyoming satellite" on the entry and submit; the last result."""
    form = await start_satellite_flow(hass, entry, SUBENTRY_WYOMING)
    assert form["type"] is FlowResultType.FORM and form["step_id"] == "user"
    return dict(
        await hass.config_entries.subentries.async_configure(
            form["flow_id"], user_input
        )
    )


def stored_satellite(satellite: WyomingSatellite, **settings: Any) -> dict[str, Any]:
    """Return a satellite as the options store it, woken by "hey jarvis" here."""
    return {
        CONF_HOST: satellite.host,
        CONF_PORT: satellite.port,
        CONF_NAME: SATELLITE_NAME,
        CONF_WAKE_WORD: "hey_jarvis",
        **settings,
    }


def zeroconf_info(host: str, port: int, name: str) -> ZeroconfServiceInfo:
    """Return what HA's zeroconf hands a flow for a ``_wyoming._tcp`` service."""
    return ZeroconfServiceInfo(
        ip_address=ip_address(host),
        ip_addresses=[ip_address(host)],
        port=port,
        hostname=f"{name}.local.",
        type="_wyoming._tcp.local.",
        name=f"{name}._wyoming._tcp.local.",
        properties={},
    )


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


def the_link(entry: RtVoiceConfigEntry) -> WyomingSatelliteLink:
    """Return the entry's one Wyoming link."""
    [link] = entry.runtime_data.wyoming.links.values()
    return link


async def say(satellite: WyomingSatellite, text: str) -> list[float]:
    """Speak ``text`` into the satellite's mic; return when each chunk was fed."""
    return await wait(satellite.mic.say(await spoken(text)), SAFETY)


async def say_over(satellite: WyomingSatellite, text: str) -> list[float]:
    """Speak ``text`` over the answer playing, a moment after it began (``say``)."""
    return await wait(satellite.mic.say(after_a_moment(await spoken(text))), SAFETY)


def rtvoice_tasks() -> list[asyncio.Task[Any]]:
    """Return the integration's tasks still running."""
    return [
        t
        for t in asyncio.all_tasks()
        if (t.get_name() or "").startswith("rtvoice") and not t.done()
    ]


# --- adding one ---------------------------------------------------------------------


async def test_add_wyoming_satellite_is_stored(
    hass: HomeAssistant, openai_peer: OpenAIPeer, sat_python: str
) -> None:
    """A real satellite passes describe → info and is stored with its name."""
    entry = openai_entry(hass, openai_peer)
    async with satellite_rig(sat_python) as satellite:
        result = await add_wyoming(
            hass,
            entry,
            {
                CONF_HOST: satellite.host,
                CONF_PORT: satellite.port,
                CONF_WAKE_WORD: "satellite",
            },
        )
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    assert stored_satellites(entry, SUBENTRY_WYOMING) == [
        {
            CONF_HOST: satellite.host,
            CONF_PORT: satellite.port,
            CONF_NAME: SATELLITE_NAME,
            CONF_WAKE_WORD: "satellite",
        }
    ]
    [subentry] = entry.subentries.values()
    assert (subentry.title, subentry.unique_id) == (
        SATELLITE_NAME,
        f"{satellite.host}:{satellite.port}",
    )
    assert "prompt" in entry.options  # the settings are kept


async def test_add_wyoming_errors(
    hass: HomeAssistant, openai_peer: OpenAIPeer, sat_python: str
) -> None:
    """Nothing listening: cannot_connect; an STT server: not_wyoming_satellite."""
    entry = openai_entry(hass, openai_peer)
    async with satellite_rig(sat_python) as satellite:
        free_port = satellite.port  # the satellite is told its port, not yet bound
    result = await add_wyoming(
        hass, entry, {CONF_HOST: "127.0.0.1", CONF_PORT: free_port}
    )
    assert result["errors"] == {"base": "cannot_connect"}
    async with WyomingSttServer(phrases=PHRASES) as stt_server:
        result = await add_wyoming(
            hass,
            entry,
            {CONF_HOST: stt_server.host, CONF_PORT: stt_server.port},
        )
    assert result["errors"] == {"base": "not_wyoming_satellite"}
    assert entry.subentries == {}


async def test_remove_wyoming_keeps_the_others(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Deleting one satellite's subentry keeps the other."""
    first = {CONF_HOST: "127.0.0.1", CONF_PORT: 10700, CONF_NAME: "one"}
    second = {CONF_HOST: "127.0.0.2", CONF_PORT: 10700, CONF_NAME: "two"}
    entry = openai_entry(hass, openai_peer, wyoming=[first, second])
    [one] = [s for s in entry.subentries.values() if s.unique_id == "127.0.0.1:10700"]
    assert hass.config_entries.async_remove_subentry(entry, one.subentry_id)
    assert stored_satellites(entry, SUBENTRY_WYOMING) == [second]


async def test_settings_keep_the_wyoming_satellites(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Saving the conversation settings does not drop the stored satellites."""
    stored = {CONF_HOST: "127.0.0.1", CONF_PORT: 10700, CONF_NAME: "one"}
    entry = openai_entry(hass, openai_peer, wyoming=[stored])
    form = await hass.config_entries.options.async_init(entry.entry_id)
    result = await hass.config_entries.options.async_configure(
        form["flow_id"],
        {k: v for k, v in DEFAULT_OPTIONS_OPENAI.items() if k != CONF_PROMPT},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert stored_satellites(entry, SUBENTRY_WYOMING) == [stored]


# --- discovery ------------------------------------------------------------------------


async def test_discovered_satellite_is_added_and_the_entry_reloads(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer, sat_python: str
) -> None:
    """Zeroconf finds the satellite; confirming adds it, the entity appears."""
    hass.config.config_dir = str(tmp_path)
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with satellite_rig(sat_python) as satellite:
        info = zeroconf_info(satellite.host, satellite.port, "aabbccddeeff")
        result = await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
        )
        assert result["type"] is FlowResultType.FORM, result
        assert result["step_id"] == "wyoming_confirm"
        assert result["description_placeholders"]["name"] == SATELLITE_NAME
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {CONF_WAKE_WORD: "satellite"}
        )
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "wyoming_added"
        await hass.async_block_till_done()  # the entry reloads with the satellite
        assert entry.state is ConfigEntryState.LOADED
        [stored] = stored_satellites(entry, SUBENTRY_WYOMING)
        assert (stored[CONF_HOST], stored[CONF_PORT]) == (
            satellite.host,
            satellite.port,
        )
        satellite_entity = entity_of(hass, entry, "assist_satellite")
        assert await wait_for_state(hass, satellite_entity, {"idle"}) == "idle"
        # Discovered again (the next announcement): already there.
        again = await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
        )
        assert again["type"] is FlowResultType.ABORT
        assert again["reason"] == "already_configured"
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


async def test_discovery_ignores_servers_and_remembers_ignore(
    hass: HomeAssistant, openai_peer: OpenAIPeer, sat_python: str
) -> None:
    """An STT server is not offered; an ignored satellite is not offered again."""
    await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with WyomingSttServer(phrases=PHRASES) as stt_server:
        result = await hass.config_entries.flow.async_init(
            DOMAIN,
            context={"source": SOURCE_ZEROCONF},
            data=zeroconf_info(stt_server.host, stt_server.port, "stt"),
        )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "not_wyoming_satellite"
    async with satellite_rig(sat_python) as satellite:
        info = zeroconf_info(satellite.host, satellite.port, "aabbccddeeff")
        result = await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
        )
        assert result["type"] is FlowResultType.FORM
        flow = hass.config_entries.flow.async_get(result["flow_id"])
        ignore = await hass.config_entries.flow.async_init(
            DOMAIN,
            context={"source": SOURCE_IGNORE},
            data={"unique_id": flow["context"]["unique_id"], "title": SATELLITE_NAME},
        )
        assert ignore["type"] is FlowResultType.CREATE_ENTRY
        again = await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
        )
    assert again["type"] is FlowResultType.ABORT
    assert again["reason"] == "already_configured"


# --- conversations ----------------------------------------------------------------------


async def test_wake_utterance_answer_through_home_assistant(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """Add the satellite; wake word, request, the answer reaches its speaker.

    The entity sits on its own device, is available while connected and follows
    the session; HA's STT hears the answer in the captured speaker audio.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        result = await add_wyoming(
            hass,
            entry,
            {
                CONF_HOST: satellite.host,
                CONF_PORT: satellite.port,
                CONF_WAKE_WORD: "hey_jarvis",
            },
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        await hass.async_block_till_done()  # the entry reloads with the satellite
        entity_id = entity_of(hass, entry, "assist_satellite")
        assert await wait_for_state(hass, entity_id, {"idle"}) == "idle"
        registry_entry = er.async_get(hass).async_get(entity_id)
        assert registry_entry is not None and registry_entry.device_id is not None
        device = dr.async_get(hass).async_get(registry_entry.device_id)
        assert device is not None and device.name == SATELLITE_NAME

        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(Text("The kitchen lights are on."))
        await say(satellite, WAKE)
        await wait_for_state(hass, entity_id, {"listening"})
        await say(satellite, ASK_LIGHTS)
        await wait_for_state(hass, entity_id, {"responding"})
        playback = await wait(satellite.speaker.wait_for_playback(1), SAFETY)
        assert await link.binding.stt(bytes(playback.pcm)) == LIGHTS_ON
        request = openai_peer.requests[-1]
        assert request.messages[-1]["content"] == ASK_LIGHTS
        assert link.stats.wakes == 1

        runtime = entry.runtime_data
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
        assert runtime.wyoming.links == {}
        assert link.idle
        assert rtvoice_tasks() == []
        assert hass.states.get(entity_id).state == STATE_UNAVAILABLE


async def test_utterance_during_the_answer_is_answered_in_the_same_child(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """VAD barge-in (the satellite's setting): talking over cuts it, then an answer.

    The second request comes from the same kernel child: its history holds the
    first request and the part of the story that was heard.
    """
    hass.config.config_dir = str(tmp_path)
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        entry = openai_entry(
            hass,
            openai_peer,
            wyoming=[stored_satellite(satellite, **{CONF_BARGE_IN: "vad"})],
        )
        await async_load_entry(hass, entry)
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(Text(STORY))
        openai_peer.enqueue(Text("It is noon."))
        await say(satellite, WAKE)
        await say(satellite, ASK_LIGHTS)
        first = await wait(satellite.speaker.wait_for_playback(1, ended=False), SAFETY)
        await say_over(satellite, ASK_TIME)
        await wait(first.ended.wait(), SAFETY)
        second = await wait(satellite.speaker.wait_for_playback(2), SAFETY)
        assert await link.binding.stt(bytes(second.pcm)) == NOON
        assert len(first.pcm) / 32 < len(STORY) * 60 / 2  # cut, not played out
        # Figures for docs/wyoming.md, not pass conditions: how far ahead of real
        # time the answer's audio had been sent when it was cut (what a real-time
        # sink such as aplay still plays after the cut, besides its own buffer),
        # and how long the satellite took to hand the last frame to its speaker.
        assert first.last_at is not None
        first_sent = link.stats.stream_first_frame_at[0]
        last_sent = link.stats.stream_last_frame_at[0]
        assert last_sent is not None
        _LOGGER.warning(
            "Wyoming cut: %.0f ms of answer audio sent ahead of real time;"
            " last frame sent -> last byte at the speaker command: %.0f ms",
            len(first.pcm) / 32 - (last_sent - first_sent) * 1000,
            (first.last_at - last_sent) * 1000,
        )
        session = link.session
        assert session is not None and session.stats.barge_ins == 1
        assert link.stats.conversations == 1
        [first_request, second_request] = openai_peer.requests
        assert second_request.messages[-1]["content"] == ASK_TIME
        contents = [m.get("content") for m in second_request.messages]
        assert ASK_LIGHTS in contents  # the same child's history
        heard = [
            m["content"]
            for m in second_request.messages
            if m["role"] == "assistant" and m.get("content")
        ]
        assert heard and STORY not in heard[0]  # only what was heard
        assert first_request.messages[-1]["content"] == ASK_LIGHTS
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


async def test_wake_word_interrupts_with_barge_in_off(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """Barge-in off: only the wake word cuts the answer; then a new request."""
    hass.config.config_dir = str(tmp_path)
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        entry = openai_entry(
            hass,
            openai_peer,
            wyoming=[
                stored_satellite(
                    satellite, **{CONF_BARGE_IN: "off", CONF_END_SILENCE: 20}
                )
            ],
        )
        await async_load_entry(hass, entry)
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(Text(STORY))
        openai_peer.enqueue(Text("It is noon."))
        await say(satellite, WAKE)
        await say(satellite, ASK_LIGHTS)
        first = await wait(satellite.speaker.wait_for_playback(1, ended=False), SAFETY)
        await say(satellite, WAKE)
        await wait(first.ended.wait(), SAFETY)
        assert link.stats.wake_interrupts == 1
        await say(satellite, ASK_TIME)
        second = await wait(satellite.speaker.wait_for_playback(2), SAFETY)
        assert await link.binding.stt(bytes(second.pcm)) == NOON
        assert len(first.pcm) / 32 < len(STORY) * 60 / 2
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


async def test_unload_mid_answer_leaves_no_task(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """Unloading while an answer plays and the model still streams: all stops."""
    hass.config.config_dir = str(tmp_path)
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        entry = openai_entry(
            hass,
            openai_peer,
            wyoming=[stored_satellite(satellite)],
        )
        await async_load_entry(hass, entry)
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        hold = asyncio.Event()
        openai_peer.enqueue(Text(STORY[:100]), WaitFor(hold))
        await say(satellite, WAKE)
        await say(satellite, ASK_LIGHTS)
        first = await wait(satellite.speaker.wait_for_playback(1, ended=False), SAFETY)
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
        await wait(request.disconnected.wait(), SAFETY)  # the round was cut
        hold.set()
        await wait(first.ended.wait(), SAFETY)  # audio-stop closed the stream
        assert link.idle
        assert rtvoice_tasks() == []


# --- the repair ---------------------------------------------------------------------------


async def test_repair_while_the_wyoming_integration_holds_it(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A ``wyoming`` entry on the same host and port: a repair, gone with the entry."""
    stored = {CONF_HOST: "127.0.0.1", CONF_PORT: 10799, CONF_NAME: "kitchen"}
    other = MockConfigEntry(
        domain="wyoming",
        title="kitchen satellite",
        data={CONF_HOST: "127.0.0.1", CONF_PORT: 10799},
    )
    other.add_to_hass(hass)  # not set up: it would connect to the satellite
    unrelated = MockConfigEntry(
        domain="wyoming", data={CONF_HOST: "127.0.0.1", CONF_PORT: 10300}
    )
    unrelated.add_to_hass(hass)
    entry = openai_entry(hass, openai_peer, wyoming=[stored])
    await async_load_entry(hass, entry)
    issues = ir.async_get(hass)
    issue_id = f"wyoming_conflict_{entry.entry_id}_127.0.0.1:10799"
    issue = issues.async_get_issue(DOMAIN, issue_id)
    assert issue is not None
    assert issue.translation_placeholders == {
        "name": "kitchen",
        "address": "127.0.0.1:10799",
        "other": "kitchen satellite",
    }
    assert [i for i in issues.issues if i[0] == DOMAIN] == [(DOMAIN, issue_id)]
    await hass.config_entries.async_remove(other.entry_id)
    await hass.async_block_till_done()
    assert issues.async_get_issue(DOMAIN, issue_id) is None
    await hass.config_entries.async_remove(unrelated.entry_id)
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()


# --- settings, wake word, pipeline ---------------------------------------------------


async def test_wyoming_settings_are_stored(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Reconfigure: the settings form (shared with ESPHome) with address and wake word.

    The address is unchanged, so nothing is probed.
    """
    first = {CONF_HOST: "127.0.0.1", CONF_PORT: 10700, CONF_NAME: "one"}
    second = {CONF_HOST: "127.0.0.2", CONF_PORT: 10700, CONF_NAME: "two"}
    entry = openai_entry(hass, openai_peer, wyoming=[first, second])
    form = await reconfigure_satellite(hass, entry, SUBENTRY_WYOMING, 1)
    assert form["type"] is FlowResultType.FORM
    assert form["step_id"] == "reconfigure"
    assert form["description_placeholders"]["name"] == "two"
    fields = {str(key): key for key in form["data_schema"].schema}
    assert set(fields) == {
        CONF_HOST,
        CONF_PORT,
        CONF_BARGE_IN,
        CONF_ECHO_CANCELLATION,
        CONF_END_SILENCE,
        CONF_TURN_EAGERNESS,
        CONF_WAKE_WORD,
    }
    result = await hass.config_entries.subentries.async_configure(
        form["flow_id"],
        {
            CONF_HOST: "127.0.0.2",
            CONF_PORT: 10700,
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: False,
            CONF_END_SILENCE: 12,
            CONF_WAKE_WORD: "alexa",
        },
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert stored_satellites(entry, SUBENTRY_WYOMING) == [
        first,
        {
            **second,
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: False,
            CONF_END_SILENCE: 12,
            CONF_WAKE_WORD: "alexa",
            CONF_TURN_EAGERNESS: "auto",  # the default
        },
    ]


async def test_wake_word_configuration_of_the_entity(
    hass: HomeAssistant,
    hass_ws_client: WebSocketGenerator,
    openai_peer: OpenAIPeer,
) -> None:
    """The bundled models and "on the satellite"; choosing one stores it, reloads."""
    with socket.socket() as sock:  # nothing listens there: the link keeps trying
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stored = {
        CONF_HOST: "127.0.0.1",
        CONF_PORT: port,
        CONF_NAME: "hall",
        CONF_WAKE_WORD: "hey_jarvis",
    }
    entry = openai_entry(hass, openai_peer, wyoming=[stored])
    await async_load_entry(hass, entry)
    entity_id = entity_of(hass, entry, "assist_satellite")
    select = entity_of(hass, entry, "select")
    client = await hass_ws_client(hass)
    await client.send_json_auto_id(
        {"type": "assist_satellite/get_configuration", "entity_id": entity_id}
    )
    config = (await client.receive_json())["result"]
    ids = [w["id"] for w in config["available_wake_words"]]
    assert ids == [*(m.id for m in MODELS), "satellite"]
    assert config["active_wake_words"] == ["hey_jarvis"]
    assert config["max_active_wake_words"] == 1
    assert config["pipeline_entity_id"] == select
    registry = er.async_get(hass)
    assert (
        registry.async_get(select).device_id  # type: ignore[union-attr]
        == registry.async_get(entity_id).device_id  # type: ignore[union-attr]
    )

    await client.send_json_auto_id(
        {
            "type": "assist_satellite/set_wake_words",
            "entity_id": entity_id,
            "wake_word_ids": ["satellite"],
        }
    )
    assert (await client.receive_json())["success"]
    await hass.async_block_till_done()  # the entry reloads with it
    assert stored_satellites(entry, SUBENTRY_WYOMING) == [
        {**stored, CONF_WAKE_WORD: "satellite"}
    ]
    assert entry.state is ConfigEntryState.LOADED
    link = the_link(entry)
    assert link._wake is None  # noqa: SLF001 - only the satellite's detection wakes it
    await client.send_json_auto_id(
        {"type": "assist_satellite/get_configuration", "entity_id": entity_id}
    )
    config = (await client.receive_json())["result"]
    assert config["active_wake_words"] == ["satellite"]
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()


async def test_pipeline_select_chooses_the_speech_engines(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """The satellite's pipeline select: its STT and TTS serve the conversations."""
    hass.config.config_dir = str(tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stored = {CONF_HOST: "127.0.0.1", CONF_PORT: port, CONF_NAME: "hall"}
    async with (
        speech_pipeline(hass) as (first_stt, first_tts),
        WyomingSttServer(phrases=PHRASES) as second_stt,
        WyomingTtsServer() as second_tts,
    ):
        stt_entry = await add_wyoming_service(hass, second_stt.port)
        tts_entry = await add_wyoming_service(hass, second_tts.port)
        second = await async_create_default_pipeline(
            hass,
            entity_of(hass, stt_entry, "stt"),
            entity_of(hass, tts_entry, "tts"),
            "Second",
        )
        assert second is not None
        entry = openai_entry(hass, openai_peer, wyoming=[stored])
        await async_load_entry(hass, entry)
        select = entity_of(hass, entry, "select")
        assert hass.states.get(select).state == "preferred"  # type: ignore[union-attr]
        binding = the_link(entry).binding
        clip = await spoken(ASK_TIME)
        assert await binding.stt(clip) == ASK_TIME
        assert len(first_stt.requests) == 1
        await hass.services.async_call(
            "select",
            "select_option",
            {"entity_id": select, "option": "Second"},
            blocking=True,
        )
        assert await binding.stt(clip) == ASK_TIME
        assert len(second_stt.requests) == 1
        assert len(first_stt.requests) == 1
        audio = b"".join([chunk async for chunk in binding.tts("It is noon.")])
        assert audio
        assert [r.text for r in second_tts.requests] == ["It is noon."]
        assert first_tts.requests == []
        assert await hass.config_entries.async_unload(entry.entry_id)
        for unload in (stt_entry, tts_entry):
            await hass.config_entries.async_unload(unload.entry_id)
        await hass.async_block_till_done()


# --- the conversation outlives barge-in, device actions and the satellite ------------


async def test_device_action_during_barge_in_completes(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """The user talks while a device action runs: it completes, then the answer.

    The action is a real intent (a real Assist API tool) held inside HA by a gate.
    """
    hass.config.config_dir = str(tmp_path)
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    demo_entry = await async_setup_demo_entry(hass)
    async with (
        speech_pipeline(hass) as (stt_server, _tts),
        satellite_rig(sat_python) as satellite,
    ):
        entry = openai_entry(
            hass,
            openai_peer,
            wyoming=[
                stored_satellite(
                    satellite, **{CONF_BARGE_IN: "vad", CONF_END_SILENCE: 20}
                )
            ],
        )
        await async_load_entry(hass, entry)
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(
            Text("One moment! "), ToolCall("call_slow", slow.intent_type, "{}")
        )
        openai_peer.enqueue(Text("It is noon."))
        await say(satellite, WAKE)
        await say(satellite, ASK_LIGHTS)
        await wait(slow.started.wait(), SAFETY)  # the tool runs inside HA now
        first = await wait(satellite.speaker.wait_for_playback(1, ended=False), SAFETY)
        await say_over(satellite, ASK_TIME)  # over "One moment!" or after it
        await wait(stt_server.wait_for_transcript(ASK_TIME), SAFETY)
        await wait(first.ended.wait(), SAFETY)  # its stream was cut (audio-stop)
        assert hass.states.get(BED).state != STATE_ON  # still held
        assert len(openai_peer.requests) == 1
        slow.gate.set()
        await wait(openai_peer.wait_for_request(2), SAFETY)
        assert hass.states.get(BED).state == STATE_ON  # the action completed
        messages = openai_peer.requests[1].messages
        assert [m["role"] for m in messages if m["role"] == "tool"] == ["tool"]
        assert messages[-1]["content"] == ASK_TIME
        second = await wait(satellite.speaker.wait_for_playback(2), SAFETY)
        assert await link.binding.stt(bytes(second.pcm)) == NOON
        session = link.session
        assert session is not None and session.stats.barge_ins == 1
        assert link.stats.conversations == 1
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
    await async_unload_demo_entry(hass, demo_entry)


async def test_satellite_restarted_mid_conversation_continues_it(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,
    wake_available: None,
) -> None:
    """Killed while answering: unavailable, then back; the next wake word continues.

    The second request comes from the same kernel child (its history holds the
    first request); the entity went unavailable and came back by itself.
    """
    hass.config.config_dir = str(tmp_path)
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        entry = openai_entry(
            hass,
            openai_peer,
            wyoming=[stored_satellite(satellite, **{CONF_END_SILENCE: 20})],
        )
        await async_load_entry(hass, entry)
        entity_id = entity_of(hass, entry, "assist_satellite")
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        hold = asyncio.Event()
        openai_peer.enqueue(Text(STORY[:100]), WaitFor(hold))
        openai_peer.enqueue(Text("It is noon."))
        await say(satellite, WAKE)
        await say(satellite, ASK_LIGHTS)
        first = await wait(satellite.speaker.wait_for_playback(1, ended=False), SAFETY)
        assert await wait_for_state(hass, entity_id, {"responding"}) == "responding"
        conversation = link.conversation
        assert conversation is not None
        await satellite.kill()
        assert await wait_for_state(hass, entity_id, {STATE_UNAVAILABLE})
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        await wait(request.disconnected.wait(), SAFETY)  # the round was cut
        hold.set()
        await wait(first.ended.wait(), SAFETY)
        count = len(satellite.speaker.playbacks)
        await satellite.start()
        await wait(link.wait_connected(), SAFETY)
        assert await wait_for_state(hass, entity_id, {"idle"}) == "idle"
        await say(satellite, WAKE)
        await wait_for_state(hass, entity_id, {"listening"})
        await say(satellite, ASK_TIME)
        playback = await wait(satellite.speaker.wait_for_playback(count + 1), SAFETY)
        assert await link.binding.stt(bytes(playback.pcm)) == NOON
        assert link.conversation is conversation  # the same child
        assert link.stats.conversations == 1
        second = openai_peer.requests[-1]
        contents = [m.get("content") for m in second.messages]
        assert contents[-1] == ASK_TIME
        assert ASK_LIGHTS in contents
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
        assert rtvoice_tasks() == []
