"""A real Home Assistant for the session, conversation and pipeline tests.

What runs is HA's own: conversation, intent, assist_pipeline, assist_satellite, the
Assist LLM API and the demo lights; the model is the loopback ``OpenAIPeer``.
Only two things are test-made, because nothing real can run here:

- ``VoiceSatellite``, a minimal ``AssistSatelliteEntity`` (a real satellite needs a
  device on the network); it records the pipeline events and announcements HA sends.
- ``LoopbackSTT``, a speech-to-text entity that consumes the audio and answers with
  the next text the test queued (there is no offline speech recognizer in HA).

Synchronisation is by events only (``wait_for``/``Waiter``); a bounded timeout is the
safety net against hangs, never the mechanism.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
import io
from pathlib import Path
from typing import Any
from unittest.mock import patch
import wave

from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import (
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    EVENT_ASK_PARENT,
    EVENT_CONVERSATION_CLOSED,
    SIGNAL_SESSION_UPDATE,
)
from custom_components.rtvoice.control import ControlPlane
from custom_components.rtvoice.kernel import ChildStats
from custom_components.rtvoice.sessions import SessionManager
from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import (
    PipelineEvent,
    PipelineEventType,
    PipelineStage,
)
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.assist_satellite import (
    AssistSatelliteAnnouncement,
    AssistSatelliteEntityFeature,
)
from homeassistant.config_entries import ConfigEntry, ConfigEntryState
from homeassistant.const import Platform
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.core_config import async_process_ha_core_config
from homeassistant.helpers import entity_registry as er, intent
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.setup import async_setup_component
from tests.components.common import (
    BED as BED_LIGHT,
    SAFETY_TIMEOUT,
    MinimalSatellite,
    async_load_entry,
    async_setup_demo_entry,
    async_setup_test_integration,
    async_unload_demo_entry,
    openai_data,
)
from tests.peers.openai_server import OpenAIPeer

TEST_DOMAIN = "rtvoice_test_voice"
SATELLITE = "assist_satellite.kitchen_satellite"
QUIET_SATELLITE = "assist_satellite.hall_satellite"  # cannot announce
STT_ENTITY = "stt.loopback_stt"
TTS_ENTITY = "tts.loopback_tts"
AGENT = "conversation.realtime_voice"


async def wait(aw: Awaitable[Any], timeout: float = SAFETY_TIMEOUT) -> Any:
    """Await ``aw`` with a safety-net timeout."""
    return await asyncio.wait_for(aw, timeout)


class VoiceSatellite(MinimalSatellite):
    """A minimal real assist satellite; it records what HA sends it."""

    def __init__(
        self, unique_id: str, device_name: str, features: AssistSatelliteEntityFeature
    ) -> None:
        """Create the entity with its own device."""
        super().__init__(TEST_DOMAIN, unique_id, device_name, features)
        self.events: list[PipelineEvent] = []
        self.announcements: list[str] = []
        self.announce_gate: asyncio.Event | None = None  # hold announcements here
        self.changed = asyncio.Condition()

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """Record a pipeline event."""
        self.events.append(event)
        self.hass.async_create_task(self._notify(), eager_start=True)

    async def async_announce(self, announcement: AssistSatelliteAnnouncement) -> None:
        """Record an announcement; it "plays" until the gate (if any) opens."""
        self.announcements.append(announcement.message)
        await self._notify()
        if self.announce_gate is not None:
            await self.announce_gate.wait()

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Wait until ``predicate()`` holds after some recorded event."""
        async with self.changed:
            await wait(self.changed.wait_for(predicate))

    def events_of(self, kind: PipelineEventType) -> list[PipelineEvent]:
        """Return the recorded events of one type."""
        return [e for e in self.events if e.type == kind]

    def streamed_text(self, start: int = 0) -> str:
        """Text of the chat log deltas (INTENT_PROGRESS) recorded from ``start`` on."""
        return "".join(
            (e.data or {}).get("chat_log_delta", {}).get("content") or ""
            for e in self.events[start:]
            if e.type == PipelineEventType.INTENT_PROGRESS
        )


class GatedBedLightOn(intent.IntentHandler):
    """A real HA intent (so a real Assist API tool) that waits for a gate.

    It stands for a slow device action: the test holds it inside Home Assistant while
    it starts new input, then lets it switch the light through HA's service.
    """

    description = "Slowly turns on the bed light"

    def __init__(self, intent_type: str = "RtvoiceTestSlowBedLightOn") -> None:
        """Create the handler with a closed gate."""
        self.intent_type = intent_type
        self.started = asyncio.Event()
        self.gate = asyncio.Event()

    async def async_handle(self, intent_obj: intent.Intent) -> intent.IntentResponse:
        """Wait for the gate, then switch the light."""
        self.started.set()
        await self.gate.wait()
        await intent_obj.hass.services.async_call(
            "light",
            "turn_on",
            {"entity_id": BED_LIGHT},
            blocking=True,
            context=intent_obj.context,
        )
        response = intent_obj.create_response()
        response.async_set_speech("The bed light is on.")
        return response


class LoopbackSTT(stt.SpeechToTextEntity):
    """Consumes the audio and "recognizes" the next queued text."""

    _attr_name = "Loopback STT"

    def __init__(self) -> None:
        """Create the entity with an empty queue."""
        self._attr_unique_id = "loopback-stt"
        self.texts: deque[str] = deque()

    @property
    def supported_languages(self) -> list[str]:
        """English only."""
        return ["en"]

    @property
    def supported_formats(self) -> list[stt.AudioFormats]:
        """WAV."""
        return [stt.AudioFormats.WAV]

    @property
    def supported_codecs(self) -> list[stt.AudioCodecs]:
        """PCM."""
        return [stt.AudioCodecs.PCM]

    @property
    def supported_bit_rates(self) -> list[stt.AudioBitRates]:
        """16 bit."""
        return [stt.AudioBitRates.BITRATE_16]

    @property
    def supported_sample_rates(self) -> list[stt.AudioSampleRates]:
        """16 kHz."""
        return [stt.AudioSampleRates.SAMPLERATE_16000]

    @property
    def supported_channels(self) -> list[stt.AudioChannels]:
        """Mono."""
        return [stt.AudioChannels.CHANNEL_MONO]

    async def async_process_audio_stream(
        self, metadata: stt.SpeechMetadata, stream: AsyncIterable[bytes]
    ) -> stt.SpeechResult:
        """Drain the audio, then return the next queued text."""
        async for _chunk in stream:
            pass
        return stt.SpeechResult(self.texts.popleft(), stt.SpeechResultState.SUCCESS)


class LoopbackTTS(tts.TextToSpeechEntity):
    """A text-to-speech entity so announcements resolve; it speaks silence."""

    _attr_name = "Loopback TTS"

    def __init__(self) -> None:
        """Create the entity."""
        self._attr_unique_id = "loopback-tts"

    @property
    def supported_languages(self) -> list[str]:
        """English only."""
        return ["en"]

    @property
    def default_language(self) -> str:
        """English."""
        return "en"

    async def async_get_tts_audio(
        self, message: str, language: str, options: dict[str, Any]
    ) -> tts.TtsAudioType:
        """Return 10 ms of silence as a WAV file."""
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(bytes(320))
        return "wav", buffer.getvalue()


async def silence(chunks: int = 5) -> AsyncIterator[bytes]:
    """Yield a short finite mic stream (16 kHz 16-bit mono silence)."""
    for _ in range(chunks):
        yield bytes(1024)


@dataclass
class Home:
    """The Home Assistant the tests run in."""

    hass: HomeAssistant
    satellite: VoiceSatellite
    quiet_satellite: VoiceSatellite
    stt: LoopbackSTT
    test_entry: ConfigEntry
    demo_entry: ConfigEntry
    entry: MockConfigEntry | None = None
    closed: list[dict[str, Any]] = field(default_factory=list)
    asked: list[dict[str, Any]] = field(default_factory=list)
    events_changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def device_of(self, entity_id: str) -> str:
        """Device id of an entity."""
        entry = er.async_get(self.hass).async_get(entity_id)
        assert entry is not None and entry.device_id is not None
        return entry.device_id

    @property
    def sessions(self) -> SessionManager:
        """The session manager of the loaded rtvoice entry."""
        assert self.entry is not None
        return self.entry.runtime_data.sessions

    @property
    def control(self) -> ControlPlane:
        """The control plane of the loaded rtvoice entry."""
        assert self.entry is not None
        return self.entry.runtime_data.control

    async def wait_closed(self, count: int) -> list[dict[str, Any]]:
        """Wait until ``count`` conversations were handed off; return their events."""
        async with self.events_changed:
            await wait(self.events_changed.wait_for(lambda: len(self.closed) >= count))
        return self.closed

    async def wait_snapshot(
        self, predicate: Callable[[ChildStats], bool]
    ) -> ChildStats:
        """Wait for a session update (dispatcher signal) that satisfies ``predicate``."""
        assert self.entry is not None
        for item in self.control.list_conversations():
            if (now := self.sessions.stats(item["id"])) and predicate(now):
                return now
        found: asyncio.Future[ChildStats] = self.hass.loop.create_future()

        @callback
        def updated(_satellite: str | None, snapshot: ChildStats) -> None:
            if not found.done() and predicate(snapshot):
                found.set_result(snapshot)

        unsub = async_dispatcher_connect(
            self.hass, SIGNAL_SESSION_UPDATE.format(self.entry.entry_id), updated
        )
        try:
            return await wait(found)
        finally:
            unsub()


async def async_setup_home(hass: HomeAssistant, tmp_path: Path) -> Home:
    """HA with two satellites, a loopback STT, demo lights and the Assist pipeline."""
    with patch(
        "homeassistant.components.tts._init_tts_cache_dir", return_value=str(tmp_path)
    ):
        for component in (
            "homeassistant",
            "intent",
            "conversation",
            "assist_satellite",
        ):
            assert await async_setup_component(hass, component, {})
        await hass.async_block_till_done()

    demo_entry = await async_setup_demo_entry(hass)

    satellite = VoiceSatellite(
        "sat-kitchen",
        "Kitchen satellite",
        AssistSatelliteEntityFeature.ANNOUNCE
        | AssistSatelliteEntityFeature.START_CONVERSATION,
    )
    quiet = VoiceSatellite(
        "sat-hall", "Hall satellite", AssistSatelliteEntityFeature(0)
    )
    loopback = LoopbackSTT()
    loopback_tts = LoopbackTTS()

    async def satellites_setup(hass: HomeAssistant, entry: ConfigEntry, add) -> None:
        add([satellite, quiet])

    async def stt_setup(hass: HomeAssistant, entry: ConfigEntry, add) -> None:
        add([loopback])

    async def tts_setup(hass: HomeAssistant, entry: ConfigEntry, add) -> None:
        add([loopback_tts])

    test_entry = await async_setup_test_integration(
        hass,
        TEST_DOMAIN,
        {
            Platform.ASSIST_SATELLITE: satellites_setup,
            Platform.STT: stt_setup,
            Platform.TTS: tts_setup,
        },
    )
    assert hass.states.get(SATELLITE) is not None
    assert hass.states.get(QUIET_SATELLITE) is not None
    assert hass.states.get(STT_ENTITY) is not None
    assert hass.states.get(TTS_ENTITY) is not None
    await async_process_ha_core_config(hass, {"internal_url": "http://127.0.0.1:8123"})

    home = Home(hass, satellite, quiet, loopback, test_entry, demo_entry)

    async def record(store: list[dict[str, Any]], event: Event) -> None:
        store.append(dict(event.data))
        async with home.events_changed:
            home.events_changed.notify_all()

    async def closed(event: Event) -> None:
        await record(home.closed, event)

    async def asked(event: Event) -> None:
        await record(home.asked, event)

    hass.bus.async_listen(EVENT_CONVERSATION_CLOSED, closed)
    hass.bus.async_listen(EVENT_ASK_PARENT, asked)
    return home


async def async_setup_rtvoice(
    home: Home,
    peer: OpenAIPeer | None,
    data: dict[str, Any] | None = None,
    **options: Any,
) -> MockConfigEntry:
    """Set up Realtime Voice (against the peer); the pipeline uses it as its agent."""
    hass = home.hass
    if data is None:
        assert peer is not None
        data = openai_data(peer)
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Realtime Voice",
        data=data,
        options={**DEFAULT_OPTIONS_OPENAI, **options},
    )
    entry.add_to_hass(hass)
    home.entry = await async_load_entry(hass, entry)
    pipeline = async_get_pipeline(hass)
    await async_update_pipeline(
        hass,
        pipeline,
        conversation_engine=AGENT,
        stt_engine=STT_ENTITY,
        stt_language="en",
        tts_engine=TTS_ENTITY,
        tts_language="en",
        prefer_local_intents=False,
    )
    return entry


async def async_unload(home: Home) -> None:
    """Unload the rtvoice entry if it is loaded."""
    entry = home.entry
    if entry is not None and entry.state is ConfigEntryState.LOADED:
        assert await home.hass.config_entries.async_unload(entry.entry_id)
        await home.hass.async_block_till_done()


async def async_teardown_home(home: Home) -> None:
    """Unload rtvoice, then the demo lights (with the platforms they were set up with)."""
    await async_unload(home)
    await async_unload_demo_entry(home.hass, home.demo_entry)


def run_satellite(
    home: Home, text: str, satellite: VoiceSatellite | None = None
) -> asyncio.Task[None]:
    """Start a pipeline run on a satellite (as its firmware would); the STT hears ``text``."""
    sat = satellite or home.satellite
    home.stt.texts.append(text)
    return home.hass.async_create_task(
        sat.async_accept_pipeline_from_satellite(
            silence(), start_stage=PipelineStage.STT, end_stage=PipelineStage.INTENT
        ),
        eager_start=False,
    )


def tool_named(request_tools: list[dict[str, Any]] | None, suffix: str) -> str:
    """Return the real name of the tool ending in ``suffix`` (as the peer saw it)."""
    assert request_tools, "the request offered no tools"
    names = [t["function"]["name"] for t in request_tools]
    matches = [n for n in names if n.endswith(suffix)]
    assert len(matches) == 1, f"{suffix!r} not uniquely among {names}"
    return matches[0]
