"""The development instance's helper (scripts/develop): Assist that works offline.

Home Assistant creates its first Assist pipeline while it starts, with the speech
engines loaded at that moment. The demo integration's text-to-speech engine is a
legacy platform whose setup Home Assistant does not wait for, so the pipeline often
gets no TTS at all, and onboarding then adds Google Translate, which needs the
internet. Once Home Assistant has started, this fills in what the preferred
pipeline lacks: the demo TTS (offline) and the default STT engine. A choice made in
the UI (an engine that exists) is never changed.

The instance runs without the internet, and two things would make it look broken
(issue 17 item 6):

- the demo media players show pictures from YouTube and Facebook; Home Assistant
  fetches them for the browser and logs a traceback for every failed fetch, on every
  dashboard load. Here a failed fetch is a missing picture (online they show);
- onboarding adds Met.no (weather) and Radio Browser, which offline only fail and
  retry: an entry onboarding created for them whose setup fails is removed, with a
  log line (online they stay). Add them again under Settings → Devices & services.

Not part of the integration: only config/configuration.yaml loads it, and its
manifest's ``integration_type: system`` keeps it out of *Add integration*.
"""

from __future__ import annotations

from collections.abc import Callable
import logging
from typing import Any

import aiohttp

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import async_update_pipeline
from homeassistant.components.assist_pipeline.pipeline import async_get_pipeline
from homeassistant.config_entries import (
    SIGNAL_CONFIG_ENTRY_CHANGED,
    ConfigEntry,
    ConfigEntryChange,
    ConfigEntryState,
)
from homeassistant.const import EVENT_HOMEASSISTANT_STARTED
from homeassistant.core import CoreState, Event, HomeAssistant, callback
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.typing import ConfigType
from homeassistant.util import language as language_util

DOMAIN = "rtvoice_dev"
OFFLINE_TTS = "demo"  # the demo integration's TTS engine: no network needed
# Integrations onboarding adds that need the internet (onboarding/views.py).
ONLINE_ONLY = frozenset({"met", "radio_browser"})

CONFIG_SCHEMA = cv.empty_config_schema(DOMAIN)

_LOGGER = logging.getLogger(__name__)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Fill in the preferred pipeline's engines once Home Assistant has started."""
    remove_failed_online_only_entries(hass)

    async def _started(_event: Event | None = None) -> None:
        quiet_demo_pictures(hass)
        await async_complete_pipeline(hass)

    if hass.state is CoreState.running:
        await _started()
    else:
        hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STARTED, _started)
    return True


@callback
def remove_failed_online_only_entries(hass: HomeAssistant) -> Callable[[], None]:
    """Remove an entry of ONLINE_ONLY that onboarding added once its setup fails."""
    removing: set[str] = set()

    @callback
    def _entry_changed(change: ConfigEntryChange, entry: ConfigEntry) -> None:
        if (
            change is ConfigEntryChange.UPDATED
            and entry.entry_id not in removing
            and entry.domain in ONLINE_ONLY
            and entry.source == "onboarding"
            and entry.state
            in (ConfigEntryState.SETUP_RETRY, ConfigEntryState.SETUP_ERROR)
        ):
            _LOGGER.info(
                "Removing %s, which onboarding added: it cannot reach the internet",
                entry.title,
            )
            removing.add(entry.entry_id)
            hass.async_create_task(hass.config_entries.async_remove(entry.entry_id))

    return async_dispatcher_connect(hass, SIGNAL_CONFIG_ENTRY_CHANGED, _entry_changed)


@callback
def quiet_demo_pictures(hass: HomeAssistant) -> None:
    """Make a failed fetch of a demo player's internet picture a missing picture.

    The browser loads a player's picture through Home Assistant's image proxy;
    offline, every fetch fails with a connection error that the proxy (HA 2025.4
    and 2026.x: only a timeout is caught) logs as a traceback, on every dashboard
    load. Online the pictures show as before.
    """
    from homeassistant.components.demo import media_player as demo  # noqa: PLC0415
    from homeassistant.components.media_player import DATA_COMPONENT, async_fetch_image  # noqa: PLC0415

    async def fetch(url: str) -> tuple[bytes | None, str | None]:
        try:
            return await async_fetch_image(_LOGGER, hass, url)
        except aiohttp.ClientError:
            return None, None

    if (component := hass.data.get(DATA_COMPONENT)) is None:
        return
    for entity in component.entities:
        if isinstance(entity, demo.AbstractDemoPlayer):
            entity._async_fetch_image = fetch  # type: ignore[method-assign]  # noqa: SLF001


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
