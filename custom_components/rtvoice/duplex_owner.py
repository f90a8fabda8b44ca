"""Who owns an ESPHome satellite: Realtime Voice entries or Home Assistant's ``esphome``.

Only one API client can own a device's voice assistant. The flows (discovery, the
satellite subentry flow's add and take-over) and the repair issue ask the same
questions, answered here from the config entries and the registries (no I/O):

- which Realtime Voice entries can take a satellite, and which one owns a MAC (its
  ESPHome satellite subentry, ``satellites.stored``);
- HA's ``esphome`` entry for a MAC (its unique id is the formatted MAC; its data
  holds host, port and the encryption key), and which of them are voice satellites
  (they registered an ``assist_satellite`` entity);
- HA's ``esphome`` ``assist_satellite`` entities on a MAC's device, and the
  repair issue raised while one of them is enabled for a satellite we own
  (``async_watch_satellite_conflicts``; the fix is in ``repairs``): checked at
  setup and on every entity registry change, removed when the conflict is gone,
  the satellite removed or the entry unloaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from aioesphomeapi import DeviceInfo

from homeassistant.config_entries import SOURCE_IGNORE, ConfigEntry
from homeassistant.const import CONF_HOST, CONF_PORT, Platform
from homeassistant.core import CALLBACK_TYPE, Event, HomeAssistant, callback
from homeassistant.helpers import (
    device_registry as dr,
    entity_registry as er,
    issue_registry as ir,
)

from .const import (
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    DOMAIN,
    SUBENTRY_ESPHOME,
)
from .device_text import device_text
from .duplex_ha import satellite_key
from .satellites.stored import satellite_confs

ESPHOME_DOMAIN: Final = "esphome"
ASSIST_SATELLITE: Final = Platform.ASSIST_SATELLITE.value


def satellite_conf(
    host: str, port: int, noise_psk: str | None, info: DeviceInfo
) -> dict[str, Any]:
    """Return what an entry stores for a satellite that passed the probe."""
    return {
        CONF_HOST: host,
        CONF_PORT: port,
        CONF_NOISE_PSK: noise_psk,
        CONF_NAME: device_text(info.friendly_name or info.name),
        CONF_MAC: info.mac_address,
        CONF_ESPHOME_VERSION: info.esphome_version,
    }


@callback
def rtvoice_entries(hass: HomeAssistant) -> list[ConfigEntry]:
    """Return the Realtime Voice entries that can own satellites (not ignored/disabled)."""
    return hass.config_entries.async_entries(
        DOMAIN, include_ignore=False, include_disabled=False
    )


@callback
def owner_of(
    hass: HomeAssistant, mac: str
) -> tuple[ConfigEntry, Mapping[str, Any]] | None:
    """Return the Realtime Voice entry owning the satellite ``mac``, and its conf."""
    key = dr.format_mac(mac)
    for entry in hass.config_entries.async_entries(DOMAIN, include_ignore=False):
        for conf in satellite_confs(entry, SUBENTRY_ESPHOME):
            if satellite_key(conf) == key:
                return entry, conf
    return None


@callback
def esphome_entry_for(hass: HomeAssistant, mac: str) -> ConfigEntry | None:
    """Return HA's ``esphome`` entry of the device ``mac`` (its unique id), if any."""
    entry = hass.config_entries.async_entry_for_domain_unique_id(
        ESPHOME_DOMAIN, dr.format_mac(mac)
    )
    if entry is None or entry.source == SOURCE_IGNORE or CONF_HOST not in entry.data:
        return None
    return entry


@callback
def esphome_voice_entries(hass: HomeAssistant) -> list[ConfigEntry]:
    """Return HA's ``esphome`` entries that are voice satellites, with a known MAC.

    A voice satellite is one whose entry registered an ``assist_satellite``
    entity (enabled or not): HA's esphome creates it from the device's voice
    assistant flags.
    """
    registry = er.async_get(hass)
    return [
        entry
        for entry in hass.config_entries.async_entries(
            ESPHOME_DOMAIN, include_ignore=False
        )
        if entry.unique_id
        and CONF_HOST in entry.data
        and any(
            e.domain == ASSIST_SATELLITE
            for e in er.async_entries_for_config_entry(registry, entry.entry_id)
        )
    ]


# HA esphome's voice entities of a device (``EsphomeAssistEntity``: unique id
# "<mac>-<key>"): the Assist satellite, its assistant (pipeline), finished-speaking
# detection and wake word selects, and the assist-in-progress sensor.
ESPHOME_VOICE_KEYS: Final = (
    "assist_satellite",
    "pipeline",
    "vad_sensitivity",
    "wake_word",
    "assist_in_progress",
)


@callback
def esphome_voice_entities(
    hass: HomeAssistant, mac: str, *, enabled_only: bool = True
) -> list[er.RegistryEntry]:
    """Return HA's ``esphome`` voice entities of the device ``mac``.

    A device taken over for duplex mode shows Realtime Voice's own satellite and
    assistant select; ESPHome's would be a second, identical "Assistant" select
    that does not apply. Matched through the device registry (the MAC
    connection) and through the ``esphome`` entry whose unique id is the MAC,
    whichever finds them.
    """
    registry = er.async_get(hass)
    key = dr.format_mac(mac)
    found: dict[str, er.RegistryEntry] = {}
    device = dr.async_get(hass).async_get_device(
        connections={(dr.CONNECTION_NETWORK_MAC, key)}
    )
    if device is not None:
        for entity in er.async_entries_for_device(
            registry, device.id, include_disabled_entities=True
        ):
            found[entity.entity_id] = entity
    if (esphome := esphome_entry_for(hass, key)) is not None:
        for entity in er.async_entries_for_config_entry(registry, esphome.entry_id):
            found[entity.entity_id] = entity
    return [
        entity
        for entity in found.values()
        if entity.platform == ESPHOME_DOMAIN
        and str(entity.unique_id).rpartition("-")[2] in ESPHOME_VOICE_KEYS
        and not (enabled_only and entity.disabled)
    ]


ISSUE_ESPHOME_SATELLITE_ENABLED: Final = "esphome_satellite_enabled"
DATA_SATELLITE: Final = "satellite"  # issue data: the satellite's key (its MAC)


def conflict_issue_id(entry_id: str, key: str) -> str:
    """Return the issue id of a satellite of an entry whose HA entity is enabled."""
    return f"{ISSUE_ESPHOME_SATELLITE_ENABLED}_{entry_id}_{key}"


@callback
def async_watch_satellite_conflicts(
    hass: HomeAssistant, entry: ConfigEntry
) -> CALLBACK_TYPE:
    """Raise and clear the conflict issues of ``entry``'s satellites; return a stop.

    The stop (for ``entry.async_on_unload``) removes the entry's issues: an
    unloaded entry owns no voice assistant.
    """
    raised: set[str] = set()
    # A changed satellite (subentry) reloads the entry, so they are read once.
    satellites = [
        conf for conf in satellite_confs(entry, SUBENTRY_ESPHOME) if conf.get(CONF_MAC)
    ]

    @callback
    def sync(_event: Event[Any] | None = None) -> None:
        wanted: set[str] = set()
        for conf in satellites:
            key = satellite_key(conf)
            entities = esphome_voice_entities(hass, key)
            if not entities:
                continue
            issue_id = conflict_issue_id(entry.entry_id, key)
            wanted.add(issue_id)
            ir.async_create_issue(
                hass,
                DOMAIN,
                issue_id,
                is_fixable=True,
                is_persistent=False,
                severity=ir.IssueSeverity.WARNING,
                translation_key=ISSUE_ESPHOME_SATELLITE_ENABLED,
                translation_placeholders={
                    "satellite": str(conf.get(CONF_NAME) or conf[CONF_HOST]),
                    "entities": ", ".join(sorted(e.entity_id for e in entities)),
                    "entry": entry.title,
                },
                data={"entry_id": entry.entry_id, DATA_SATELLITE: key},
            )
        for issue_id in raised - wanted:
            ir.async_delete_issue(hass, DOMAIN, issue_id)
        raised.clear()
        raised.update(wanted)

    sync()
    unsubscribe = hass.bus.async_listen(er.EVENT_ENTITY_REGISTRY_UPDATED, sync)

    @callback
    def stop() -> None:
        unsubscribe()
        for issue_id in raised:
            ir.async_delete_issue(hass, DOMAIN, issue_id)
        raised.clear()

    return stop
