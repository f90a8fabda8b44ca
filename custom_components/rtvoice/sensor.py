"""Per-satellite conversation state and counters.

For every satellite of the entry's ``SatelliteDirectory`` there is a state sensor
(idle / listening / thinking / speaking / tool) and three diagnostic counters
(rounds, dropped inputs, suppressed interruptions) that add up every conversation
the satellite had since the entry was set up.

Where the entities live: on the entry's own service device (the device of the
conversation entity), with the satellite's name in the entity name. A satellite's
device belongs to another integration (ESPHome, Wyoming, VoIP …). Attaching our
entities to it needs a device info with that device's identifiers, which adds our
config entry to the foreign device: Home Assistant deprecated that in 2025.7 and
stops supporting it in 2026.8 (devices are meant to have one config entry), and the
replacement (setting ``Entity.device_entry``) does not exist in 2025.4. It would
also keep a removed satellite's device alive as long as our entry references it.
The service device works on every version.

Updates come from the ``SessionManager`` (dispatcher signal ``SIGNAL_SESSION_UPDATE``
of the entry); one ``SatelliteActivity`` per satellite folds them into the state and
the running totals, so an entity enabled later still shows the totals of the
runtime. Nothing polls. Sensors appear and disappear with their satellite; those of
a satellite that is gone are removed from the entity registry.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
import logging
from typing import Final

from homeassistant.components.sensor import (
    DOMAIN as SENSOR_DOMAIN,
    SensorDeviceClass,
    SensorEntity,
    SensorEntityDescription,
    SensorStateClass,
)
from homeassistant.const import EntityCategory
from homeassistant.core import CALLBACK_TYPE, HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .const import DOMAIN, SIGNAL_SESSION_UPDATE, STATE_CLOSED
from .entity import RtVoiceEntity
from .kernel import ChildState, ChildStats
from .runtime import RtVoiceConfigEntry
from .satellites.directory import SatelliteDirectory

_LOGGER = logging.getLogger(__name__)

# Entities only read memory; Home Assistant need not serialise their updates.
PARALLEL_UPDATES = 0

STATE_IDLE: Final = "idle"  # no conversation on the satellite
STATE_LISTENING: Final = "listening"  # a conversation waits for the user
STATE_OPTIONS: Final = [
    STATE_IDLE,
    STATE_LISTENING,
    ChildState.THINKING.value,
    ChildState.SPEAKING.value,
    ChildState.TOOL.value,
]

# Kernel child state (ChildStats.state) -> sensor state.
_STATE_MAP: Final = {
    STATE_CLOSED: STATE_IDLE,
    ChildState.IDLE.value: STATE_LISTENING,
    ChildState.THINKING.value: ChildState.THINKING.value,
    ChildState.SPEAKING.value: ChildState.SPEAKING.value,
    ChildState.TOOL.value: ChildState.TOOL.value,
}


@dataclass(frozen=True, kw_only=True)
class RtVoiceCounterDescription(SensorEntityDescription):
    """A counter of a satellite's conversations and where the kernel's stats hold it."""

    value_fn: Callable[[ChildStats], int]


STATE_DESCRIPTION: Final = SensorEntityDescription(
    key="state",
    translation_key="state",
    device_class=SensorDeviceClass.ENUM,
    options=STATE_OPTIONS,
)

COUNTERS: Final[tuple[RtVoiceCounterDescription, ...]] = (
    RtVoiceCounterDescription(
        key="rounds",
        translation_key="rounds",
        entity_category=EntityCategory.DIAGNOSTIC,
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda stats: stats.rounds,
    ),
    RtVoiceCounterDescription(
        key="dropped_inputs",
        translation_key="dropped_inputs",
        entity_category=EntityCategory.DIAGNOSTIC,
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda stats: stats.dropped,
    ),
    RtVoiceCounterDescription(
        key="suppressed_cancels",
        translation_key="suppressed_cancels",
        entity_category=EntityCategory.DIAGNOSTIC,
        state_class=SensorStateClass.TOTAL_INCREASING,
        value_fn=lambda stats: stats.suppressed_cancels,
    ),
)

SENSOR_KEYS: Final = (STATE_DESCRIPTION.key, *(c.key for c in COUNTERS))
# Closed conversations remembered to ignore their late updates. A conversation
# sends nothing after its closed update, so a few recent ones are plenty.
CLOSED_MEMORY: Final = 8


def unique_id(entry_id: str, satellite: str, key: str) -> str:
    """Return the unique id of a satellite's sensor."""
    return f"{entry_id}-{satellite}-{key}"


@dataclass
class _Live:
    """Latest known values of a conversation that has not closed yet."""

    state: str
    counts: dict[str, int]


class SatelliteActivity:
    """State and running totals of one satellite's conversations.

    Counters of a conversation only grow; the totals are the sum over every
    conversation of the runtime. A conversation's values are final once its closed
    update arrives; later (stale) updates of a closed conversation are ignored,
    so an update that overtakes another one never counts twice or goes backwards.
    Only the last ``CLOSED_MEMORY`` closed ids are remembered: memory stays flat
    however many conversations a satellite has.
    """

    def __init__(self, satellite: str) -> None:
        """Start with no conversation and zero totals."""
        self.satellite = satellite
        self._closed_totals = dict.fromkeys((c.key for c in COUNTERS), 0)
        self._live: dict[str, _Live] = {}  # by conversation id, least recent first
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._listeners: list[CALLBACK_TYPE] = []

    @property
    def state(self) -> str:
        """Sensor state: that of the most recently updated open conversation."""
        if not self._live:
            return STATE_IDLE
        return next(reversed(self._live.values())).state

    def total(self, key: str) -> int:
        """Total of a counter over every conversation so far."""
        return self._closed_totals[key] + sum(
            live.counts[key] for live in self._live.values()
        )

    @callback
    def async_update(self, stats: ChildStats) -> None:
        """Fold an update of one of the satellite's conversations in."""
        conversation_id = stats.id
        if conversation_id in self._closed:
            return
        live = self._live.pop(conversation_id, None)
        counts = {
            c.key: max(c.value_fn(stats), live.counts[c.key] if live else 0)
            for c in COUNTERS
        }
        if stats.state == STATE_CLOSED:
            self._closed[conversation_id] = None
            if len(self._closed) > CLOSED_MEMORY:
                self._closed.popitem(last=False)
            for key, value in counts.items():
                self._closed_totals[key] += value
        else:
            self._live[conversation_id] = _Live(
                _STATE_MAP.get(stats.state, STATE_LISTENING), counts
            )
        for listener in list(self._listeners):
            listener()

    @property
    def remembered(self) -> int:
        """How many conversations the activity holds (open, and recently closed)."""
        return len(self._live) + len(self._closed)

    @callback
    def async_add_listener(self, listener: CALLBACK_TYPE) -> CALLBACK_TYPE:
        """Call ``listener()`` after every update; returns the remover."""
        self._listeners.append(listener)

        @callback
        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add the sensors of every satellite and follow satellites coming and going."""
    runtime = entry.runtime_data
    directory = runtime.satellites
    activities: dict[str, SatelliteActivity] = {}
    ent_reg = er.async_get(hass)

    def add(satellite: str) -> None:
        info = directory.info(satellite)
        if info is None or satellite in activities:
            return
        activity = activities[satellite] = SatelliteActivity(satellite)
        if (stats := runtime.sessions.stats(satellite)) is not None:
            activity.async_update(stats)
        entities: list[RtVoiceSatelliteSensor] = [
            RtVoiceStateSensor(hass, entry, activity, info.name)
        ]
        entities += [
            RtVoiceCounterSensor(hass, entry, activity, info.name, description)
            for description in COUNTERS
        ]
        async_add_entities(entities)

    @callback
    def on_satellite(satellite: str, present: bool) -> None:
        if present:
            add(satellite)
            return
        activities.pop(satellite, None)
        for key in SENSOR_KEYS:
            if entity_id := ent_reg.async_get_entity_id(
                SENSOR_DOMAIN, DOMAIN, unique_id(entry.entry_id, satellite, key)
            ):
                ent_reg.async_remove(entity_id)

    @callback
    def on_session_update(satellite: str | None, stats: ChildStats) -> None:
        if satellite is not None and (activity := activities.get(satellite)):
            activity.async_update(stats)

    _remove_stale(ent_reg, entry, directory)
    entry.async_on_unload(directory.async_add_listener(on_satellite))
    entry.async_on_unload(
        async_dispatcher_connect(
            hass, SIGNAL_SESSION_UPDATE.format(entry.entry_id), on_session_update
        )
    )
    for satellite in directory.satellites():
        add(satellite)


def _remove_stale(
    ent_reg: er.EntityRegistry, entry: RtVoiceConfigEntry, directory: SatelliteDirectory
) -> None:
    """Remove sensors of satellites that went away while the entry was not loaded."""
    wanted = {
        unique_id(entry.entry_id, satellite, key)
        for satellite in directory.satellites()
        for key in SENSOR_KEYS
    }
    for registered in er.async_entries_for_config_entry(ent_reg, entry.entry_id):
        if registered.domain == SENSOR_DOMAIN and registered.unique_id not in wanted:
            _LOGGER.debug("Removing %s: its satellite is gone", registered.entity_id)
            ent_reg.async_remove(registered.entity_id)


class RtVoiceSatelliteSensor(RtVoiceEntity, SensorEntity):
    """A sensor of one satellite, on the entry's service device."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: RtVoiceConfigEntry,
        activity: SatelliteActivity,
        satellite_name: str,
        description: SensorEntityDescription,
    ) -> None:
        """Create the sensor ``description`` of a satellite."""
        super().__init__(hass, entry)
        self.entity_description = description
        self._activity = activity
        self._attr_unique_id = unique_id(
            entry.entry_id, activity.satellite, description.key
        )
        self._attr_translation_placeholders = {"satellite": satellite_name}

    async def async_added_to_hass(self) -> None:
        """Write the state on every update of the satellite's conversations."""
        await super().async_added_to_hass()
        self.async_on_remove(
            self._activity.async_add_listener(self.async_write_ha_state)
        )


class RtVoiceStateSensor(RtVoiceSatelliteSensor):
    """What the satellite's conversation is doing."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: RtVoiceConfigEntry,
        activity: SatelliteActivity,
        satellite_name: str,
    ) -> None:
        """Create the state sensor of a satellite."""
        super().__init__(hass, entry, activity, satellite_name, STATE_DESCRIPTION)

    @property
    def native_value(self) -> str:
        """Idle, listening, thinking, speaking or tool."""
        return self._activity.state


class RtVoiceCounterSensor(RtVoiceSatelliteSensor):
    """A running total over the satellite's conversations."""

    entity_description: RtVoiceCounterDescription

    @property
    def native_value(self) -> int:
        """The total since the entry was set up."""
        return self._activity.total(self.entity_description.key)
