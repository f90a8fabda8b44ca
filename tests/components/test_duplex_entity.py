"""The duplex satellite's own entity: pipeline select, settings, announce, wake words.

Real peers on 127.0.0.1: the emulated Voice PE-like satellite on firmware 2026.9
(real aioesphomeapi client; a media player, no SPEAKER flag: answers and
announcements are fetched over HTTP from HA's server), the offline Wyoming speech servers through HA's
``wyoming`` integration as the pipelines' STT and TTS, and the OpenAI-compatible
peer. Waits are on events; timeouts are safety nets. The one stand-in: echo
cancellation "unavailable" is patched (``livekit`` is installed here).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
import logging
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import (
    ClientSessionGenerator,
    WebSocketGenerator,
)

from custom_components.rtvoice import duplex_ha
from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    DOMAIN,
)
from custom_components.rtvoice.duplex import BargeIn, EchoCanceller
from custom_components.rtvoice.esphome_link import EsphomeLink
from homeassistant.components.assist_pipeline.pipeline import (
    async_create_default_pipeline,
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.assist_satellite import AssistSatelliteEntityFeature
from homeassistant.config_entries import ConfigEntry, ConfigEntryState
from homeassistant.const import (
    ATTR_SUPPORTED_FEATURES,
    CONF_HOST,
    CONF_PORT,
    STATE_UNAVAILABLE,
)
from homeassistant.core import Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.event import async_track_state_change_event
from tests.accounts import accounted, duplex_account
from tests.components.common import async_load_entry, openai_entry
from tests.components.esphome_rig import add_wyoming_service, entity_of, spoken, wait
from tests.peers.esphome import (
    ATOM_ECHO_FEATURES,
    VOICE_PE_FEATURES,
    EmulatedDevice,
    EventType,
)
from tests.peers.openai_server import OpenAIPeer, Text, WaitFor
from tests.peers.speech import after_a_moment
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

pytestmark = pytest.mark.usefixtures("socket_enabled")

FIRMWARE = "2026.9.0"  # plays raw API audio; never answers login
AGENT = "conversation.realtime_voice"
ASK = "turn on the kitchen lights"
ANSWER = "the kitchen lights are on"
OPENING = "shall i turn on the kitchen lights"
REPLY = "yes please"
NEWS = "dinner is ready"
STORY = (
    "Once upon a time there was a little robot who lived in a kitchen. "
    "Every morning it switched the lights on, and every evening it switched "
    "them off again, and it sang a quiet song while it worked."
)
PHRASES = [ASK, ANSWER, OPENING, REPLY, NEWS]
SAFETY = 45.0


@dataclass
class Rig:
    """HA with one duplex satellite, speech servers and Realtime Voice."""

    hass: HomeAssistant
    device: EmulatedDevice
    entry: MockConfigEntry
    stt: list[WyomingSttServer]
    tts: list[WyomingTtsServer]
    satellite: str
    states: StateLog
    http_base: str | None

    @property
    def link(self) -> EsphomeLink:
        """The satellite's link."""
        [link] = self.entry.runtime_data.duplex.links.values()
        return link


@dataclass
class StateLog:
    """Every state an entity took since the rig started, awaitable by occurrence."""

    hass: HomeAssistant
    entity_id: str
    seen: list[str] = field(default_factory=list)
    _waiters: list[tuple[tuple[str, ...], asyncio.Future[None]]] = field(
        default_factory=list
    )

    def _has(self, states: tuple[str, ...]) -> bool:
        """Whether ``states`` were taken in this order (others in between)."""
        remaining = iter(self.seen)
        return all(state in remaining for state in states)

    @callback
    def changed(self, event: Event[EventStateChangedData]) -> None:
        """Record a state change and wake whoever waits for it."""
        state = event.data["new_state"]
        if state is None:
            return
        self.seen.append(state.state)
        for states, future in self._waiters:
            if self._has(states) and not future.done():
                future.set_result(None)

    async def reached(self, *states: str) -> None:
        """Return once the entity has taken ``states`` in this order."""
        if self._has(states):
            return
        future: asyncio.Future[None] = self.hass.loop.create_future()
        self._waiters.append((states, future))
        await wait(future, SAFETY)


def satellite_device(**config: Any) -> EmulatedDevice:
    """Return a Voice PE-like satellite (announce, start_conversation) on 2026.9."""
    config.setdefault("name", "kitchen-duplex")
    config.setdefault("friendly_name", "Kitchen duplex")
    config.setdefault("mac_address", "AA:BB:CC:DD:EE:42")
    config.setdefault("esphome_version", FIRMWARE)
    config.setdefault("features", VOICE_PE_FEATURES)
    return EmulatedDevice(**config)


def stored(device: EmulatedDevice, **settings: Any) -> dict[str, Any]:
    """Return the satellite's dict in the entry options, as the flow stores it."""
    return {
        CONF_HOST: device.host,
        CONF_PORT: device.port,
        CONF_NOISE_PSK: None,
        CONF_NAME: "Kitchen duplex",
        CONF_MAC: "AA:BB:CC:DD:EE:42",
        CONF_ESPHOME_VERSION: FIRMWARE,
        **settings,
    }


async def add_speech(
    hass: HomeAssistant, stt: WyomingSttServer, tts: WyomingTtsServer
) -> tuple[str, str, list[ConfigEntry]]:
    """Add one STT and one TTS server through HA's wyoming flow; their entities."""
    stt_entry = await add_wyoming_service(hass, stt.port)
    tts_entry = await add_wyoming_service(hass, tts.port)
    return (
        entity_of(hass, stt_entry, "stt"),
        entity_of(hass, tts_entry, "tts"),
        [stt_entry, tts_entry],
    )


@asynccontextmanager
async def duplex_rig(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    *,
    client_factory: ClientSessionGenerator | None = None,
    pipelines: int = 1,
    options: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[Rig]:
    """Start the servers, the satellite and the entry; the satellite is connected.

    The preferred pipeline uses the first speech servers and Realtime Voice as its
    agent; with ``pipelines=2`` a pipeline named "Second" uses the second ones.
    ``client_factory`` serves HA's HTTP app (the device fetches announcements and
    answers: a media-player satellite); without it the satellite has a speaker.
    ``options``: entry options besides the satellite; ``settings``: the satellite's.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    servers = [
        (WyomingSttServer(phrases=PHRASES), WyomingTtsServer())
        for _ in range(pipelines)
    ]
    entries: list[ConfigEntry] = []
    # Without HA's HTTP app nothing can be fetched: a satellite with a voice
    # assistant speaker (raw API audio); with it, the media-player one.
    features = {} if client_factory is not None else {"features": ATOM_ECHO_FEATURES}
    async with satellite_device(**features) as device:
        try:
            engines = []
            for stt_server, tts_server in servers:
                await stt_server.start()
                await tts_server.start()
                stt_entity, tts_entity, added = await add_speech(
                    hass, stt_server, tts_server
                )
                engines.append((stt_entity, tts_entity))
                entries.extend(added)
            entry = openai_entry(
                hass,
                openai_peer,
                options=options,
                esphome=[stored(device, **settings)],
            )
            await async_load_entry(hass, entry)
            await async_update_pipeline(
                hass,
                async_get_pipeline(hass),
                conversation_engine=AGENT,
                conversation_language="en",
                stt_engine=engines[0][0],
                stt_language="en",
                tts_engine=engines[0][1],
                tts_language="en",
            )
            if pipelines > 1:
                second = await async_create_default_pipeline(
                    hass, engines[1][0], engines[1][1], "Second"
                )
                assert second is not None
            http_base = None
            if client_factory is not None:
                client = await client_factory()  # every view exists now
                http_base = f"http://127.0.0.1:{client.server.port}"
                hass.config.internal_url = http_base
            satellite = entity_of(hass, entry, "assist_satellite")
            states = StateLog(hass, satellite)
            unsub = async_track_state_change_event(hass, satellite, states.changed)
            try:
                await wait(device.wait_for_voice_client(), SAFETY)
                if hass.states.get(satellite).state != "idle":  # type: ignore[union-attr]
                    await states.reached("idle")
                rig = Rig(
                    hass,
                    device,
                    entry,
                    [s for s, _ in servers],
                    [t for _, t in servers],
                    satellite,
                    states,
                    http_base,
                )
                with accounted(
                    lambda: duplex_account(
                        rig.link, servers[0][0], len(openai_peer.requests), states.seen
                    )
                ):
                    yield rig
            finally:
                unsub()
                if entry.state is ConfigEntryState.LOADED:
                    assert await hass.config_entries.async_unload(entry.entry_id)
        finally:
            for added in entries:
                if added.state is ConfigEntryState.LOADED:
                    await hass.config_entries.async_unload(added.entry_id)
            for stt_server, tts_server in servers:
                await stt_server.stop()
                await tts_server.stop()
    assert device.voice.errors == []


def leftover_tasks() -> list[asyncio.Task[Any]]:
    """Tasks of the integration still running."""
    return [
        t
        for t in asyncio.all_tasks()
        if (t.get_name() or "").startswith("rtvoice") and not t.done()
    ]


# --------------------------------------------------------------------------- select


async def test_pipeline_select_applies_to_the_next_utterance(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """Choosing another pipeline mid-conversation: the next utterance uses its STT/TTS."""
    async with duplex_rig(hass, tmp_path, openai_peer, pipelines=2) as rig:
        select = entity_of(hass, rig.entry, "select")
        assert hass.states.get(select).state == "preferred"  # type: ignore[union-attr]
        options = hass.states.get(select).attributes["options"]  # type: ignore[union-attr]
        assert "Second" in options
        registry = er.async_get(hass)
        assert (
            registry.async_get(select).device_id  # type: ignore[union-attr]
            == registry.async_get(rig.satellite).device_id  # type: ignore[union-attr]
        )
        satellite = hass.data["entity_components"]["assist_satellite"].get_entity(
            rig.satellite
        )
        assert satellite.pipeline_entity_id == select

        openai_peer.enqueue(Text("The kitchen lights are on."))
        openai_peer.enqueue(Text("They are still on."))
        run = rig.device.say(await spoken(ASK))
        assert run is not None
        first = await wait(rig.stt[0].wait_for_request(1), SAFETY)
        assert first.transcript == ASK
        await wait(rig.tts[0].wait_for_request(1), SAFETY)
        await rig.states.reached("listening", "responding", "listening")  # played
        child = rig.link.conversation.child_id  # type: ignore[union-attr]

        await hass.services.async_call(
            "select",
            "select_option",
            {"entity_id": select, "option": "Second"},
            blocking=True,
        )
        rig.device.say(await spoken(ASK), wake_word=None)  # same conversation
        second = await wait(rig.stt[1].wait_for_request(1), SAFETY)
        assert second.transcript == ASK
        spoken_by_second = await wait(rig.tts[1].wait_for_request(1), SAFETY)
        assert spoken_by_second.text == "They are still on."
        assert len(rig.stt[0].requests) == 1
        assert len(rig.tts[0].requests) == 1
        assert rig.link.conversation.child_id == child  # type: ignore[union-attr]
        users = [
            m["content"]
            for m in openai_peer.requests[-1].messages
            if m["role"] == "user"
        ]
        assert users == [ASK, ASK]


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize("barge_in", [BargeIn.VAD, BargeIn.WAKE_WORD])
async def test_settings_decide_barge_in_and_end_silence(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer, barge_in: BargeIn
) -> None:
    """Words spoken over the answer cut it in ``vad`` mode, not in ``wake_word``.

    The satellite's end silence (2 s here) ends the conversation afterwards.
    """
    async with duplex_rig(
        hass, tmp_path, openai_peer, **{CONF_BARGE_IN: barge_in, CONF_END_SILENCE: 2}
    ) as rig:
        options = rig.link.binding.options
        assert options.barge_in is barge_in
        assert options.end_silence_ms == 2000
        assert rig.link.binding.echo is None  # off by default (docs/duplex.md)

        openai_peer.enqueue(Text(STORY))
        openai_peer.enqueue(Text("Okay, the lights."))
        run = rig.device.say(await spoken("tell me a story"))
        assert run is not None
        await rig.states.reached("responding")
        conversation = rig.link.conversation
        assert conversation is not None
        rig.device.say(after_a_moment(await spoken(ASK)), wake_word=None)  # over it
        await wait(rig.device.wait_for_event(EventType.RUN_END), SAFETY)  # silence
        stats = conversation.session.stats
        if barge_in is BargeIn.VAD:
            assert stats.barge_ins == 1
            assert openai_peer.requests[-1].messages[-1]["content"] == ASK
        else:
            assert stats.barge_ins == 0
            assert stats.dropped_utterances == 1
            assert len(openai_peer.requests) == 1
        # Back to the wake word; the conversation waits for it (idle timeout).
        assert rig.link.conversation is conversation
        assert conversation.idle


async def test_echo_cancellation_when_asked_and_why_not(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Asked for: AEC3 where its wheel runs, else numpy (each going on from the last).

    Unavailable altogether (not the case for the numpy engine; patched): one warning.
    """
    settings = {CONF_ECHO_CANCELLATION: True}
    async with satellite_device() as device:
        conf = stored(device, **settings)
        factory = duplex_ha.satellite_echo("kitchen", conf)
        assert factory is not None
        assert factory().engine == "aec3"  # the livekit wheel runs here
        without_aec3 = {"aec3": "the livekit package is not installed"}
        with patch.object(
            duplex_ha,
            "echo_unavailable_reason",
            side_effect=lambda engine="numpy": without_aec3.get(engine),
        ):
            factory = duplex_ha.satellite_echo("kitchen", conf)
        assert factory is not None
        first, second = factory(), factory()
        assert isinstance(first, EchoCanceller) and first.engine == "numpy"
        assert second.fdaf is first.fdaf  # the learned echo path carries over
        with (
            caplog.at_level(logging.WARNING),
            patch.object(
                duplex_ha,
                "echo_unavailable_reason",
                return_value="the livekit package is not installed",
            ),
        ):
            entry = openai_entry(hass, openai_peer, esphome=[conf])
            await async_load_entry(hass, entry)
        [binding] = entry.runtime_data.duplex.bindings.values()
        assert binding.echo is None
        warnings = [
            r.getMessage() for r in caplog.records if "Echo cancellation" in r.message
        ]
        assert warnings == [
            (
                "Echo cancellation is turned on for Kitchen duplex but cannot run"
                " here: the livekit package is not installed"
            )
        ]
        assert await hass.config_entries.async_unload(entry.entry_id)


# --------------------------------------------------------------------------- announce


async def test_announce_plays_on_the_device(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """The announcement's TTS reaches the device's player; a conversation is closed.

    An announcement during a conversation closes it first (RUN_END: the device
    stops streaming), as HA cancels a running pipeline for one.
    """
    async with duplex_rig(
        hass, tmp_path, openai_peer, client_factory=hass_client_no_auth
    ) as rig:
        features = hass.states.get(rig.satellite).attributes[ATTR_SUPPORTED_FEATURES]  # type: ignore[union-attr]
        assert features == (
            AssistSatelliteEntityFeature.ANNOUNCE
            | AssistSatelliteEntityFeature.START_CONVERSATION
        )
        release = asyncio.Event()
        openai_peer.enqueue(Text("Let me think"), WaitFor(release))
        run = rig.device.say(await spoken(ASK))
        assert run is not None
        await wait(openai_peer.wait_for_request(1), SAFETY)  # the answer waits
        conversation = rig.link.conversation
        assert conversation is not None

        await hass.services.async_call(
            "assist_satellite",
            "announce",
            {"message": NEWS, "preannounce": False},
            target={"entity_id": rig.satellite},
            blocking=True,
        )
        release.set()
        assert rig.link.conversation is None
        assert conversation.ended
        await wait(rig.device.wait_for_event(EventType.RUN_END), SAFETY)
        [announced] = [p for p in rig.device.playbacks if p.source == "announce"]
        assert announced.error is None
        assert rig.http_base is not None and announced.url.startswith(rig.http_base)
        assert await duplex_ha.pipeline_stt(hass)(announced.pcm) == NEWS
        assert hass.states.get(rig.satellite).state == "idle"  # type: ignore[union-attr]
        transcript = rig.entry.runtime_data.kernel.transcript(conversation.child_id)
        assert transcript is not None and transcript[0].content == ASK


# ---------------------------------------------------------------- start_conversation


@pytest.mark.parametrize("through", ["assist_satellite", DOMAIN])
async def test_start_conversation_announces_then_listens(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
    through: str,
) -> None:
    """The device says the opening, listens; the reply is answered in that child.

    The model's request holds the opening as an assistant message before the
    user's reply. Through HA's action and through ``rtvoice.start_conversation``.
    """
    async with duplex_rig(
        hass, tmp_path, openai_peer, client_factory=hass_client_no_auth
    ) as rig:
        openai_peer.enqueue(Text("The kitchen lights are on."))
        rig.device.say(await spoken(REPLY), wake_word=None)  # for the run to come
        if through == DOMAIN:
            await hass.services.async_call(
                DOMAIN,
                "start_conversation",
                {"satellite": rig.satellite, "message": OPENING},
                blocking=True,
                return_response=True,
            )
        else:
            await hass.services.async_call(
                "assist_satellite",
                "start_conversation",
                {"start_message": OPENING, "preannounce": False},
                target={"entity_id": rig.satellite},
                blocking=True,
            )
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        messages = [(m["role"], m["content"]) for m in request.messages]
        assert messages[-2:] == [("assistant", OPENING), ("user", REPLY)]
        # The announcement, the device listening, the answer.
        await rig.states.reached("responding", "listening", "responding")
        conversation = rig.link.conversation
        assert conversation is not None
        await wait(rig.device.wait_for_event(EventType.RUN_END), SAFETY)
        transcript = rig.entry.runtime_data.kernel.transcript(conversation.child_id)
        assert transcript is not None
        assert [(m.role, m.content) for m in transcript] == [
            ("assistant", OPENING),
            ("user", REPLY),
            ("assistant", "The kitchen lights are on."),
        ]
        [announced] = [p for p in rig.device.playbacks if p.source == "announce"]
        assert await duplex_ha.pipeline_stt(hass)(announced.pcm) == OPENING
        # A media-player satellite (no SPEAKER flag): the answer is an
        # announcement of the live stream, never raw API audio.
        answer = [p for p in rig.device.playbacks if p.source == "media_player"][-1]
        assert await duplex_ha.pipeline_stt(hass)(answer.pcm) == ANSWER


# --------------------------------------------------------------------------- wake words


async def test_wake_word_configuration_round_trips(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_ws_client: WebSocketGenerator,
) -> None:
    """HA's satellite configuration reads and sets the device's wake words."""
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        await wait(
            rig.device.wait_for_message("VoiceAssistantConfigurationRequest"), SAFETY
        )
        await hass.async_block_till_done(wait_background_tasks=True)
        client = await hass_ws_client(hass)

        async def configuration() -> dict[str, Any]:
            await client.send_json_auto_id(
                {
                    "type": "assist_satellite/get_configuration",
                    "entity_id": rig.satellite,
                }
            )
            msg = await client.receive_json()
            assert msg["success"], msg
            return dict(msg["result"])

        config = await configuration()
        assert [w["id"] for w in config["available_wake_words"]] == [
            "okay_nabu",
            "hey_jarvis",
        ]
        assert config["active_wake_words"] == ["okay_nabu"]
        assert config["max_active_wake_words"] == 1

        await client.send_json_auto_id(
            {
                "type": "assist_satellite/set_wake_words",
                "entity_id": rig.satellite,
                "wake_word_ids": ["hey_jarvis"],
            }
        )
        msg = await client.receive_json()
        assert msg["success"], msg
        assert rig.device.voice.active_wake_words == ["hey_jarvis"]
        assert (await configuration())["active_wake_words"] == ["hey_jarvis"]


# --------------------------------------------------------------------------- availability


async def test_entity_unavailable_while_the_link_is_down(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """A dropped connection: unavailable; the link reconnects: idle again."""
    async with duplex_rig(hass, tmp_path, openai_peer) as rig:
        since = rig.device.mark()
        assert rig.device.drop_connection() == 1
        await rig.states.reached(STATE_UNAVAILABLE)
        await wait(rig.device.wait_for_voice_client(since), SAFETY)
        await rig.states.reached(STATE_UNAVAILABLE, "idle")
        assert hass.states.get(rig.satellite).state == "idle"  # type: ignore[union-attr]
    assert leftover_tasks() == []
