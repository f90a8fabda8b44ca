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
from dataclasses import dataclass
import logging
from pathlib import Path
from typing import Any

from aioesphomeapi import InvalidEncryptionKeyAPIError
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    EVENT_CONVERSATION_CLOSED,
    SUBENTRY_ESPHOME,
)
from custom_components.rtvoice.duplex import BargeIn
from custom_components.rtvoice.kernel import Message
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_PORT, STATE_ON, STATE_UNAVAILABLE
from homeassistant.core import Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr, entity_registry as er, intent
from homeassistant.helpers.event import async_track_state_change_event
from tests.accounts import accounted, duplex_account
from tests.components.common import (
    BED,
    add_esphome_satellite,
    async_load_entry,
    async_setup_demo_entry,
    async_unload_demo_entry,
    openai_entry,
    stored_satellites,
)
from tests.components.esphome_rig import add_wyoming_service, entity_of, spoken, wait
from tests.components.pipeline.helpers import GatedBedLightOn
from tests.duplex.conftest import noise
from tests.peers.esphome import (
    ATOM_ECHO_FEATURES,
    EmulatedDevice,
    EventType,
    Interrupt,
    Kind,
)
from tests.peers.esphome.config import Feature
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall
from tests.peers.speech import after_a_moment
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
    """Press "Add ESPHome satellite" on the entry and connect; the last result."""
    return await add_esphome_satellite(hass, entry, user_input)


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
    """An encrypted voice satellite passes the test and is stored with its identity.

    It is a subentry of the entry, titled with the device's name, its MAC the
    unique id; the entry's own options are untouched.
    """
    entry = openai_entry(hass, openai_peer)
    options = dict(entry.options)
    async with duplex_device(encrypted=True) as device:
        result = await add_duplex(hass, entry, device_input(device))
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    [subentry] = entry.subentries.values()
    assert subentry.subentry_type == SUBENTRY_ESPHOME
    assert (subentry.title, subentry.unique_id) == (
        "Kitchen duplex",
        "aa:bb:cc:dd:ee:42",
    )
    [stored] = stored_satellites(entry, SUBENTRY_ESPHOME)
    assert stored == {
        CONF_HOST: device.host,
        CONF_PORT: device.port,
        CONF_NOISE_PSK: device.noise_psk,
        CONF_NAME: "Kitchen duplex",
        CONF_MAC: "AA:BB:CC:DD:EE:42",
        CONF_ESPHOME_VERSION: FIRMWARE,
    }
    assert dict(entry.options) == options


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
    assert entry.subentries == {}


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
    """Each satellite is its own subentry: deleting one keeps the other."""
    entry = openai_entry(hass, openai_peer)
    async with (
        duplex_device(encrypted=True) as first,
        duplex_device(name="hall", mac_address="AA:BB:CC:DD:EE:43") as second,
    ):
        for device in (first, second):
            result = await add_duplex(hass, entry, device_input(device))
            assert result["type"] is FlowResultType.CREATE_ENTRY, result
    assert len(stored_satellites(entry, SUBENTRY_ESPHOME)) == 2
    [kitchen] = [
        s for s in entry.subentries.values() if s.unique_id == "aa:bb:cc:dd:ee:42"
    ]
    assert hass.config_entries.async_remove_subentry(entry, kitchen.subentry_id)
    [kept] = stored_satellites(entry, SUBENTRY_ESPHOME)
    assert kept[CONF_MAC] == "AA:BB:CC:DD:EE:43"
    assert "prompt" in entry.options


# --------------------------------------------------------------------------- sessions
# A satellite added through the options flow, the preferred pipeline's STT/TTS on
# the Wyoming servers, the model on the OpenAI peer: talking over answers through
# Home Assistant (issue 10 §3).

STOP = "stop"
ALL_RIGHT = "all right"
TIME = "what time is it"
NOON = "it is noon"
BED_ASK = "turn on the bed light"
LONG = (
    "The kitchen lights are on now. I also looked at the living room, and every"
    " light there is off, just as you asked me to leave it earlier today."
)
PHRASES = [ASK, ANSWER, STOP, ALL_RIGHT, TIME, NOON, BED_ASK]
LEAD_BYTES = 3200  # 100 ms: the most the player keeps queued on the device


class StateLog:
    """Every state an entity takes from now on, awaitable (state change events)."""

    def __init__(self, hass: HomeAssistant, entity_id: str) -> None:
        """Start recording ``entity_id``'s states."""
        self.seen: list[str] = []
        self._changed = asyncio.Event()

        @callback
        def changed(event: Event[EventStateChangedData]) -> None:
            if (state := event.data["new_state"]) is not None:
                self.seen.append(state.state)
                self._changed.set()

        self.close = async_track_state_change_event(hass, entity_id, changed)

    async def wait_for(self, state: str, since: int = 0) -> int:
        """Return the index of the first ``state`` at ``since`` or later."""
        while True:
            for index in range(since, len(self.seen)):
                if self.seen[index] == state:
                    return index
            self._changed.clear()
            await wait(self._changed.wait(), SAFETY)


@dataclass
class DuplexRig:
    """One duplex satellite in HA, with its peers."""

    hass: HomeAssistant
    entry: MockConfigEntry
    device: EmulatedDevice
    stt: WyomingSttServer
    tts: WyomingTtsServer
    satellite: str
    states: StateLog

    @property
    def link(self) -> Any:
        """The satellite's link (``EsphomeLink``)."""
        return next(iter(self.entry.runtime_data.duplex.links.values()))

    def child_id(self) -> str:
        """Return the kernel child of the live conversation."""
        conversation = self.link.conversation
        assert conversation is not None
        return str(conversation.child_id)

    def history(self, child_id: str) -> list[Message]:
        """Return a conversation's transcript (live or handed off)."""
        transcript = self.entry.runtime_data.kernel.transcript(child_id)
        assert transcript is not None
        return list(transcript)

    async def wake_and_say(self, text: str) -> None:
        """Say the wake word and ``text`` (a new request even while busy)."""
        run = self.device.say(await spoken(text), interrupt=Interrupt.RESTART)
        assert run is not None
        await wait(run.streaming.wait(), SAFETY)

    async def answer_playing(self, since: int = 0) -> int:
        """Wait until answer audio (not silence) reaches the device; the mark after it."""
        entry = await wait(
            self.device.wait_for(
                lambda e: (
                    e.kind is Kind.RECEIVED
                    and e.name == "VoiceAssistantAudio"
                    and any(e.message.data)
                ),  # type: ignore[union-attr]
                since,
            ),
            SAFETY,
        )
        return entry.index + 1

    def audio_bytes(self, since: int, until: int | None = None) -> int:
        """Answer audio bytes the device received between two record marks.

        Silence is not answer audio: the link sends some to keep the speaker
        running and to push out what waits in the firmware's buffer.
        """
        return sum(
            len(e.message.data)  # type: ignore[union-attr]
            for e in list(self.device.events)[since:until]
            if e.kind is Kind.RECEIVED
            and e.name == "VoiceAssistantAudio"
            and any(e.message.data)  # type: ignore[union-attr]
        )


@asynccontextmanager
async def duplex_rig(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    satellite_options: dict[str, Any] | None = None,
    *,
    ready: bool = True,
    **device_config: Any,
) -> AsyncIterator[DuplexRig]:
    """Add a duplex satellite through its subentry flow; wait until it is idle.

    ``satellite_options`` are stored in the satellite's subentry (per-satellite
    settings, e.g. ``CONF_BARGE_IN``), as its reconfigure form stores them.
    ``ready=False``: do not wait for the satellite to connect.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    entry = openai_entry(hass, openai_peer)
    await async_load_entry(hass, entry)
    async with (
        WyomingSttServer(phrases=PHRASES) as stt_server,
        WyomingTtsServer() as tts_server,
        duplex_device(encrypted=True, **device_config) as device,
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
        await hass.async_block_till_done()
        if satellite_options:
            [subentry] = entry.subentries.values()
            hass.config_entries.async_update_subentry(
                entry, subentry, data={**subentry.data, **satellite_options}
            )
            await hass.async_block_till_done()  # the entry reloads
        satellite = entity_of(hass, entry, "assist_satellite")
        if ready:
            await wait_for_state(hass, satellite, {"idle"})
            await wait(device.wait_for_voice_client(), SAFETY)
        states = StateLog(hass, satellite)
        rig = DuplexRig(hass, entry, device, stt_server, tts_server, satellite, states)
        try:
            with accounted(
                lambda: duplex_account(
                    rig.link, stt_server, len(openai_peer.requests), states.seen
                )
            ):
                yield rig
        finally:
            states.close()
            for unload in (entry, stt_entry, tts_entry):
                if unload.state is ConfigEntryState.LOADED:
                    await wait(
                        hass.config_entries.async_unload(unload.entry_id), SAFETY
                    )
            await wait(hass.async_block_till_done(), SAFETY)
    assert device.voice.errors == []


class Warnings(logging.Handler):
    """Warnings of one logger, awaitable (emitted on the loop's thread)."""

    def __init__(self, name: str) -> None:
        """Attach to logger ``name``; ``close`` detaches."""
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.emitted = asyncio.Event()
        self._logger = logging.getLogger(name)
        self._logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the message."""
        self.messages.append(record.getMessage())
        self.emitted.set()

    def close(self) -> None:
        """Detach."""
        self._logger.removeHandler(self)
        super().close()


def rtvoice_tasks() -> list[asyncio.Task[Any]]:
    """Return the running tasks of the integration (named ``rtvoice ...``)."""
    return [
        t
        for t in asyncio.all_tasks()
        if (t.get_name() or "").startswith("rtvoice") and not t.done()
    ]


def roles(history: list[Message]) -> list[tuple[str, str, bool]]:
    """(role, content, interrupted) of each message."""
    return [(m.role, m.content, m.interrupted) for m in history]


async def test_wake_word_barge_in_cuts_the_answer_and_answers_the_words(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Wake word + words while the answer plays: the audio stops, the words are answered.

    ``wake_word`` mode (the default): no frame of the first answer is sent after
    the device's new request beyond what was already in flight (the lead); the
    model remembers the part that was heard, marked interrupted, and answers
    "stop"; the second answer is heard.
    """
    openai_peer.enqueue(Text(LONG))
    openai_peer.enqueue(Text("All right."))
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(ASK)
        playing = await rig.answer_playing()
        await rig.answer_playing(playing)  # a second frame: the answer is under way
        await rig.states.wait_for("responding")

        since = rig.device.mark()
        await rig.wake_and_say(STOP)
        await wait(rig.stt.wait_for_transcript(STOP), SAFETY)
        assert rig.audio_bytes(since) <= LEAD_BYTES  # nothing after the cut
        assert rig.audio_bytes(playing - 1, since) > 0  # the first frame on

        await wait(openai_peer.wait_for_request(2), SAFETY)
        child = rig.child_id()
        await rig.answer_playing(rig.device.mark())
        cut = rig.states.seen.index("responding")
        again = await rig.states.wait_for("responding", cut + 1)
        await rig.states.wait_for("listening", again + 1)  # the answer played out
        history = rig.history(child)
        assert roles(history)[0] == ("user", ASK, False)
        heard = history[1]
        assert heard.role == "assistant" and heard.interrupted
        assert LONG.startswith(heard.content) and len(heard.content) < len(LONG)
        assert roles(history)[2:] == [
            ("user", STOP, False),
            ("assistant", "All right.", False),
        ]
        answer = rig.device.playbacks[-1].pcm
        assert await wait(rig.link.binding.stt(answer), SAFETY) == ALL_RIGHT


async def test_barge_in_during_a_device_action_lets_it_complete(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Wake word + words while a device action runs: it completes, then the words run.

    The action is a real intent (an Assist API tool) held inside HA by a gate. The
    wake word's interrupt and the new words both arrive while it runs: the round is
    not cut; once the gate opens the light turns on, the result is recorded and the
    newest words are answered.
    """
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    demo_entry = await async_setup_demo_entry(hass)
    async_expose_entity(hass, "conversation", BED, True)
    openai_peer.enqueue(ToolCall("call_slow", slow.intent_type, "{}"))
    openai_peer.enqueue(Text("It is noon."))
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(BED_ASK)
        # The tool runs inside HA now (or its error went back to the model).
        started = asyncio.ensure_future(slow.started.wait())
        answered = asyncio.ensure_future(openai_peer.wait_for_request(2))
        done, pending = await asyncio.wait(
            {started, answered}, timeout=SAFETY, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        assert started in done, openai_peer.requests[-1].messages[-1]["content"]
        child = rig.child_id()
        await rig.wake_and_say(TIME)
        await wait(rig.stt.wait_for_transcript(TIME), SAFETY)
        stats = rig.entry.runtime_data.kernel.stats(child)
        assert stats is not None and stats.suppressed_cancels >= 1
        assert hass.states.get(BED).state != STATE_ON
        assert len(openai_peer.requests) == 1

        slow.gate.set()
        await wait(openai_peer.wait_for_request(2), SAFETY)
        await rig.answer_playing()
        responding = await rig.states.wait_for("responding")
        await rig.states.wait_for("listening", responding + 1)
        assert hass.states.get(BED).state == STATE_ON
        history = rig.history(child)
        assert [m.role for m in history] == [
            "user",
            "assistant",
            "tool",
            "user",
            "assistant",
        ]
        assert history[0].content == BED_ASK
        assert history[1].tool_calls and history[1].tool_calls[0].name == (
            slow.intent_type
        )
        assert "action_done" in history[2].content
        assert roles(history)[3:] == [
            ("user", TIME, False),
            ("assistant", "It is noon.", False),
        ]
    await async_unload_demo_entry(hass, demo_entry)


async def test_device_drops_mid_answer_and_comes_back(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """The connection drops while the answer plays, then the device is back.

    The entity becomes unavailable; the session ends but the conversation stays
    (idle, nothing handed off); after the reconnect the entity is idle again and
    the next wake word continues the same conversation: the model sees the cut
    answer and the new words.
    """
    closed: list[Event] = []
    closed_event = asyncio.Event()

    @callback
    def on_closed(event: Event) -> None:
        closed.append(event)
        closed_event.set()

    hass.bus.async_listen(EVENT_CONVERSATION_CLOSED, on_closed)
    openai_peer.enqueue(Text(LONG))
    openai_peer.enqueue(Text("The kitchen lights are on."))
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(ASK)
        await rig.answer_playing()
        first = await rig.states.wait_for("responding")
        child = rig.child_id()

        since = rig.device.mark()
        assert rig.device.drop_connection() == 1
        gone = await rig.states.wait_for(STATE_UNAVAILABLE, first + 1)
        back = await rig.states.wait_for("idle", gone + 1)
        await wait(rig.device.wait_for_voice_client(since), SAFETY)
        assert child in rig.entry.runtime_data.kernel.children()
        assert closed == []
        assert roles(rig.history(child))[0] == ("user", ASK, False)

        await rig.wake_and_say(ASK)
        await wait(openai_peer.wait_for_request(2), SAFETY)
        assert rig.child_id() == child  # the same conversation continues
        contents = [m["content"] for m in openai_peer.requests[1].messages]
        assert contents.count(ASK) == 2  # the first words, then the new ones
        await rig.answer_playing(rig.device.mark())
        again = await rig.states.wait_for("responding", back + 1)
        await rig.states.wait_for("listening", again + 1)
        heard = await wait(rig.link.binding.stt(rig.device.playbacks[-1].pcm), SAFETY)
        assert heard == ANSWER


async def test_unload_mid_answer_leaves_no_task(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Unloading the entry while an answer plays: no task left, the device released.

    The conversation is handed off once (closed event, no error about closing it
    twice), the device gets RUN_END (back to its wake word) and its voice
    assistant is free again; the entity is unavailable.
    """
    closed: list[Event] = []
    hass.bus.async_listen(EVENT_CONVERSATION_CLOSED, closed.append)
    problems = Warnings("custom_components.rtvoice.duplex_link")
    openai_peer.enqueue(Text(LONG))
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(ASK)
        await rig.answer_playing()
        await rig.states.wait_for("responding")
        child = rig.child_id()
        runtime = rig.entry.runtime_data

        since = rig.device.mark()
        assert await hass.config_entries.async_unload(rig.entry.entry_id)
        await hass.async_block_till_done()
        assert rtvoice_tasks() == []
        assert runtime.duplex.links == {}
        assert hass.states.get(rig.satellite).state == STATE_UNAVAILABLE
        await wait(rig.device.wait_for_event(EventType.RUN_END, since), SAFETY)
        await wait(
            rig.device.wait_for(
                lambda e: e.kind is Kind.VOICE_OWNER and not e.detail["owner"], since
            ),
            SAFETY,
        )
        assert [e.data["id"] for e in closed] == [child]
        assert problems.messages == []  # closed once, by its own conversation
    problems.close()


@asynccontextmanager
async def vad_rig(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> AsyncIterator[DuplexRig]:
    """Yield a duplex satellite whose stored barge-in mode is ``vad``.

    Skipped where the stored per-satellite setting is not applied yet (the
    satellite then runs the default, ``wake_word``).
    """
    async with duplex_rig(
        hass, tmp_path, openai_peer, satellite_options={CONF_BARGE_IN: "vad"}
    ) as rig:
        if rig.link.binding.options.barge_in is not BargeIn.VAD:
            pytest.skip("the stored barge_in setting is not applied on this tree")
        yield rig


async def test_vad_cough_pauses_and_the_answer_resumes(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """``vad`` mode: a noise burst over the answer pauses it; no words: it resumes.

    The answer plays to its end and is remembered whole (not interrupted).
    """
    openai_peer.enqueue(Text(LONG))
    async with vad_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(ASK)
        await rig.answer_playing()
        responding = await rig.states.wait_for("responding")
        child = rig.child_id()
        session = rig.link.conversation.session
        rig.device.say(after_a_moment(noise(250, -12.0)), wake_word=None)
        paused = await rig.states.wait_for("listening", responding + 1)
        resumed = await rig.states.wait_for("responding", paused + 1)
        await rig.states.wait_for("listening", resumed + 1)  # played out
        assert session.stats.false_barge_ins >= 1
        assert session.stats.pushes == 1
        assert roles(rig.history(child)) == [
            ("user", ASK, False),
            ("assistant", LONG, False),
        ]
        assert len(openai_peer.requests) == 1


async def test_vad_words_over_the_answer_cut_it_without_a_wake_word(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """``vad`` mode: words spoken over the answer (no wake word) stop it; answered."""
    openai_peer.enqueue(Text(LONG))
    openai_peer.enqueue(Text("All right."))
    async with vad_rig(hass, tmp_path, openai_peer) as rig:
        await rig.wake_and_say(ASK)
        await rig.answer_playing()
        await rig.states.wait_for("responding")
        child = rig.child_id()
        rig.device.say(after_a_moment(await spoken(STOP)), wake_word=None)
        await wait(openai_peer.wait_for_request(2), SAFETY)
        await rig.answer_playing(rig.device.mark())
        history = rig.history(child)
        assert history[1].interrupted and LONG.startswith(history[1].content)
        assert roles(history)[2] == ("user", STOP, False)


async def test_stored_key_no_longer_matches(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The satellite got a new key after it was added: unavailable, one warning.

    (A wrong key in the add form is ``test_add_duplex_key_errors``.) The link
    keeps trying rarely; no key reaches the log; unloading leaves no task.
    """
    warnings = Warnings("custom_components.rtvoice.esphome_link")
    async with duplex_rig(
        hass,
        tmp_path,
        openai_peer,
        satellite_options={CONF_NOISE_PSK: WRONG_KEY},
        ready=False,
    ) as rig:
        await wait(
            rig.device.wait_for(lambda e: e.kind is Kind.HANDSHAKE_FAILED), SAFETY
        )
        await wait(warnings.emitted.wait(), SAFETY)
        assert isinstance(rig.link.last_error, InvalidEncryptionKeyAPIError)
        assert hass.states.get(rig.satellite).state == STATE_UNAVAILABLE
        [warning] = warnings.messages
        assert warning.endswith("is unavailable (InvalidEncryptionKeyAPIError)")
        assert WRONG_KEY not in caplog.text
        assert rig.device.noise_psk not in caplog.text
        assert await hass.config_entries.async_unload(rig.entry.entry_id)
        await hass.async_block_till_done()
        assert rtvoice_tasks() == []
    warnings.close()
