"""Realtime Voice: realtime LLM conversations for Home Assistant voice satellites."""

from __future__ import annotations

from homeassistant.const import EVENT_HOMEASSISTANT_STOP, Platform
from homeassistant.core import Event, HomeAssistant
from homeassistant.helpers import config_validation as cv
from homeassistant.helpers.typing import ConfigType

from .assistant import async_create_assistant_once
from .const import BRAIN_OPENAI, CONF_BASE_URL, CONF_BRAIN, CONF_MODEL, DOMAIN
from .control_api import async_register_control_api
from .duplex_owner import async_watch_satellite_conflicts
from .duplex_stream import async_register_streams
from .redact import endpoint_unique_id
from .runtime import RtVoiceConfigEntry, async_build_runtime
from .satellites.stored import async_migrate_satellites
from .services import async_setup_services

PLATFORMS: list[Platform] = [
    Platform.ASSIST_SATELLITE,
    Platform.CONVERSATION,
    Platform.SELECT,
    Platform.SENSOR,
    Platform.WAKE_WORD,
]

CONFIG_SCHEMA = cv.config_entry_only_config_schema(DOMAIN)


async def async_setup(hass: HomeAssistant, config: ConfigType) -> bool:
    """Register the actions and the answer-stream view (they serve every entry)."""
    async_setup_services(hass)
    async_register_streams(hass)
    return True


async def async_migrate_entry(hass: HomeAssistant, entry: RtVoiceConfigEntry) -> bool:
    """Migrate an entry made by an older version.

    1.1 → 1.2: an endpoint entry's unique id held its base URL verbatim, with any
    ``user:pass@`` or ``?api-key=``; it becomes ``endpoint_unique_id`` (without them).
    Should another entry hold that id already (two entries differing only in
    the URL's secrets), the entry id is appended so ids stay unique.

    1.2 → 1.3: the duplex satellites move from the options into config subentries,
    one each, with their devices and entities (``satellites.stored``).
    """
    if entry.version > 1:
        return False  # made by a newer version: do not touch
    if entry.minor_version < 2:
        unique_id = entry.unique_id
        if entry.data.get(CONF_BRAIN, BRAIN_OPENAI) == BRAIN_OPENAI and (
            CONF_BASE_URL in entry.data and CONF_MODEL in entry.data
        ):
            unique_id = endpoint_unique_id(
                entry.data[CONF_BASE_URL], entry.data[CONF_MODEL]
            )
            other = hass.config_entries.async_entry_for_domain_unique_id(
                DOMAIN, unique_id
            )
            if other is not None and other.entry_id != entry.entry_id:
                unique_id = f"{unique_id}|{entry.entry_id}"
        hass.config_entries.async_update_entry(
            entry, unique_id=unique_id, minor_version=2
        )
    if entry.minor_version < 3:
        async_migrate_satellites(hass, entry)
        hass.config_entries.async_update_entry(entry, minor_version=3)
    return True


async def async_setup_entry(hass: HomeAssistant, entry: RtVoiceConfigEntry) -> bool:
    """Build the runtime of an entry and set up its platforms.

    The brain is validated first: ConfigEntryNotReady / ConfigEntryAuthFailed come
    from there. Unloading closes every conversation (transcript hand-off included).
    """
    runtime = await async_build_runtime(hass, entry)
    entry.runtime_data = runtime
    entry.async_on_unload(runtime.async_shutdown)

    async def _async_on_hass_stop(_event: Event) -> None:
        # HA does not unload entries when it stops: hand the transcripts off now.
        await runtime.async_shutdown()

    entry.async_on_unload(
        hass.bus.async_listen_once(EVENT_HOMEASSISTANT_STOP, _async_on_hass_stop)
    )
    await hass.config_entries.async_forward_entry_setups(entry, PLATFORMS)
    await async_create_assistant_once(hass, entry)
    entry.async_on_unload(async_register_control_api(hass, entry))
    entry.async_on_unload(async_watch_satellite_conflicts(hass, entry))
    entry.async_on_unload(entry.add_update_listener(_async_update_listener))
    return True


async def _async_update_listener(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> None:
    """Options or satellites changed: apply in place, keeping conversations.

    Switching tools on or off, and adding, changing or removing a satellite (a
    subentry), reload the entry (which closes the running conversations with
    hand-off, as unloading does).
    """
    if not entry.runtime_data.apply(entry):
        await hass.config_entries.async_reload(entry.entry_id)


async def async_unload_entry(hass: HomeAssistant, entry: RtVoiceConfigEntry) -> bool:
    """Unload platforms; the on-unload callbacks close every conversation."""
    return await hass.config_entries.async_unload_platforms(entry, PLATFORMS)
