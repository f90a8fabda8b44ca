"""The satellites an entry owns: one config subentry each.

A duplex satellite is something the user adds many of to one Realtime Voice entry,
so each is a config subentry of the entry (Home Assistant 2025.4+): the entry's
page lists them under "ESPHome satellites" and "Wyoming satellites", each with its
own add button, reconfigure and delete, and the satellite's device and entities
belong to its subentry (deleting the subentry removes them).

- type ``esphome_satellite``: data = host, port, noise_psk (None: plaintext), name,
  mac, esphome_version (from the device when it was added) and the satellite's
  settings (``form``); unique id = ``duplex_ha.satellite_key`` (the formatted MAC);
- type ``wyoming_satellite``: data = host, port, name, wake_word and the settings;
  unique id = ``wyoming_ha.wyoming_key`` (host:port).

The data mapping is what the links read (``link_settings``), unchanged from the
options of older versions, so ``async_migrate_satellites`` (entry version 1.2 → 1.3)
moves each stored satellite as it is into a subentry and ties its existing device
and entities (same unique ids) to it: nothing the user set is lost, neither the
satellite's settings nor its entity ids, names, areas or pipeline choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
import logging
from types import MappingProxyType
from typing import Any, Final

from homeassistant.config_entries import ConfigEntry, ConfigSubentry
from homeassistant.const import CONF_HOST
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import device_registry as dr, entity_registry as er

from ..const import (
    CONF_DUPLEX_SATELLITES,
    CONF_NAME,
    CONF_WYOMING_SATELLITES,
    DOMAIN,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from ..duplex_ha import satellite_device_info, satellite_key, satellite_unique_id
from ..wyoming_ha import wyoming_device_info, wyoming_key, wyoming_unique_id

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Kind:
    """What differs between the kinds of satellite: keys, ids, the old options key."""

    subentry_type: str
    option: str  # where versions before 1.3 kept the list of them
    key: Callable[[Mapping[str, Any]], str]
    unique_id: Callable[[str, str], str]  # (entry id, key) → the entities' id
    device_info: Callable[[str, Mapping[str, Any]], dr.DeviceInfo]


KINDS: Final = {
    SUBENTRY_ESPHOME: _Kind(
        SUBENTRY_ESPHOME,
        CONF_DUPLEX_SATELLITES,
        satellite_key,
        satellite_unique_id,
        satellite_device_info,
    ),
    SUBENTRY_WYOMING: _Kind(
        SUBENTRY_WYOMING,
        CONF_WYOMING_SATELLITES,
        wyoming_key,
        wyoming_unique_id,
        wyoming_device_info,
    ),
}


def satellite_title(conf: Mapping[str, Any]) -> str:
    """Return the name a satellite's subentry shows (its name, else its host)."""
    return str(conf.get(CONF_NAME) or conf[CONF_HOST])


def satellite_subentries(entry: ConfigEntry, kind: str) -> list[ConfigSubentry]:
    """Return the entry's subentries of one kind, in the order they were added."""
    return [s for s in entry.subentries.values() if s.subentry_type == kind]


def satellite_confs(entry: ConfigEntry, kind: str) -> list[Mapping[str, Any]]:
    """Return the stored settings of the entry's satellites of one kind."""
    return [s.data for s in satellite_subentries(entry, kind)]


def subentry_ids(entry: ConfigEntry, kind: str) -> dict[str, str]:
    """Return the subentry id of each satellite of one kind, by satellite key."""
    key_of = KINDS[kind].key
    return {key_of(s.data): s.subentry_id for s in satellite_subentries(entry, kind)}


@callback
def owner_of_key(
    hass: HomeAssistant, kind: str, key: str
) -> tuple[ConfigEntry, ConfigSubentry] | None:
    """Return the entry and subentry that own the satellite ``key``, if any.

    Every Realtime Voice entry counts (disabled ones too): a satellite serves one
    client, so two entries must not both hold it.
    """
    key_of = KINDS[kind].key
    for entry in hass.config_entries.async_entries(DOMAIN, include_ignore=False):
        for subentry in satellite_subentries(entry, kind):
            if key_of(subentry.data) == key:
                return entry, subentry
    return None


def new_subentry(kind: str, conf: Mapping[str, Any]) -> ConfigSubentry:
    """Return the subentry that stores the satellite ``conf``."""
    return ConfigSubentry(
        data=MappingProxyType(dict(conf)),
        subentry_type=kind,
        title=satellite_title(conf),
        unique_id=KINDS[kind].key(conf),
    )


@callback
def async_rekey(
    hass: HomeAssistant, entry: ConfigEntry, kind: str, old: str, new: str
) -> None:
    """Keep a satellite's device and entities when its key changes (a new address).

    A Wyoming satellite's key is its address: reconfigured to another host, its
    entities' unique ids and its device's identifier follow, so entity ids,
    names, areas and the pipeline choice stay.
    """
    if old == new:
        return
    spec = KINDS[kind]
    ent_reg = er.async_get(hass)
    old_id, new_id = (spec.unique_id(entry.entry_id, k) for k in (old, new))
    for entity in er.async_entries_for_config_entry(ent_reg, entry.entry_id):
        # The satellite's own id, and ids built on it (its select: "<id>-pipeline").
        if entity.unique_id == old_id or entity.unique_id.startswith(f"{old_id}-"):
            ent_reg.async_update_entity(
                entity.entity_id,
                new_unique_id=new_id + entity.unique_id.removeprefix(old_id),
            )
    dev_reg = dr.async_get(hass)
    old_identifiers = spec.device_info(old, {CONF_HOST: old})["identifiers"]
    new_identifiers = spec.device_info(new, {CONF_HOST: new})["identifiers"]
    device = dev_reg.async_get_device(identifiers=old_identifiers)
    if device is not None:
        dev_reg.async_update_device(
            device.id,
            new_identifiers=(device.identifiers - old_identifiers) | new_identifiers,
        )


@callback
def async_migrate_satellites(hass: HomeAssistant, entry: ConfigEntry) -> None:
    """Move the satellites stored in the options into subentries (1.2 → 1.3).

    Each satellite keeps its stored mapping; its device (identified as before)
    and the entry's entities on it move from the entry to the new subentry. A
    satellite stored twice (same key) is kept once, the later one as the runtime
    used it; one without an address could never run and is dropped with a
    warning.
    """
    options = dict(entry.options)
    for spec in KINDS.values():
        by_key: dict[str, Mapping[str, Any]] = {}
        for conf in options.pop(spec.option, None) or []:
            try:
                by_key[spec.key(conf)] = conf
            except (KeyError, TypeError, AttributeError):
                _LOGGER.warning(
                    "%s: a stored satellite without an address was dropped",
                    entry.title,
                )
        taken = {s.unique_id for s in entry.subentries.values()}
        for key, conf in by_key.items():
            if key in taken:
                continue
            subentry = new_subentry(spec.subentry_type, conf)
            hass.config_entries.async_add_subentry(entry, subentry)
            _tie_device(hass, entry, subentry, spec.device_info(key, conf))
    hass.config_entries.async_update_entry(entry, options=options)


def _tie_device(
    hass: HomeAssistant,
    entry: ConfigEntry,
    subentry: ConfigSubentry,
    device_info: dr.DeviceInfo,
) -> None:
    """Move the satellite's device and the entry's entities on it to ``subentry``.

    Order matters: the device gains the subentry first, then the entities move,
    and only then does the device drop its tie to the entry alone (the entity
    registry removes entities whose subentry their device no longer has). A
    device shared with another integration (HA's esphome, for a taken-over
    satellite) keeps that integration's ties.
    """
    dev_reg = dr.async_get(hass)
    ent_reg = er.async_get(hass)
    device = dev_reg.async_get_device(identifiers=device_info["identifiers"])
    if device is None or entry.entry_id not in device.config_entries:
        return
    dev_reg.async_update_device(
        device.id,
        add_config_entry_id=entry.entry_id,
        add_config_subentry_id=subentry.subentry_id,
    )
    for entity in er.async_entries_for_device(
        ent_reg, device.id, include_disabled_entities=True
    ):
        if entity.config_entry_id == entry.entry_id:
            ent_reg.async_update_entity(
                entity.entity_id, config_subentry_id=subentry.subentry_id
            )
    dev_reg.async_update_device(
        device.id,
        remove_config_entry_id=entry.entry_id,
        remove_config_subentry_id=None,
    )
