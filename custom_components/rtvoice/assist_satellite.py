"""One ``assist_satellite`` entity per duplex ESPHome satellite (issue 10, preview).

The entity sits on the satellite's own device (name and MAC from its device info,
so it joins the device HA's esphome integration made for the same board), is
available while the link is connected, and its state follows the duplex session:
idle (no conversation), listening, responding (the answer plays). Announcements and
start_conversation are not offered yet (no supported features); the pipeline is
not selectable either: the preferred pipeline's STT and TTS are used.
"""

from __future__ import annotations

from homeassistant.components.assist_pipeline import PipelineEvent
from homeassistant.components.assist_satellite import (
    AssistSatelliteConfiguration,
    AssistSatelliteEntity,
    AssistSatelliteEntityFeature,
)
from homeassistant.components.assist_satellite.entity import AssistSatelliteState
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import DOMAIN
from .duplex import SessionState
from .duplex_ha import SIGNAL_DUPLEX_UPDATE, DuplexSatellites
from .runtime import RtVoiceConfigEntry
from .wyoming_ha import SIGNAL_WYOMING_UPDATE, WyomingSatellites

PARALLEL_UPDATES = 0

_STATES = {
    SessionState.LISTENING: AssistSatelliteState.LISTENING,
    SessionState.PAUSED: AssistSatelliteState.LISTENING,  # the user talks over
    SessionState.SPEAKING: AssistSatelliteState.RESPONDING,
    SessionState.RESUMING: AssistSatelliteState.RESPONDING,
}


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add an entity per stored duplex satellite."""
    duplex = entry.runtime_data.duplex
    async_add_entities(
        DuplexSatelliteEntity(entry, duplex, key) for key in duplex.configs
    )
    wyoming = entry.runtime_data.wyoming
    async_add_entities(
        WyomingSatelliteEntity(entry, wyoming, key) for key in wyoming.configs
    )


class DuplexSatelliteEntity(AssistSatelliteEntity):
    """A duplex ESPHome satellite owned by Realtime Voice."""

    _attr_has_entity_name = True
    _attr_should_poll = False
    _attr_name = None  # the device's name
    _attr_supported_features = AssistSatelliteEntityFeature(0)

    def __init__(
        self, entry: RtVoiceConfigEntry, duplex: DuplexSatellites, key: str
    ) -> None:
        """Describe the satellite from what was stored when it was added."""
        self._duplex = duplex
        self._key = key
        self._entry_id = entry.entry_id
        conf = duplex.configs[key]
        self._attr_unique_id = f"{entry.entry_id}-duplex-{key}"
        connections = set()
        if conf.get("mac"):
            connections.add((dr.CONNECTION_NETWORK_MAC, dr.format_mac(conf["mac"])))
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, f"duplex-{key}")},
            connections=connections,
            name=str(conf.get("name") or conf["host"]),
            manufacturer="ESPHome",
            model="Duplex satellite",
        )
        self._attr_available = False

    async def async_added_to_hass(self) -> None:
        """Follow the link."""
        await super().async_added_to_hass()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                SIGNAL_DUPLEX_UPDATE.format(self._entry_id, self._key),
                self._updated,
            )
        )
        self._updated()

    @callback
    def _updated(self) -> None:
        link = self._duplex.links.get(self._key)
        self._attr_available = link is not None and link.available
        state = self._duplex.states.get(self._key)
        # Writes the state (called only once the entity is added).
        self._set_state(
            _STATES.get(state, AssistSatelliteState.IDLE)
            if state is not None
            else AssistSatelliteState.IDLE
        )

    @callback
    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        """No wake word configuration yet (the device keeps its own)."""
        return AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=0
        )

    async def async_set_configuration(
        self, config: AssistSatelliteConfiguration
    ) -> None:
        """Wake word configuration is not offered yet."""
        raise NotImplementedError

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """No Assist pipeline runs through this entity (duplex sessions do not)."""


class WyomingSatelliteEntity(AssistSatelliteEntity):
    """A Wyoming satellite owned by Realtime Voice (issue 8).

    On a device of its own (the satellite's name from its ``info``); available
    while the link is connected; the state follows the duplex session: idle (no
    conversation, waiting for the wake word), listening, responding.
    """

    _attr_has_entity_name = True
    _attr_should_poll = False
    _attr_name = None  # the device's name
    _attr_supported_features = AssistSatelliteEntityFeature(0)

    def __init__(
        self, entry: RtVoiceConfigEntry, wyoming: WyomingSatellites, key: str
    ) -> None:
        """Describe the satellite from what was stored when it was added."""
        self._wyoming = wyoming
        self._key = key
        self._entry_id = entry.entry_id
        conf = wyoming.configs[key]
        self._attr_unique_id = f"{entry.entry_id}-wyoming-{key}"
        self._attr_device_info = dr.DeviceInfo(
            identifiers={(DOMAIN, f"wyoming-{key}")},
            name=str(conf.get("name") or conf["host"]),
            manufacturer="Wyoming",
            model="Wyoming satellite",
        )
        self._attr_available = False

    async def async_added_to_hass(self) -> None:
        """Follow the link."""
        await super().async_added_to_hass()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                SIGNAL_WYOMING_UPDATE.format(self._entry_id, self._key),
                self._updated,
            )
        )
        self._updated()

    @callback
    def _updated(self) -> None:
        link = self._wyoming.links.get(self._key)
        self._attr_available = link is not None and link.connected
        state = self._wyoming.states.get(self._key)
        self._set_state(
            _STATES.get(state, AssistSatelliteState.IDLE)
            if state is not None
            else AssistSatelliteState.IDLE
        )

    @callback
    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        """Offer no wake words here (they are chosen in Realtime Voice's options)."""
        return AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=0
        )

    async def async_set_configuration(
        self, config: AssistSatelliteConfiguration
    ) -> None:
        """Wake word configuration is not offered here."""
        raise NotImplementedError

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """No Assist pipeline runs through this entity (duplex sessions do not)."""
