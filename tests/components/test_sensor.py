"""The per-satellite sensors on a real Home Assistant with the loopback model.

Conversations run through the real ``SessionManager`` and kernel against the
``OpenAIPeer``; the sensors follow them through the dispatcher signal. Satellites
come and go through HA's own state machine and entity registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import DOMAIN, SIGNAL_SESSION_UPDATE
from custom_components.rtvoice.entity import MANUFACTURER
from custom_components.rtvoice.kernel import ChildStats
from custom_components.rtvoice.sensor import (
    CLOSED_MEMORY,
    STATE_OPTIONS,
    SatelliteActivity,
    unique_id,
)
from homeassistant.components.sensor import (
    ATTR_OPTIONS,
    ATTR_STATE_CLASS,
    SensorDeviceClass,
    SensorStateClass,
)
from homeassistant.const import (
    ATTR_DEVICE_CLASS,
    ATTR_FRIENDLY_NAME,
    STATE_UNAVAILABLE,
    EntityCategory,
    Platform,
)
from homeassistant.core import (
    Event,
    EventStateChangedData,
    HomeAssistant,
    State,
    callback,
)
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.helpers.event import async_track_state_change_event
from tests.components.common import async_load_entry, openai_entry
from tests.components.pipeline.helpers import QUIET_SATELLITE, SATELLITE, Home, wait
from tests.peers.openai_server import OpenAIPeer, Text, WaitFor

HALL_STATE = "sensor.realtime_voice_hall_satellite_state"
HALL_ROUNDS = "sensor.realtime_voice_hall_satellite_rounds"
HALL_DROPPED = "sensor.realtime_voice_hall_satellite_dropped_inputs"
HALL_SUPPRESSED = "sensor.realtime_voice_hall_satellite_suppressed_interruptions"
KITCHEN_STATE = "sensor.realtime_voice_kitchen_satellite_state"
KITCHEN_ROUNDS = "sensor.realtime_voice_kitchen_satellite_rounds"
KITCHEN_SUPPRESSED = "sensor.realtime_voice_kitchen_satellite_suppressed_interruptions"
KEYS = ("state", "rounds", "dropped_inputs", "suppressed_cancels")


def _entry(home: Home, peer: OpenAIPeer) -> MockConfigEntry:
    home.entry = openai_entry(home.hass, peer)
    return home.entry


async def _setup(home: Home, entry: MockConfigEntry) -> None:
    await async_load_entry(home.hass, entry)


@pytest.fixture
async def entry(home: Home, openai_peer: OpenAIPeer) -> MockConfigEntry:
    """Set up a Realtime Voice entry whose model is the peer."""
    entry = _entry(home, openai_peer)
    await _setup(home, entry)
    return entry


async def wait_state(
    hass: HomeAssistant, entity_id: str, predicate: Callable[[State], bool]
) -> State:
    """Wait until the state of ``entity_id`` satisfies ``predicate``."""
    found: asyncio.Future[State] = hass.loop.create_future()

    @callback
    def changed(event: Event[EventStateChangedData]) -> None:
        new = event.data["new_state"]
        if new is not None and predicate(new) and not found.done():
            found.set_result(new)

    unsub = async_track_state_change_event(hass, [entity_id], changed)
    try:
        if (state := hass.states.get(entity_id)) is not None and predicate(state):
            return state
        return await wait(found)
    finally:
        unsub()


def value(hass: HomeAssistant, entity_id: str) -> str:
    """Return the state string of an entity (which must exist)."""
    state = hass.states.get(entity_id)
    assert state is not None, entity_id
    return state.state


def is_(expected: str) -> Callable[[State], bool]:
    """Predicate: the state equals ``expected``."""
    return lambda state: state.state == expected


def child_stats(conversation_id: str, state: str, **counts: int) -> ChildStats:
    """Return the kernel's counters of a conversation (those not given are 0)."""
    fields = {
        "rounds": 0,
        "last_seq": 0,
        "dropped": 0,
        "pending": False,
        "suppressed_cancels": 0,
        "interrupted_rounds": 0,
        "superseded_rounds": 0,
        "tool_calls": 0,
        **counts,
    }
    return ChildStats(id=conversation_id, state=state, **fields)


def send_update(
    hass: HomeAssistant,
    entry: MockConfigEntry,
    satellite: str | None,
    *,
    conversation_id: str,
    state: str,
    **counts: int,
) -> None:
    """Send a session update as the SessionManager does."""
    async_dispatcher_send(
        hass,
        SIGNAL_SESSION_UPDATE.format(entry.entry_id),
        satellite,
        child_stats(conversation_id, state, **counts),
    )


async def test_sensors_of_every_satellite(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry
) -> None:
    """Each satellite gets a state sensor and three diagnostic counters."""
    ent_reg = er.async_get(hass)
    dev_reg = dr.async_get(hass)
    service_device = dev_reg.async_get_device(identifiers={(DOMAIN, entry.entry_id)})
    assert service_device is not None
    assert service_device.entry_type is dr.DeviceEntryType.SERVICE
    assert service_device.manufacturer == MANUFACTURER
    assert service_device.name == entry.title

    state = hass.states.get(HALL_STATE)
    assert state is not None
    assert state.state == "idle"
    assert state.attributes[ATTR_FRIENDLY_NAME] == "Realtime Voice Hall satellite state"
    assert state.attributes[ATTR_DEVICE_CLASS] == SensorDeviceClass.ENUM
    assert state.attributes[ATTR_OPTIONS] == STATE_OPTIONS
    assert STATE_OPTIONS == ["idle", "listening", "thinking", "speaking", "tool"]
    registered = ent_reg.async_get(HALL_STATE)
    assert registered is not None
    assert registered.entity_category is None
    assert registered.translation_key == "state"
    assert registered.unique_id == unique_id(entry.entry_id, QUIET_SATELLITE, "state")
    assert registered.device_id == service_device.id

    for entity_id, name in (
        (HALL_ROUNDS, "Hall satellite rounds"),
        (HALL_DROPPED, "Hall satellite dropped inputs"),
        (HALL_SUPPRESSED, "Hall satellite suppressed interruptions"),
        (KITCHEN_ROUNDS, "Kitchen satellite rounds"),
    ):
        state = hass.states.get(entity_id)
        assert state is not None, entity_id
        assert state.state == "0"
        assert state.attributes[ATTR_STATE_CLASS] == SensorStateClass.TOTAL_INCREASING
        assert state.attributes[ATTR_FRIENDLY_NAME] == f"Realtime Voice {name}"
        registered = ent_reg.async_get(entity_id)
        assert registered is not None
        assert registered.entity_category is EntityCategory.DIAGNOSTIC
        assert registered.device_id == service_device.id
    assert value(hass, KITCHEN_STATE) == "idle"

    # The satellites' own devices stay untouched by our entry.
    satellite_entry = ent_reg.async_get(SATELLITE)
    assert satellite_entry is not None and satellite_entry.device_id is not None
    satellite_device = dev_reg.async_get(satellite_entry.device_id)
    assert satellite_device is not None
    assert entry.entry_id not in satellite_device.config_entries
    ours = er.async_entries_for_config_entry(ent_reg, entry.entry_id)
    assert len([e for e in ours if e.domain == Platform.SENSOR]) == 8


async def test_state_follows_a_round(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Idle -> listening -> thinking -> speaking -> listening -> idle, and counting."""
    model_may_answer, model_may_finish = asyncio.Event(), asyncio.Event()
    openai_peer.enqueue(
        WaitFor(model_may_answer),
        Text("Hi"),
        WaitFor(model_may_finish),
        Text(" there."),
    )
    control = home.control
    conversation_id = await control.async_start(QUIET_SATELLITE)
    await wait_state(hass, HALL_STATE, is_("listening"))

    control.send(conversation_id, "hello")
    await wait_state(hass, HALL_STATE, is_("thinking"))
    model_may_answer.set()
    await wait_state(hass, HALL_STATE, is_("speaking"))
    model_may_finish.set()
    await wait_state(hass, HALL_STATE, is_("listening"))
    assert value(hass, HALL_ROUNDS) == "1"
    assert value(hass, HALL_DROPPED) == "0"
    assert value(hass, KITCHEN_STATE) == "idle"  # other satellites are not touched
    assert value(hass, KITCHEN_ROUNDS) == "0"

    await control.async_stop(conversation_id)
    await wait_state(hass, HALL_STATE, is_("idle"))
    assert value(hass, HALL_ROUNDS) == "1"  # totals outlive the conversation

    # A second conversation adds to the totals of the first.
    second = await control.async_start(QUIET_SATELLITE)
    assert second != conversation_id
    control.send(second, "again")
    await wait_state(hass, HALL_ROUNDS, is_("2"))
    await wait_state(hass, HALL_STATE, is_("listening"))


async def test_dropped_inputs_are_counted(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """An input replaced before its round started is a dropped input."""
    never = asyncio.Event()
    openai_peer.enqueue(WaitFor(never))  # the first round hangs until cut
    openai_peer.enqueue(Text("Done."))
    control = home.control
    conversation_id = await control.async_start(QUIET_SATELLITE)
    control.send(conversation_id, "first")
    await openai_peer.wait_for_request(1)
    control.send(conversation_id, "second")  # cuts the first round
    control.send(conversation_id, "third")  # replaces "second" before it ran
    await wait_state(hass, HALL_DROPPED, is_("1"))
    await wait_state(hass, HALL_ROUNDS, is_("2"))  # "first" (cut) and "third"
    await wait_state(hass, HALL_STATE, is_("listening"))
    assert value(hass, HALL_ROUNDS) == "2"
    assert value(hass, HALL_DROPPED) == "1"
    assert value(hass, HALL_SUPPRESSED) == "0"


async def test_totals_are_robust_to_update_order(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry
) -> None:
    """Counters add up per conversation, never go back, ignore stale updates."""
    send_update(
        hass,
        entry,
        SATELLITE,
        conversation_id="c1",
        state="tool",
        rounds=3,
        suppressed_cancels=2,
    )
    assert value(hass, KITCHEN_STATE) == "tool"
    assert value(hass, KITCHEN_ROUNDS) == "3"
    assert value(hass, KITCHEN_SUPPRESSED) == "2"

    # A lower value of the same conversation (e.g. after its child was gone).
    send_update(hass, entry, SATELLITE, conversation_id="c1", state="thinking")
    assert value(hass, KITCHEN_STATE) == "thinking"
    assert value(hass, KITCHEN_ROUNDS) == "3"

    # A second conversation opens before the first one's close arrives.
    send_update(
        hass, entry, SATELLITE, conversation_id="c2", state="speaking", rounds=1
    )
    assert value(hass, KITCHEN_STATE) == "speaking"
    assert value(hass, KITCHEN_ROUNDS) == "4"
    send_update(
        hass,
        entry,
        SATELLITE,
        conversation_id="c1",
        state="closed",
        rounds=3,
        suppressed_cancels=2,
    )
    assert value(hass, KITCHEN_STATE) == "speaking"  # c2 is still open
    assert value(hass, KITCHEN_ROUNDS) == "4"
    # A late update of the closed conversation changes nothing.
    send_update(
        hass,
        entry,
        SATELLITE,
        conversation_id="c1",
        state="idle",
        rounds=9,
        suppressed_cancels=9,
    )
    assert value(hass, KITCHEN_ROUNDS) == "4"
    assert value(hass, KITCHEN_SUPPRESSED) == "2"

    send_update(hass, entry, SATELLITE, conversation_id="c2", state="idle", rounds=2)
    assert value(hass, KITCHEN_STATE) == "listening"
    send_update(hass, entry, SATELLITE, conversation_id="c2", state="closed", rounds=2)
    assert value(hass, KITCHEN_STATE) == "idle"
    assert value(hass, KITCHEN_ROUNDS) == "5"

    # Conversations without a satellite, or of satellites we do not know, are ignored.
    send_update(hass, entry, None, conversation_id="c3", state="thinking", rounds=7)
    send_update(
        hass, entry, "assist_satellite.unknown", conversation_id="c4", state="tool"
    )
    assert value(hass, KITCHEN_ROUNDS) == "5"
    assert value(hass, HALL_ROUNDS) == "0"
    assert value(hass, HALL_STATE) == "idle"


def test_activity_memory_stays_flat() -> None:
    """A satellite's thousandth conversation costs no more memory than its tenth."""
    activity = SatelliteActivity(SATELLITE)
    for number in range(1000):
        conversation_id = f"c{number}"
        activity.async_update(child_stats(conversation_id, "idle", rounds=1))
        activity.async_update(child_stats(conversation_id, "closed", rounds=1))
    assert activity.total("rounds") == 1000
    assert activity.state == "idle"
    assert activity.remembered <= CLOSED_MEMORY


async def test_satellites_come_and_go(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry
) -> None:
    """Sensors appear with a satellite and leave the registry with it."""
    ent_reg = er.async_get(hass)
    porch = "assist_satellite.porch"
    hass.states.async_set(porch, "idle", {ATTR_FRIENDLY_NAME: "Porch"})
    await hass.async_block_till_done()  # the directory syncs in a task
    porch_state = ent_reg.async_get_entity_id(
        Platform.SENSOR, DOMAIN, unique_id(entry.entry_id, porch, "state")
    )
    assert porch_state == "sensor.realtime_voice_porch_state"
    assert value(hass, porch_state) == "idle"
    assert hass.states.get(porch_state).attributes[ATTR_FRIENDLY_NAME] == (
        "Realtime Voice Porch state"
    )
    send_update(hass, entry, porch, conversation_id="p1", state="idle", rounds=1)
    assert value(hass, "sensor.realtime_voice_porch_rounds") == "1"

    hass.states.async_remove(porch)
    await hass.async_block_till_done()
    for key in KEYS:
        assert (
            ent_reg.async_get_entity_id(
                Platform.SENSOR, DOMAIN, unique_id(entry.entry_id, porch, key)
            )
            is None
        )
    assert hass.states.get(porch_state) is None
    # Updates of a satellite that is gone go nowhere.
    send_update(hass, entry, porch, conversation_id="p1", state="closed", rounds=1)

    # A registered satellite removed from the entity registry.
    ent_reg.async_remove(QUIET_SATELLITE)
    await hass.async_block_till_done()
    assert hass.states.get(QUIET_SATELLITE) is None
    assert ent_reg.async_get(HALL_STATE) is None
    assert ent_reg.async_get(HALL_ROUNDS) is None
    assert hass.states.get(HALL_STATE) is None
    assert value(hass, KITCHEN_STATE) == "idle"  # the others stay


async def test_stale_sensors_removed_at_setup(
    hass: HomeAssistant, home: Home, openai_peer: OpenAIPeer
) -> None:
    """Sensors of a satellite that vanished while the entry was unloaded are removed."""
    ent_reg = er.async_get(hass)
    entry = _entry(home, openai_peer)
    gone = ent_reg.async_get_or_create(
        Platform.SENSOR,
        DOMAIN,
        unique_id(entry.entry_id, "assist_satellite.gone", "rounds"),
        config_entry=entry,
        suggested_object_id="gone_rounds",
    )
    kept = ent_reg.async_get_or_create(
        Platform.SENSOR,
        DOMAIN,
        unique_id(entry.entry_id, SATELLITE, "rounds"),
        config_entry=entry,
        suggested_object_id="kitchen_rounds_renamed_by_user",
    )
    await _setup(home, entry)
    assert ent_reg.async_get(gone.entity_id) is None
    assert ent_reg.async_get(kept.entity_id) is not None
    assert value(hass, kept.entity_id) == "0"


async def test_sensor_platform_set_up_during_a_conversation(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry
) -> None:
    """A conversation that already runs is shown at once, not at its next update."""
    assert await hass.config_entries.async_unload_platforms(entry, [Platform.SENSOR])
    assert value(hass, HALL_STATE) == STATE_UNAVAILABLE
    await home.control.async_start(QUIET_SATELLITE)
    await hass.config_entries.async_forward_entry_setups(entry, [Platform.SENSOR])
    await hass.async_block_till_done()
    assert value(hass, HALL_STATE) == "listening"
    assert value(hass, KITCHEN_STATE) == "idle"


async def test_unload_leaves_sensors_unavailable(
    hass: HomeAssistant, home: Home, entry: MockConfigEntry
) -> None:
    """Unloading the entry ends every update; the sensors become unavailable."""
    assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()
    assert value(hass, HALL_STATE) == STATE_UNAVAILABLE
    assert value(hass, KITCHEN_ROUNDS) == STATE_UNAVAILABLE
    send_update(hass, entry, SATELLITE, conversation_id="x", state="thinking", rounds=1)
    assert value(hass, KITCHEN_ROUNDS) == STATE_UNAVAILABLE
