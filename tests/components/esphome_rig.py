"""Home Assistant's own ``esphome`` integration against the device emulator.

Everything in the voice path is real: the emulated device (``tests.peers.esphome``)
speaks the native API to HA's ``esphome`` integration (aioesphomeapi 29.9.0), its
``assist_satellite`` entity runs HA's Assist pipeline, STT and TTS go through HA's
``wyoming`` integration to the offline speech servers, the agent is Realtime Voice
against the loopback OpenAI peer (or HA's own agent through the HA-agent brain), the
kitchen light is HA's demo light, and the device fetches the answer audio from HA's
HTTP server as Voice PE's media player does.

What the harness needs (DESIGN §5.7), nothing else is patched:

- ``mock_async_zeroconf``: HA replaces ``Zeroconf.__new__`` process-wide, so a real
  instance would outlive the test's loop;
- ``hass.config.config_dir`` in a temp folder: TTS writes its cache there;
- the ``homeassistant`` component set up first (the component conftest does it);
- HA's HTTP app served on 127.0.0.1 (the harness's ``aiohttp_client``) once every
  view is registered (a started aiohttp app refuses new routes), with
  ``internal_url`` pointing at it, so the URLs in the pipeline events work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.rtvoice.const import DOMAIN, SIGNAL_SESSION_UPDATE
from custom_components.rtvoice.kernel import ChildStats
from homeassistant.components import stt
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.esphome.const import CONF_NOISE_PSK
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntry, ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from tests.components.common import (
    BED,
    KITCHEN,
    SAFETY_TIMEOUT,
    async_load_entry,
    async_setup_demo_entry,
    async_unload_demo_entry,
)
from tests.peers.esphome import EmulatedDevice
from tests.peers.speech import speak
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

AGENT = "conversation.realtime_voice"
PHRASES = [
    "turn on the kitchen lights",
    "turn on the bed light",
    "what time is it",
    "tell me a story",
    "yes please",
]
METADATA = stt.SpeechMetadata(
    language="en",
    format=stt.AudioFormats.WAV,
    codec=stt.AudioCodecs.PCM,
    bit_rate=stt.AudioBitRates.BITRATE_16,
    sample_rate=stt.AudioSampleRates.SAMPLERATE_16000,
    channel=stt.AudioChannels.CHANNEL_MONO,
)


async def wait[T](aw: Awaitable[T], timeout: float = SAFETY_TIMEOUT) -> T:
    """Await ``aw`` with a safety-net timeout (never a synchronisation)."""
    return await asyncio.wait_for(aw, timeout)


async def spoken(text: str) -> bytes:
    """Return a 16 kHz clip of ``text`` (espeak-ng runs in a thread on a cache miss)."""
    return await asyncio.to_thread(speak, text)


def entity_of(hass: HomeAssistant, entry: ConfigEntry, domain: str) -> str:
    """Return the one entity of ``domain`` an entry created."""
    [entity] = [
        e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.domain == domain
    ]
    return entity


async def add_wyoming_service(hass: HomeAssistant, port: int) -> ConfigEntry:
    """Add a Wyoming server through HA's config flow."""
    result = await hass.config_entries.flow.async_init(
        "wyoming", context={"source": "user"}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "127.0.0.1", CONF_PORT: port}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    return result["result"]


async def esphome_flow(
    hass: HomeAssistant, device: EmulatedDevice, noise_psk: str | None = None
) -> dict[str, Any]:
    """Add the device through HA's esphome user flow, as a user types it in.

    An encrypted device makes the flow ask for its key (``noise_psk``, or the
    device's own when None). Returns the last flow result (an entry or a form).
    """
    result = await hass.config_entries.flow.async_init(
        "esphome", context={"source": "user"}
    )
    assert result["type"] is FlowResultType.FORM
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: device.host, CONF_PORT: device.port}
    )
    if result["type"] is FlowResultType.FORM and result["step_id"] == "encryption_key":
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {CONF_NOISE_PSK: noise_psk or device.noise_psk}
        )
    return dict(result)


@dataclass
class Rig:
    """One HA with an emulated satellite, the speech servers and Realtime Voice."""

    hass: HomeAssistant
    device: EmulatedDevice
    stt_server: WyomingSttServer
    tts_server: WyomingTtsServer
    esphome_entry: ConfigEntry
    entry: MockConfigEntry
    satellite: str
    stt_entity: str
    tts_entity: str
    http_base: str

    @property
    def device_id(self) -> str:
        """Device registry id of the emulated satellite."""
        entity = er.async_get(self.hass).async_get(self.satellite)
        assert entity is not None and entity.device_id is not None
        return entity.device_id

    async def wait_snapshot(
        self, predicate: Callable[[ChildStats], bool]
    ) -> ChildStats:
        """Wait for the satellite's session to satisfy ``predicate`` (dispatcher)."""
        sessions = self.entry.runtime_data.sessions
        if (now := sessions.stats(self.satellite)) is not None and predicate(now):
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

    async def recognise(self, pcm: bytes) -> str:
        """Return what HA's STT entity hears in 16 kHz mono PCM (e.g. the answer played)."""
        entity = stt.async_get_speech_to_text_entity(self.hass, self.stt_entity)
        assert entity is not None

        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, len(pcm), 1024):
                yield pcm[offset : offset + 1024]

        result = await entity.async_process_audio_stream(METADATA, chunks())
        return result.text or ""

    async def transcript(self, conversation_id: str) -> list[str]:
        """Return the transcript lines of a conversation through ``rtvoice.get_transcript``."""
        page = await self.hass.services.async_call(
            DOMAIN,
            "get_transcript",
            {"conversation_id": conversation_id},
            blocking=True,
            return_response=True,
        )
        assert page is not None
        return str(page["transcript"]).splitlines()


@asynccontextmanager
async def esphome_rig(
    hass: HomeAssistant,
    tmp_path: Path,
    client_factory: ClientSessionGenerator,
    entry: MockConfigEntry,
    **device_config: Any,
) -> AsyncIterator[Rig]:
    """Start everything; ``entry`` is an added (not loaded) Realtime Voice entry.

    ``device_config`` goes to ``EmulatedDevice`` (e.g. ``encrypted=True``).
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    demo_entry = await async_setup_demo_entry(hass)
    async_expose_entity(hass, "conversation", KITCHEN, True)
    async_expose_entity(hass, "conversation", BED, False)
    device_config.setdefault("name", "kitchen-satellite")
    device_config.setdefault("friendly_name", "Kitchen satellite")
    device_config.setdefault("suggested_area", "Kitchen")
    async with (
        WyomingSttServer(PHRASES) as stt_server,
        WyomingTtsServer() as tts_server,
        EmulatedDevice(**device_config) as device,
    ):
        stt_entry = await add_wyoming_service(hass, stt_server.port)
        tts_entry = await add_wyoming_service(hass, tts_server.port)
        await async_load_entry(hass, entry)
        stt_entity = entity_of(hass, stt_entry, "stt")
        tts_entity = entity_of(hass, tts_entry, "tts")
        await async_update_pipeline(
            hass,
            async_get_pipeline(hass),
            conversation_engine=AGENT,
            conversation_language="en",
            stt_engine=stt_entity,
            stt_language="en",
            tts_engine=tts_entity,
            tts_language="en",
            prefer_local_intents=False,
        )

        result = await esphome_flow(hass, device)
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        esphome_entry: ConfigEntry = result["result"]
        await hass.async_block_till_done()
        assert esphome_entry.state is ConfigEntryState.LOADED
        await wait(device.wait_for_voice_client())
        satellite = entity_of(hass, esphome_entry, "assist_satellite")
        # The kitchen light joins the area the device suggested ("Kitchen").
        device_entry = dr.async_get(hass).async_get(
            er.async_get(hass).async_get(satellite).device_id  # type: ignore[union-attr]
        )
        assert device_entry is not None and device_entry.area_id is not None
        er.async_get(hass).async_update_entity(KITCHEN, area_id=device_entry.area_id)

        client = await client_factory()  # serve HA's HTTP app: every view exists now
        http_base = f"http://127.0.0.1:{client.server.port}"
        hass.config.internal_url = http_base
        await hass.async_block_till_done()

        rig = Rig(
            hass,
            device,
            stt_server,
            tts_server,
            esphome_entry,
            entry,
            satellite,
            stt_entity,
            tts_entity,
            http_base,
        )
        try:
            yield rig
        finally:
            for unload in (esphome_entry, entry, stt_entry, tts_entry):
                if unload.state is ConfigEntryState.LOADED:
                    assert await hass.config_entries.async_unload(unload.entry_id)
            await async_unload_demo_entry(hass, demo_entry)
            await hass.async_block_till_done()
            assert device.voice.errors == []
