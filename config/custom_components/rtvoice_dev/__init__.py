"""The development instance's helper (scripts/develop): Assist that works offline.

Home Assistant creates its first Assist pipeline while it starts, with the speech
engines loaded at that moment. The demo integration's text-to-speech engine is a
legacy platform whose setup Home Assistant does not wait for, so the pipeline often
gets no TTS at all, and onboarding then adds Google Translate, which needs the
internet. Once Home Assistant has started, this fills in what the preferred
pipeline lacks: the demo TTS (offline) and the default STT engine. A choice made in
the UI (an engine that exists) is never changed.

Not part of the integration: only config/configuration.yaml loads it.
"""

from __future__ import annotations

import logging
from typing import Any

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import async_update_pipeline
from homeassistant.components.assist_pipeline.pipeline import async_get_pipeline
from homeassistant.const import EVENT_HOMEASSISTANT_STARTED
from homeassistant.core import CoreState, Event, HomeAssistant
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.typing import ConfigType
from homeassistant.util import language as language_util

DOMAIN = "rtvoice_dev"
OFFLINE_TTS = "demo"  # the demo integration's TTS engine: no network needed

CONFIG_SCHEMA = cv.empty_config_schema(DOMAIN)

_LOGGER = logging.getLogger(__name__)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Fill in the preferred pipeline's engines once Home Assistant has started."""

    async def _started(_event: Event | None = None) -> None:
        await async_complete_pipeline(hass)

    if hass.state is CoreState.running:
        await _started()
    else:
        hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STARTED, _started)
    return True


def _language(wanted: str, supported: list[str], fallback: str | None) -> str | None:
    matches = language_util.matches(wanted, supported)
    return matches[0] if matches else fallback


async def async_complete_pipeline(hass: HomeAssistant) -> None:
    """Give the preferred pipeline an STT and an offline TTS engine if it lacks one."""
    pipeline = async_get_pipeline(hass)
    updates: dict[str, Any] = {}
    if (
        pipeline.stt_engine is None
        or stt.async_get_speech_to_text_engine(hass, pipeline.stt_engine) is None
    ) and (engine_id := stt.async_default_engine(hass)) is not None:
        engine = stt.async_get_speech_to_text_engine(hass, engine_id)
        if engine is not None and (
            language := _language(pipeline.language, engine.supported_languages, None)
        ):
            updates |= {"stt_engine": engine_id, "stt_language": language}
    if (
        pipeline.tts_engine is None
        or tts.async_resolve_engine(hass, pipeline.tts_engine) is None
    ):
        engine_id = tts.async_resolve_engine(hass, OFFLINE_TTS) or (
            tts.async_default_engine(hass)
        )
        engine = tts.get_engine_instance(hass, engine_id) if engine_id else None
        if engine is not None:
            updates |= {
                "tts_engine": engine_id,
                "tts_language": _language(
                    pipeline.language,
                    engine.supported_languages,
                    engine.default_language,
                ),
                "tts_voice": None,
            }
    if updates:
        _LOGGER.info("Assist pipeline %r: using %s", pipeline.name, updates)
        await async_update_pipeline(hass, pipeline, **updates)
