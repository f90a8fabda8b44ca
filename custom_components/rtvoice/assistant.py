"""The "Realtime Voice" assistant that adding the integration creates (issue 17).

Assist's picker (the browser's Assist dialog, a satellite's device page) lists
*assistants* (Assist pipelines), not conversation agents: until one uses Realtime
Voice a new user has nothing to pick. So the config flow offers to create one
(``create_assistant``, on by default) and the entry's first setup does it, once:

- its conversation agent is this entry's;
- speech-to-text, text-to-speech and the wake word are the preferred assistant's
  (what the user already chose), else Home Assistant's defaults;
- "Prefer handling commands locally" is off: with it on, Home Assistant's own agent
  answers "turn on the kitchen lights" and Realtime Voice never hears it.

The offer is consumed at the first setup whatever happens (a failure is logged), so
an assistant the user deleted or changed is never created or touched again. It uses
``assist_pipeline``'s public helpers only.
"""

from __future__ import annotations

import logging

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import (
    async_create_default_pipeline,
    async_get_pipeline,
    async_get_pipelines,
    async_update_pipeline,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er

from .const import CONF_CREATE_ASSISTANT, DOMAIN

_LOGGER = logging.getLogger(__name__)


async def async_create_assistant_once(hass: HomeAssistant, entry: ConfigEntry) -> None:
    """Create the entry's assistant if the config flow was told to (first setup)."""
    if not entry.data.get(CONF_CREATE_ASSISTANT):
        return
    hass.config_entries.async_update_entry(
        entry,
        data={k: v for k, v in entry.data.items() if k != CONF_CREATE_ASSISTANT},
    )
    if "assist_pipeline" not in hass.config.components:
        _LOGGER.info("No assistant created for %s: Assist is not set up", entry.title)
        return
    agent = er.async_get(hass).async_get_entity_id(
        "conversation", DOMAIN, entry.entry_id
    )
    if agent is None:
        _LOGGER.warning(
            "No assistant created for %s: its agent is missing", entry.title
        )
        return
    if any(p.conversation_engine == agent for p in async_get_pipelines(hass)):
        return
    try:
        created = await _async_create(hass, entry.title, agent)
    except Exception:
        _LOGGER.exception("Creating the assistant %s failed", entry.title)
        return
    if created:
        _LOGGER.info(
            "Created the assistant %s (Settings → Voice assistants)", entry.title
        )
    else:
        _LOGGER.info(
            "No assistant created for %s: the speech engines do not support the"
            " language of Home Assistant; create one under Settings → Voice assistants",
            entry.title,
        )


async def _async_create(hass: HomeAssistant, name: str, agent: str) -> bool:
    """Create the assistant from the preferred one's speech choices."""
    preferred = async_get_pipeline(hass)
    stt_engine = preferred.stt_engine or stt.async_default_engine(hass)
    tts_engine = preferred.tts_engine or tts.async_default_engine(hass)
    # Typed as str; None (no engine at all) is what HA resolves it to then.
    pipeline = await async_create_default_pipeline(
        hass,
        stt_engine_id=stt_engine,  # type: ignore[arg-type]
        tts_engine_id=tts_engine,  # type: ignore[arg-type]
        pipeline_name=name,
    )
    if pipeline is None:
        return False
    same_stt = stt_engine == preferred.stt_engine
    same_tts = tts_engine == preferred.tts_engine
    await async_update_pipeline(
        hass,
        pipeline,
        conversation_engine=agent,
        prefer_local_intents=False,
        stt_language=preferred.stt_language if same_stt else pipeline.stt_language,
        tts_language=preferred.tts_language if same_tts else pipeline.tts_language,
        tts_voice=preferred.tts_voice if same_tts else pipeline.tts_voice,
        wake_word_entity=preferred.wake_word_entity,
        wake_word_id=preferred.wake_word_id,
    )
    return True
