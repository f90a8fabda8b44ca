"""The base of every Realtime Voice entity: the entry's service device.

Each config entry has one device of the type *service*, named like the entry, whose
model is the configured model (or the agent the answers are delegated to). The
conversation entity and every per-satellite sensor sit on it; see sensor.py for why
the sensors do not sit on the satellites' own devices.
"""

from __future__ import annotations

from typing import Final

from homeassistant.components import conversation
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.entity import Entity

from .const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BRAIN,
    CONF_MODEL,
    DEFAULT_AGENT_ID,
    DEFAULT_MODEL,
    DOMAIN,
)
from .runtime import RtVoiceConfigEntry

MANUFACTURER: Final = "Realtime Voice"


def service_model(hass: HomeAssistant, entry: RtVoiceConfigEntry) -> str:
    """Return the model that answers, or the agent the answers are delegated to.

    The agent by its name ("Home Assistant agent"), not its entity id: the device
    card shows the model to people.
    """
    if entry.data.get(CONF_BRAIN) != BRAIN_HA_AGENT:
        return str(entry.data.get(CONF_MODEL) or DEFAULT_MODEL)
    agent_id = str(entry.data.get(CONF_AGENT_ID) or DEFAULT_AGENT_ID)
    info = conversation.async_get_agent_info(hass, agent_id)
    name = info.name if info is not None and info.name else agent_id
    return name if name.lower().endswith("agent") else f"{name} agent"


def service_device_info(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> dr.DeviceInfo:
    """Describe the entry's service device."""
    return dr.DeviceInfo(
        identifiers={(DOMAIN, entry.entry_id)},
        name=entry.title,
        manufacturer=MANUFACTURER,
        model=service_model(hass, entry),
        entry_type=dr.DeviceEntryType.SERVICE,
    )


class RtVoiceEntity(Entity):
    """An entity of a Realtime Voice entry, on the entry's service device.

    Nothing polls: every entity is pushed (sensors) or acts only when called (the
    conversation entity).
    """

    _attr_has_entity_name = True
    _attr_should_poll = False

    def __init__(self, hass: HomeAssistant, entry: RtVoiceConfigEntry) -> None:
        """Attach the entity to the entry's service device."""
        self._attr_device_info = service_device_info(hass, entry)
