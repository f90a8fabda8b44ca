"""The openWakeWord engine as Home Assistant sees it: a ``wake_word`` entity.

Real models (pyopen-wakeword), real speech (espeak-ng), HA's own ``wake_word``
component and Assist pipeline. Mocked only where this machine cannot be the other
case: a missing package / a musl system (the package is installed here, on glibc).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import logging
import sys
import threading
from typing import Any
from unittest.mock import patch

import pytest

from custom_components.rtvoice import wake_word as rt_wake_word
from custom_components.rtvoice.audio.wakeword import WakeWordEngine
from custom_components.rtvoice.const import DOMAIN
from homeassistant.components import wake_word
from homeassistant.components.assist_pipeline import PipelineEventType, PipelineStage
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er, issue_registry as ir
from homeassistant.requirements import RequirementsNotFound
from tests.components.common import agent_entry, async_load_entry
from tests.components.pipeline.helpers import Home, async_setup_rtvoice, wait
from tests.peers.openai_server import OpenAIPeer, Text
from tests.peers.speech import silence, speak, speech_tools_available

pytest.importorskip("pyopen_wakeword")
pytestmark = pytest.mark.skipif(
    not speech_tools_available(), reason="espeak-ng and sox are needed"
)

ENTITY = "wake_word.realtime_voice_openwakeword"
CHUNK = 320  # 10 ms, as HA's audio processing hands it on


async def _chunks(
    pcm: bytes, chunk: int = CHUNK, drained: asyncio.Event | None = None
) -> AsyncIterator[tuple[bytes, int]]:
    """Yield ``pcm`` as (chunk, timestamp ms).

    With ``drained``: once the consumer asks for more than ``pcm`` (so it has
    processed all of it), set ``drained`` and hang like a live microphone.
    """
    for start in range(0, len(pcm), chunk):
        yield pcm[start : start + chunk], start // 32
    if drained is not None:
        drained.set()
        await asyncio.Event().wait()


def _state(hass: HomeAssistant) -> str:
    """State of the wake word entity (the time of its last detection)."""
    state = hass.states.get(ENTITY)
    assert state is not None
    return state.state


async def _entity(hass: HomeAssistant) -> wake_word.WakeWordDetectionEntity:
    """Set up an entry; return its wake word entity through HA's API."""
    await async_load_entry(hass, agent_entry(hass))
    entity = wake_word.async_get_wake_word_detection_entity(hass, ENTITY)
    assert entity is not None
    return entity


async def test_entity_offers_the_bundled_models(hass: HomeAssistant) -> None:
    """The entity exists on the entry's device and lists the wake words."""
    entity = await _entity(hass)
    words = await entity.get_supported_wake_words()
    assert {w.id for w in words} >= {"okay_nabu", "hey_jarvis", "hey_mycroft", "alexa"}
    assert next(w for w in words if w.id == "hey_jarvis").phrase == "hey jarvis"
    registry_entry = er.async_get(hass).async_get(ENTITY)
    assert registry_entry is not None
    assert registry_entry.unique_id.endswith("-wake_word")
    assert registry_entry.device_id is not None
    assert wake_word.async_default_entity(hass) == ENTITY


@pytest.mark.parametrize(
    ("wake_word_id", "text", "expected"),
    [
        ("hey_jarvis", "hey jarvis", "hey_jarvis"),
        ("okay_nabu", "okay nabu", "okay_nabu"),
        ("alexa", "alexa", "alexa"),
        ("hey_mycroft", "hey my croft", "hey_mycroft"),
        (None, "hey jarvis", "hey_jarvis"),  # None: every model listens
    ],
)
async def test_stream_detects_the_wake_word(
    hass: HomeAssistant, wake_word_id: str | None, text: str, expected: str
) -> None:
    """HA's API hears the wake word and records the detection in the state."""
    entity = await _entity(hass)
    assert _state(hass) == "unknown"
    pcm = silence(500) + speak(text) + silence(2000)
    result = await entity.async_process_audio_stream(_chunks(pcm), wake_word_id)
    assert result is not None
    assert result.wake_word_id == expected
    assert result.wake_word_phrase == rt_wake_word.MODELS_BY_ID[expected].phrase
    # The detection comes after the phrase started and before the stream ended.
    assert result.timestamp is not None
    assert 500 < result.timestamp < len(pcm) // 32
    assert _state(hass) not in ("unknown", "unavailable")


@pytest.mark.parametrize(
    "pcm",
    [
        pytest.param(speak("turn on the kitchen lights"), id="command"),
        pytest.param(silence(3000), id="silence"),
    ],
)
async def test_other_audio_detects_nothing(hass: HomeAssistant, pcm: bytes) -> None:
    """A stream without the wake word ends with no result and no state change."""
    entity = await _entity(hass)
    assert await entity.async_process_audio_stream(_chunks(pcm), None) is None
    assert _state(hass) == "unknown"


async def test_unknown_wake_word_id_is_an_error(hass: HomeAssistant) -> None:
    """A pipeline asking for a wake word the engine lacks fails loudly."""
    entity = await _entity(hass)
    with pytest.raises(ValueError, match="hey_siri"):
        await entity.async_process_audio_stream(_chunks(silence(100)), "hey_siri")


async def test_two_streams_at_once_share_nothing(hass: HomeAssistant) -> None:
    """Two pipelines detecting concurrently each hear their own wake word."""
    entity = await _entity(hass)
    jarvis = silence(300) + speak("hey jarvis") + silence(1000)
    alexa = speak("alexa", voice="en-gb") + silence(1000)
    results = await asyncio.gather(
        entity.async_process_audio_stream(_chunks(jarvis, 640), None),
        entity.async_process_audio_stream(_chunks(alexa, 1000), None),
    )
    assert [r.wake_word_id if r else None for r in results] == ["hey_jarvis", "alexa"]


async def test_warm_up_happens_once_at_setup(hass: HomeAssistant) -> None:
    """The engine is warmed before the entity exists; streams do not warm again."""
    with patch.object(
        WakeWordEngine, "warm_up", autospec=True, side_effect=WakeWordEngine.warm_up
    ) as warm_up:
        entity = await _entity(hass)
        assert warm_up.call_count == 1
        await entity.async_process_audio_stream(_chunks(speak("alexa")), "alexa")
        await entity.async_process_audio_stream(_chunks(silence(500)), "alexa")
        assert warm_up.call_count == 1


async def test_cancelled_caller_closes_the_stream(hass: HomeAssistant) -> None:
    """A caller cancelled mid-stream leaves no detector open and no task behind."""
    entity = await _entity(hass)
    opened: list[Any] = []
    real_open = WakeWordEngine.open_stream

    def spy(engine: WakeWordEngine, model_ids: Any = None) -> Any:
        stream = real_open(engine, model_ids)
        opened.append(stream)
        return stream

    drained = asyncio.Event()
    with patch.object(WakeWordEngine, "open_stream", spy):
        task = hass.async_create_task(
            entity.async_process_audio_stream(
                _chunks(silence(1000), drained=drained), None
            )
        )
        await wait(drained.wait())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await hass.async_block_till_done()
    (stream,) = opened
    assert stream.audio_ms == 960  # every complete 80 ms frame was processed
    stream.feed(speak("hey jarvis"))
    assert stream.process() is None  # closed: it hears nothing any more


async def test_caller_cancelled_while_opening_closes_the_stream(
    hass: HomeAssistant,
) -> None:
    """Cancelled while the worker opens the detector: what it opens is closed."""
    entity = await _entity(hass)
    entered, release = threading.Event(), threading.Event()
    opened: list[Any] = []
    real_open = WakeWordEngine.open_stream

    def slow_open(engine: WakeWordEngine, model_ids: Any = None) -> Any:
        entered.set()
        release.wait()
        stream = real_open(engine, model_ids)
        opened.append(stream)
        return stream

    with patch.object(WakeWordEngine, "open_stream", slow_open):
        task = hass.async_create_task(
            entity.async_process_audio_stream(_chunks(silence(500)), None)
        )
        await hass.async_add_executor_job(entered.wait)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        # The close is scheduled from the open's done-callback: outside any task.
        await hass.async_block_till_done(wait_background_tasks=True)
    (stream,) = opened
    stream.feed(speak("hey jarvis"))
    assert stream.process() is None  # closed


async def test_unload_removes_the_entity(hass: HomeAssistant) -> None:
    """Unloading the entry removes the engine with it."""
    entity = await _entity(hass)
    entry = entity.platform.config_entry
    assert entry is not None
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.NOT_LOADED
    assert wake_word.async_get_wake_word_detection_entity(hass, ENTITY) is None


async def test_missing_package_reports_and_skips_the_entity(
    hass: HomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    """No package and no install: the entry loads, one log line, one repair issue.

    Mocked: the package is installed here, so the import is made to fail, and pip
    (which would need the network) is made to fail as it would offline.
    """
    with (
        patch.dict(sys.modules, {"pyopen_wakeword": None}),
        patch.object(
            rt_wake_word.requirements,
            "async_process_requirements",
            side_effect=RequirementsNotFound("rtvoice.wake_word", ["pyopen-wakeword"]),
        ) as install,
        caplog.at_level(logging.WARNING),
    ):
        entry = await async_load_entry(hass, agent_entry(hass))
        second = await async_load_entry(hass, agent_entry(hass, title="Second"))
    assert install.call_count == 2
    assert entry.state is second.state is ConfigEntryState.LOADED
    assert hass.states.async_entity_ids("wake_word") == []
    lines = [r for r in caplog.records if "openWakeWord" in r.getMessage()]
    assert len(lines) == 1  # once per run, not per entry
    assert "installing pyopen-wakeword" in lines[0].getMessage()
    issue = ir.async_get(hass).async_get_issue(DOMAIN, rt_wake_word.ISSUE_UNAVAILABLE)
    assert issue is not None
    assert issue.translation_placeholders is not None
    assert "pyopen-wakeword" in issue.translation_placeholders["reason"]

    # Once the package works again, the next setup offers the entity and clears it.
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert len(hass.states.async_entity_ids("wake_word")) == 1
    assert (
        ir.async_get(hass).async_get_issue(DOMAIN, rt_wake_word.ISSUE_UNAVAILABLE)
        is None
    )


async def test_musl_system_does_not_try_to_install(hass: HomeAssistant) -> None:
    """On musl (HA OS, the container image) no wheel exists: say so, skip pip.

    Mocked: this machine has glibc and the package; both are made to look absent.
    """
    with (
        patch.dict(sys.modules, {"pyopen_wakeword": None}),
        patch.object(rt_wake_word.sys, "platform", "linux"),
        patch.object(rt_wake_word.platform, "libc_ver", return_value=("", "")),
        patch.object(rt_wake_word.requirements, "async_process_requirements") as pip,
    ):
        await async_load_entry(hass, agent_entry(hass))
    pip.assert_not_called()
    assert hass.states.async_entity_ids("wake_word") == []
    issue = ir.async_get(hass).async_get_issue(DOMAIN, rt_wake_word.ISSUE_UNAVAILABLE)
    assert issue is not None
    assert issue.translation_placeholders is not None
    assert "musl" in issue.translation_placeholders["reason"]


async def test_assist_pipeline_run_from_wake_word(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A satellite streams audio into a pipeline whose wake word engine is ours.

    HA's pipeline runs wake word -> STT -> our agent; the wake word stage is real
    detection on spoken audio, the rest as in the other pipeline tests.
    """
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    await async_update_pipeline(
        hass,
        async_get_pipeline(hass),
        wake_word_entity=ENTITY,
        wake_word_id="hey_jarvis",
    )
    openai_peer.enqueue(Text("It is sunny."))
    home.stt.texts.append("what is the weather")
    pcm = silence(1000) + speak("hey jarvis") + speak("what is the weather")

    async def mic() -> AsyncIterator[bytes]:
        for start in range(0, len(pcm), 1024):
            yield pcm[start : start + 1024]

    await wait(
        home.satellite.async_accept_pipeline_from_satellite(
            mic(), start_stage=PipelineStage.WAKE_WORD, end_stage=PipelineStage.INTENT
        )
    )
    (wake_end,) = home.satellite.events_of(PipelineEventType.WAKE_WORD_END)
    assert wake_end.data is not None
    output = wake_end.data["wake_word_output"]
    assert output["wake_word_id"] == "hey_jarvis"
    assert output["wake_word_phrase"] == "hey jarvis"
    (intent_end,) = home.satellite.events_of(PipelineEventType.INTENT_END)
    assert intent_end.data is not None
    speech = intent_end.data["intent_output"]["response"]["speech"]["plain"]["speech"]
    assert speech == "It is sunny."
    assert openai_peer.requests[0].messages[-1]["content"] == "what is the weather"
