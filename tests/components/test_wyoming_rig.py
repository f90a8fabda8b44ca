"""The offline speech rig through Home Assistant's own ``wyoming`` integration.

The Wyoming STT (pocketsphinx) and TTS (espeak-ng) servers run on 127.0.0.1; HA's
``wyoming`` config flow adds them exactly as it adds the Whisper and Piper add-ons,
and everything after that is HA's: the ``stt.*``/``tts.*`` entities, an Assist
pipeline with HA's default agent, the demo lights, the ``tts`` media source and its
HTTP proxy. Nothing is mocked.

The pipeline asks for WAV without a sample rate: any other output format or rate
makes HA convert through the ``ffmpeg`` binary, which the test machines lack
(the ``ffmpeg`` integration, a dependency of ``wyoming``, logs that it is missing).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
import io
from pathlib import Path
import wave

import pytest
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator
from wyoming.audio import AudioChunk, AudioChunkConverter

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import (
    PipelineEvent,
    PipelineEventType,
    PipelineStage,
    async_pipeline_from_audio_stream,
)
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import CONF_HOST, CONF_PORT, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er
from tests.components.common import (
    KITCHEN,
    async_setup_demo_entry,
    async_unload_demo_entry,
)
from tests.peers.speech import speak
from tests.peers.wyoming_speech import (
    STT_PROGRAM,
    TTS_PROGRAM,
    WyomingSttServer,
    WyomingTtsServer,
)

PHRASES = ["turn on the kitchen lights", "what time is it", "stop"]
CHUNK = 1024  # bytes: 32 ms of 16 kHz mono, as a satellite streams
METADATA = stt.SpeechMetadata(
    language="en",
    format=stt.AudioFormats.WAV,
    codec=stt.AudioCodecs.PCM,
    bit_rate=stt.AudioBitRates.BITRATE_16,
    sample_rate=stt.AudioSampleRates.SAMPLERATE_16000,
    channel=stt.AudioChannels.CHANNEL_MONO,
)


@dataclass
class Rig:
    """The two servers and the HA entities made from them."""

    stt_server: WyomingSttServer
    tts_server: WyomingTtsServer
    stt_entry: ConfigEntry
    tts_entry: ConfigEntry
    stt_entity: str
    tts_entity: str


async def add_wyoming_service(hass: HomeAssistant, port: int) -> ConfigEntry:
    """Add a Wyoming server through HA's config flow, as a user does."""
    result = await hass.config_entries.flow.async_init(
        "wyoming", context={"source": "user"}
    )
    assert result["type"] is FlowResultType.FORM
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_HOST: "127.0.0.1", CONF_PORT: port}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()
    return result["result"]


def entity_of(hass: HomeAssistant, entry: ConfigEntry, domain: str) -> str:
    """Return the one entity of ``domain`` an entry created."""
    [entity] = [
        e.entity_id
        for e in er.async_entries_for_config_entry(er.async_get(hass), entry.entry_id)
        if e.domain == domain
    ]
    return entity


@pytest.fixture
async def rig(
    hass: HomeAssistant, tmp_path: Path, socket_enabled: None
) -> AsyncIterator[Rig]:
    """Both servers running and added to HA; the demo lights loaded."""
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    demo_entry = await async_setup_demo_entry(hass)
    async_expose_entity(hass, "conversation", KITCHEN, True)
    async with (
        WyomingSttServer(PHRASES) as stt_server,
        WyomingTtsServer() as tts_server,
    ):
        stt_entry = await add_wyoming_service(hass, stt_server.port)
        tts_entry = await add_wyoming_service(hass, tts_server.port)
        yield Rig(
            stt_server,
            tts_server,
            stt_entry,
            tts_entry,
            entity_of(hass, stt_entry, "stt"),
            entity_of(hass, tts_entry, "tts"),
        )
        for entry in (stt_entry, tts_entry):
            assert await hass.config_entries.async_unload(entry.entry_id)
        await async_unload_demo_entry(hass, demo_entry)
        await hass.async_block_till_done()


async def spoken(text: str) -> bytes:
    """Return a clip of ``text`` (espeak-ng runs in a thread on a cache miss)."""
    return await asyncio.to_thread(speak, text)


async def clip_stream(pcm: bytes) -> AsyncIterator[bytes]:
    """Stream a clip in 32 ms chunks."""
    for offset in range(0, len(pcm), CHUNK):
        yield pcm[offset : offset + CHUNK]


def wav_pcm(data: bytes) -> tuple[int, bytes]:
    """(rate, frames) of a mono 16-bit WAV file."""
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth()) == (1, 2)
        return wav.getframerate(), wav.readframes(wav.getnframes())


def to_16k(rate: int, pcm: bytes) -> bytes:
    """Resample 16-bit mono PCM to 16 kHz (what HA's STT entities take)."""
    chunk = AudioChunk(rate=rate, width=2, channels=1, audio=pcm)
    return AudioChunkConverter(rate=16000).convert(chunk).audio


async def run_pipeline(
    hass: HomeAssistant, rig: Rig, pcm: bytes
) -> dict[PipelineEventType, PipelineEvent]:
    """Run the preferred pipeline from STT to TTS on a clip; events by type."""
    pipeline = async_get_pipeline(hass)
    await async_update_pipeline(
        hass,
        pipeline,
        stt_engine=rig.stt_entity,
        stt_language="en",
        tts_engine=rig.tts_entity,
        tts_language="en",
        conversation_engine="conversation.home_assistant",
        conversation_language="en",
    )
    events: list[PipelineEvent] = []
    await async_pipeline_from_audio_stream(
        hass,
        context=Context(),
        event_callback=events.append,
        stt_metadata=METADATA,
        stt_stream=clip_stream(pcm),
        pipeline_id=pipeline.id,
        tts_audio_output={tts.ATTR_PREFERRED_FORMAT: "wav"},
        start_stage=PipelineStage.STT,
        end_stage=PipelineStage.TTS,
    )
    return {event.type: event for event in events}


async def test_config_flow_gives_stt_and_tts_entities(
    hass: HomeAssistant, rig: Rig
) -> None:
    """Each server becomes an entry named after its program, with one entity."""
    assert rig.stt_entry.title == STT_PROGRAM
    assert rig.tts_entry.title == TTS_PROGRAM
    assert hass.states.get(rig.stt_entity) is not None
    assert hass.states.get(rig.tts_entity) is not None

    stt_entity = stt.async_get_speech_to_text_entity(hass, rig.stt_entity)
    assert stt_entity is not None
    assert stt_entity.supported_languages == ["en"]
    tts_entity = hass.data[tts.DATA_COMPONENT].get_entity(rig.tts_entity)
    assert tts_entity is not None
    voices = tts_entity.async_get_supported_voices("en")
    assert voices is not None
    assert [voice.voice_id for voice in voices] == sorted(rig.tts_server.voices)


async def test_stt_entity_transcribes_a_spoken_clip(
    hass: HomeAssistant, rig: Rig
) -> None:
    """HA's wyoming STT entity streams the clip and gets the phrase back."""
    entity = stt.async_get_speech_to_text_entity(hass, rig.stt_entity)
    assert entity is not None
    clip = await spoken("what time is it")

    result = await entity.async_process_audio_stream(METADATA, clip_stream(clip))

    assert (result.result, result.text) == (
        stt.SpeechResultState.SUCCESS,
        "what time is it",
    )
    request = await rig.stt_server.wait_for_request(1)
    assert (request.language, request.audio_format) == ("en", (16000, 2, 1))
    assert len(request.audio) > 0


async def test_pipeline_spoken_command_to_spoken_answer(
    hass: HomeAssistant, hass_client: ClientSessionGenerator, rig: Rig
) -> None:
    """Speech → Wyoming STT → HA's agent turns the light on → Wyoming TTS → URL.

    The answer audio is fetched from HA's tts proxy as a client would, and fed
    back through HA's STT entity: it says what the agent answered.
    """
    events = await run_pipeline(hass, rig, await spoken("turn on the kitchen lights"))

    assert PipelineEventType.ERROR not in events
    stt_end = events[PipelineEventType.STT_END].data
    assert stt_end is not None
    assert stt_end["stt_output"]["text"] == "turn on the kitchen lights"
    state = hass.states.get(KITCHEN)
    assert state is not None
    assert state.state == STATE_ON
    intent_end = events[PipelineEventType.INTENT_END].data
    assert intent_end is not None
    answer = intent_end["intent_output"]["response"]["speech"]["plain"]["speech"]
    assert answer
    tts_end = events[PipelineEventType.TTS_END].data
    assert tts_end is not None

    client = await hass_client()
    response = await client.get(tts_end["tts_output"]["url"])
    assert response.status == 200
    rate, pcm = wav_pcm(await response.read())

    synthesized = await rig.tts_server.wait_for_request(1)
    assert synthesized.text == answer
    assert (rate, pcm) == (synthesized.rate, synthesized.audio)
    await rig.stt_server.set_phrases([*PHRASES, answer])
    entity = stt.async_get_speech_to_text_entity(hass, rig.stt_entity)
    assert entity is not None
    heard = await entity.async_process_audio_stream(
        METADATA, clip_stream(to_16k(rate, pcm))
    )
    assert heard.text == answer


async def test_pipeline_unrecognised_speech_is_an_stt_error(
    hass: HomeAssistant, rig: Rig
) -> None:
    """Speech outside the grammar ends the run with HA's "no text" error."""
    events = await run_pipeline(
        hass, rig, await spoken("what is the capital of france")
    )

    error = events[PipelineEventType.ERROR].data
    assert error is not None
    assert error["code"] == "stt-no-text-recognized"
    assert PipelineEventType.INTENT_START not in events
    assert (await rig.stt_server.wait_for_request(1)).transcript == ""
