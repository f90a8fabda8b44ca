"""Every ``assist_satellite`` entity: what it is, and its prompt sections.

``SatelliteDirectory`` keeps the kernel's ``PromptRegistry`` in step with Home
Assistant (DESIGN §5.2): each satellite entity (ESPHome, Wyoming, VoIP, ours, …) has
the sections ``satellite_<object_id>.*`` scoped to its entity id (identity,
location, language, features and the exposed entities of its area). Listeners hear
when a satellite appears or goes; the session manager gives each the RT channel
pair ``<entity_id>:in`` / ``<entity_id>:out`` (``channel_names``) with its own
output handler.

It listens to the entity, device, area and floor registries, to satellite states
appearing and disappearing (satellites without a registry entry), to the satellites'
own state attributes, to the pipeline select of each satellite, to the pipeline store
and to the conversation exposure settings. Every relevant change marks the directory
dirty; one sync per loop iteration (a task started on the next iteration) then
re-reads everything and applies only the differences. Nothing polls, nothing sleeps,
and ``async_stop`` leaves no listener or task behind.

Section texts go straight into the kernel, never through HA's template engine; names
are still stripped of template delimiters and control characters defensively.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
import logging
import re
from typing import Any

from homeassistant.components.assist_pipeline.const import OPTION_PREFERRED
from homeassistant.components.assist_pipeline.pipeline import (
    KEY_ASSIST_PIPELINE,
    Pipeline,
    async_get_pipeline,
    async_get_pipelines,
)
from homeassistant.components.assist_satellite import AssistSatelliteEntityFeature
from homeassistant.components.homeassistant import exposed_entities
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import ATTR_FRIENDLY_NAME, ATTR_SUPPORTED_FEATURES
from homeassistant.core import (
    CALLBACK_TYPE,
    Event,
    EventStateChangedData,
    HomeAssistant,
    State,
    callback,
    split_entity_id,
)
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import (
    area_registry as ar,
    device_registry as dr,
    entity_registry as er,
    floor_registry as fr,
)
from homeassistant.helpers.event import (
    async_track_state_added_domain,
    async_track_state_change_event,
    async_track_state_removed_domain,
)

from ..compat import ASSISTANT
from ..const import DOMAIN
from ..kernel import ChannelDef, PromptRegistry, PromptSection

_LOGGER = logging.getLogger(__name__)

SATELLITE_DOMAIN = "assist_satellite"
# At most this many exposed entities are named in the "nearby" section.
NEARBY_LIMIT = 25
# Names longer than this are cut in prompt texts.
NAME_LIMIT = 80

# The RT channel pair of a satellite (registered by the session manager).
SATELLITE_CHANNEL = ChannelDef(realtime=True, no_memory=True)

# Section names (after "<owner>.") and their order: after the global sections.
SECTION_ORDER: dict[str, int] = {
    "identity": 100,
    "location": 101,
    "language": 102,
    "features": 103,
    "nearby": 104,
}

# What a supported feature lets the model do, as the features section says it.
FEATURE_TEXT: dict[str, str] = {
    "announce": "make announcements",
    "start_conversation": "start a conversation by itself",
}

type PresenceListener = Callable[[str, bool], None]

_TEMPLATE_MARKS = re.compile(r"\{[{%#]|[}%#]\}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_SPACES = re.compile(r"\s+")
_NOT_OWNER_CHAR = re.compile(r"[^a-z0-9_]")


def channel_names(entity_id: str) -> tuple[str, str]:
    """Input and output channel names of a satellite entity."""
    return f"{entity_id}:in", f"{entity_id}:out"


def prompt_owner(entity_id: str) -> str:
    """Owner of a satellite's prompt sections: ``satellite_<object_id>``."""
    object_id = entity_id.partition(".")[2] or entity_id
    return "satellite_" + _NOT_OWNER_CHAR.sub("_", object_id.lower())


def clean_name(name: str) -> str:
    """Make a name safe for a prompt line.

    Template delimiters (``{{ }}``, ``{% %}``, ``{# #}``) and control characters are
    removed, whitespace is collapsed and the result is cut to ``NAME_LIMIT``.
    """
    text = _CONTROL.sub(" ", name)
    while True:
        stripped = _TEMPLATE_MARKS.sub("", text)
        if stripped == text:
            break
        text = stripped
    text = _SPACES.sub(" ", text).strip()
    if len(text) > NAME_LIMIT:
        text = text[: NAME_LIMIT - 1].rstrip() + "…"
    return text


@dataclass(frozen=True)
class SatelliteInfo:
    """What the directory knows about one satellite (names as HA has them)."""

    entity_id: str
    name: str
    device_id: str | None
    area: str | None
    floor: str | None
    language: str | None
    features: tuple[str, ...]  # e.g. ("announce", "start_conversation")


@dataclass(frozen=True)
class _Record:
    """A satellite's info plus what is needed to decide whether an event matters."""

    info: SatelliteInfo
    area_id: str | None
    floor_id: str | None
    pipeline_entity_id: str | None
    area_entities: frozenset[str]  # every enabled entity of its area
    area_devices: frozenset[str]  # every device of its area
    sections: dict[str, str]  # section name -> content


class SatelliteDirectory:
    """Knows every assist satellite, declares its prompt, reports it coming and going."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        prompts: PromptRegistry,
    ) -> None:
        """Create a stopped directory; ``async_start`` fills it."""
        self.hass = hass
        self.entry = entry
        self._prompts = prompts
        self._records: dict[str, _Record] = {}
        self._listeners: list[PresenceListener] = []
        self._unsubs: list[CALLBACK_TYPE] = []
        self._state_unsub: CALLBACK_TYPE | None = None
        self._tracked: frozenset[str] = frozenset()
        self._sync_task: asyncio.Task[None] | None = None
        self._running = False

    # --- public interface ------------------------------------------------------------

    async def async_start(self) -> None:
        """Register every satellite now and follow every later change."""
        if self._running:
            return
        self._running = True
        hass = self.hass
        bus = hass.bus
        self._unsubs = [
            bus.async_listen(er.EVENT_ENTITY_REGISTRY_UPDATED, self._on_entity_event),
            bus.async_listen(dr.EVENT_DEVICE_REGISTRY_UPDATED, self._on_device_event),
            bus.async_listen(ar.EVENT_AREA_REGISTRY_UPDATED, self._on_area_event),
            bus.async_listen(fr.EVENT_FLOOR_REGISTRY_UPDATED, self._on_floor_event),
            async_track_state_added_domain(hass, SATELLITE_DOMAIN, self._on_presence),
            async_track_state_removed_domain(hass, SATELLITE_DOMAIN, self._on_presence),
        ]
        if exposed_entities.DATA_EXPOSED_ENTITIES in hass.data:
            self._unsubs.append(
                exposed_entities.async_listen_entity_updates(
                    hass, ASSISTANT, self._schedule_sync
                )
            )
        if (pipelines := hass.data.get(KEY_ASSIST_PIPELINE)) is not None:
            self._unsubs.append(
                pipelines.pipeline_store.async_add_change_set_listener(
                    self._on_pipelines_changed
                )
            )
        self._sync()

    @callback
    def async_stop(self) -> None:
        """Remove every listener, channel and prompt section of the directory."""
        self._running = False
        if self._sync_task is not None:
            self._sync_task.cancel()
            self._sync_task = None
        for unsub in self._unsubs:
            unsub()
        self._unsubs = []
        if self._state_unsub is not None:
            self._state_unsub()
            self._state_unsub = None
        self._tracked = frozenset()
        for entity_id in list(self._records):
            self._drop(entity_id)
        self._listeners.clear()

    def satellites(self) -> list[str]:
        """Entity ids of every known satellite, sorted."""
        return sorted(self._records)

    def info(self, entity_id: str) -> SatelliteInfo | None:
        """Return what is known about a satellite, or None."""
        record = self._records.get(entity_id)
        return record.info if record is not None else None

    def entity_for_device(self, device_id: str) -> str | None:
        """Return the satellite entity of a device (the first by id), or None."""
        for entity_id in sorted(self._records):
            if self._records[entity_id].info.device_id == device_id:
                return entity_id
        return None

    @callback
    def async_add_listener(self, cb: PresenceListener) -> Callable[[], None]:
        """Call ``cb(entity_id, present)`` when a satellite appears or disappears.

        A renamed satellite is reported as its old id removed, then its new id added.
        Returns a function that removes the listener.
        """
        self._listeners.append(cb)

        @callback
        def remove() -> None:
            if cb in self._listeners:
                self._listeners.remove(cb)

        return remove

    # --- change detection ----------------------------------------------------------

    @callback
    def _schedule_sync(self) -> None:
        """Coalesce every change of this loop iteration into one sync.

        The sync runs in a task started on the next iteration (not eagerly), tied to
        the config entry and cancelled by ``async_stop``; HA's
        ``async_block_till_done`` waits for it.
        """
        if self._running and self._sync_task is None:
            self._sync_task = self.entry.async_create_task(
                self.hass,
                self._async_scheduled_sync(),
                "rtvoice satellite directory sync",
                eager_start=False,
            )

    async def _async_scheduled_sync(self) -> None:
        self._sync_task = None
        if self._running:
            self._sync()

    def _area_ids(self) -> set[str]:
        return {r.area_id for r in self._records.values() if r.area_id}

    @callback
    def _on_entity_event(self, event: Event[er.EventEntityRegistryUpdatedData]) -> None:
        data = event.data
        ids = [data["entity_id"]]
        if data["action"] == "update" and "old_entity_id" in data:
            ids.append(data["old_entity_id"])
        if self._entity_matters(ids):
            self._schedule_sync()

    def _entity_matters(self, entity_ids: Iterable[str]) -> bool:
        entity_ids = list(entity_ids)
        if any(split_entity_id(e)[0] == SATELLITE_DOMAIN for e in entity_ids):
            return True
        if any(
            e in r.area_entities for r in self._records.values() for e in entity_ids
        ):
            return True
        areas = self._area_ids()
        if not areas:
            return False
        entry = er.async_get(self.hass).async_get(entity_ids[0])
        if entry is None:
            return False
        if entry.area_id is not None:
            return entry.area_id in areas
        if entry.device_id is None:
            return False
        device = dr.async_get(self.hass).async_get(entry.device_id)
        return device is not None and device.area_id in areas

    @callback
    def _on_device_event(self, event: Event[dr.EventDeviceRegistryUpdatedData]) -> None:
        data = event.data
        device_id = data["device_id"]
        records = self._records.values()
        if any(
            r.info.device_id == device_id or device_id in r.area_devices
            for r in records
        ):
            self._schedule_sync()
            return
        areas = self._area_ids()
        device = dr.async_get(self.hass).async_get(device_id)
        if (device is not None and device.area_id in areas) or (
            data["action"] == "update" and data["changes"].get("area_id") in areas
        ):
            self._schedule_sync()

    @callback
    def _on_area_event(self, event: Event[ar.EventAreaRegistryUpdatedData]) -> None:
        if event.data["area_id"] in self._area_ids():
            self._schedule_sync()

    @callback
    def _on_floor_event(self, event: Event[fr.EventFloorRegistryUpdatedData]) -> None:
        floor_id = event.data["floor_id"]
        if any(r.floor_id == floor_id for r in self._records.values()):
            self._schedule_sync()

    @callback
    def _on_presence(self, event: Event[EventStateChangedData]) -> None:
        self._schedule_sync()

    @callback
    def _on_tracked_state(self, event: Event[EventStateChangedData]) -> None:
        """Handle a state change of a satellite or of a pipeline select."""
        entity_id = event.data["entity_id"]
        if entity_id not in self._records:
            self._schedule_sync()  # a pipeline select: the language may change
            return
        old, new = event.data["old_state"], event.data["new_state"]
        if _describing_attrs(old) != _describing_attrs(new):
            self._schedule_sync()

    async def _on_pipelines_changed(self, change_set: Iterable[Any]) -> None:
        """Handle created, edited or deleted pipelines (the language may change)."""
        self._schedule_sync()

    # --- the sync ------------------------------------------------------------------

    @callback
    def _sync(self) -> None:
        """Bring channels, sections and records in line with Home Assistant."""
        present = self._discover()
        notices: list[tuple[str, bool]] = []
        for entity_id in sorted(set(self._records) - present):
            self._drop(entity_id)
            notices.append((entity_id, False))
        for entity_id in sorted(present):
            old = self._records.get(entity_id)
            record = self._build(entity_id, old)
            if old is None:
                notices.append((entity_id, True))
            self._records[entity_id] = record
        self._retrack()
        for entity_id, present_now in notices:
            for listener in list(self._listeners):
                try:
                    listener(entity_id, present_now)
                except Exception:
                    _LOGGER.exception("Satellite listener failed for %s", entity_id)

    def _discover(self) -> set[str]:
        """Satellites HA knows: enabled registry entries plus every satellite state.

        Less those a Realtime Voice satellite replaces: HA esphome's satellite of a
        device taken over for duplex mode sits on the same device as ours and is
        the same loudspeaker and microphone. Listed too, it would get a second set
        of sensors under the same name (entity ids with ``_2``) and a second prompt
        section for one device, until the repair disables it.
        """
        registry = er.async_get(self.hass)
        present = set(self.hass.states.async_entity_ids(SATELLITE_DOMAIN))
        for entry in registry.entities.values():
            if entry.domain == SATELLITE_DOMAIN and not entry.disabled:
                present.add(entry.entity_id)
        return present - _replaced(registry, present)

    def _drop(self, entity_id: str) -> None:
        """Forget a satellite: its sections and its record."""
        self._records.pop(entity_id, None)
        self._prompts.remove_owner(prompt_owner(entity_id))

    def _retrack(self) -> None:
        """Follow state changes of the satellites and of their pipeline selects."""
        wanted = frozenset(self._records) | {
            r.pipeline_entity_id
            for r in self._records.values()
            if r.pipeline_entity_id is not None
        }
        if wanted == self._tracked:
            return
        if self._state_unsub is not None:
            self._state_unsub()
            self._state_unsub = None
        self._tracked = wanted
        if wanted:
            self._state_unsub = async_track_state_change_event(
                self.hass, wanted, self._on_tracked_state
            )

    def _build(self, entity_id: str, old: _Record | None) -> _Record:
        """Read one satellite from HA and declare the sections that changed."""
        hass = self.hass
        ent_reg = er.async_get(hass)
        dev_reg = dr.async_get(hass)
        entry = ent_reg.async_get(entity_id)
        state = hass.states.get(entity_id)
        device = (
            dev_reg.async_get(entry.device_id)
            if entry is not None and entry.device_id
            else None
        )
        area_id = entry.area_id if entry is not None else None
        if area_id is None and device is not None:
            area_id = device.area_id
        area = ar.async_get(hass).async_get_area(area_id) if area_id else None
        floor = (
            fr.async_get(hass).async_get_floor(area.floor_id)
            if area is not None and area.floor_id
            else None
        )
        language, pipeline_entity_id = self._language(entity_id)
        info = SatelliteInfo(
            entity_id=entity_id,
            name=_satellite_name(entity_id, entry, device, state),
            device_id=device.id if device is not None else None,
            area=area.name if area is not None else None,
            floor=floor.name if floor is not None else None,
            language=language,
            features=_features(state),
        )
        area_entities: frozenset[str] = frozenset()
        area_devices: frozenset[str] = frozenset()
        nearby: list[str] = []
        if area is not None:
            members, devices = _area_members(ent_reg, dev_reg, area.id)
            area_entities = frozenset(e.entity_id for e in members)
            area_devices = frozenset(devices)
            nearby = self._nearby(entity_id, members)
        sections = _sections(info, nearby)
        owner = prompt_owner(entity_id)
        previous = old.sections if old is not None else {}
        for name, content in sections.items():
            if previous.get(name) != content:
                self._prompts.declare(
                    PromptSection(
                        section=f"{owner}.{name}",
                        owner=owner,
                        content=content,
                        order=SECTION_ORDER[name],
                        scope=entity_id,
                    )
                )
        for name in previous.keys() - sections.keys():
            self._prompts.remove(f"{owner}.{name}")
        return _Record(
            info=info,
            area_id=area.id if area is not None else None,
            floor_id=floor.floor_id if floor is not None else None,
            pipeline_entity_id=pipeline_entity_id,
            area_entities=area_entities,
            area_devices=area_devices,
            sections=sections,
        )

    def _language(self, entity_id: str) -> tuple[str | None, str | None]:
        """Return the language of the satellite's pipeline and its pipeline select.

        The satellite entity names a select entity that picks its pipeline; "preferred"
        (or no select) means HA's preferred pipeline. Without assist_pipeline the
        language falls back to HA's configured language.
        """
        hass = self.hass
        select_id: str | None = None
        component = hass.data.get(SATELLITE_DOMAIN)
        get_entity = getattr(component, "get_entity", None)
        if get_entity is not None:
            select_id = getattr(get_entity(entity_id), "pipeline_entity_id", None)
        language: str | None = None
        try:
            pipeline: Pipeline | None = None
            if (
                select_id is not None
                and (select := hass.states.get(select_id)) is not None
                and select.state != OPTION_PREFERRED
            ):
                pipeline = next(
                    (p for p in async_get_pipelines(hass) if p.name == select.state),
                    None,
                )
            if pipeline is None:
                pipeline = async_get_pipeline(hass)
            language = pipeline.language
        except (KeyError, HomeAssistantError):
            _LOGGER.debug("No pipeline for %s; using HA's language", entity_id)
        return language or hass.config.language or None, select_id

    def _nearby(self, entity_id: str, members: list[er.RegistryEntry]) -> list[str]:
        """'name (domain)' of every entity of the area exposed to the assistant."""
        if exposed_entities.DATA_EXPOSED_ENTITIES not in self.hass.data:
            return []
        items: list[str] = []
        for entry in members:
            if entry.entity_id == entity_id or not exposed_entities.async_should_expose(
                self.hass, ASSISTANT, entry.entity_id
            ):
                continue
            state = self.hass.states.get(entry.entity_id)
            name = (
                state.name
                if state is not None
                else entry.name or entry.original_name or entry.entity_id
            )
            if cleaned := clean_name(name):
                items.append(f"{cleaned} ({entry.domain})")
        return sorted(items, key=str.casefold)


def _area_members(
    ent_reg: er.EntityRegistry, dev_reg: dr.DeviceRegistry, area_id: str
) -> tuple[list[er.RegistryEntry], list[str]]:
    """Return an area's enabled entities (own area or their device's) and devices."""
    members = {e.entity_id: e for e in er.async_entries_for_area(ent_reg, area_id)}
    devices = [d.id for d in dr.async_entries_for_area(dev_reg, area_id)]
    for device_id in devices:
        for e in er.async_entries_for_device(ent_reg, device_id):
            if e.area_id is None:
                members.setdefault(e.entity_id, e)
    return [e for e in members.values() if not e.disabled], devices


def _replaced(registry: er.EntityRegistry, satellites: set[str]) -> set[str]:
    """Return the satellites of other integrations on a device ours drives."""
    entries = [e for s in satellites if (e := registry.async_get(s)) is not None]
    ours = {e.device_id for e in entries if e.platform == DOMAIN and e.device_id}
    return {
        e.entity_id for e in entries if e.platform != DOMAIN and e.device_id in ours
    }


def _describing_attrs(state: State | None) -> tuple[Any, Any]:
    if state is None:
        return None, None
    return (
        state.attributes.get(ATTR_FRIENDLY_NAME),
        state.attributes.get(ATTR_SUPPORTED_FEATURES),
    )


def _satellite_name(
    entity_id: str,
    entry: er.RegistryEntry | None,
    device: dr.DeviceEntry | None,
    state: State | None,
) -> str:
    """Return the user's name of the entity, else its device's, else its state's."""
    if entry is not None and entry.name:
        return entry.name
    if device is not None and (device.name_by_user or device.name):
        return device.name_by_user or device.name or entity_id
    if state is not None:
        return state.name
    if entry is not None and entry.original_name:
        return entry.original_name
    return entity_id.partition(".")[2] or entity_id


def _features(state: State | None) -> tuple[str, ...]:
    """Names of the satellite's supported features, e.g. ("announce",)."""
    if state is None:
        return ()
    try:
        value = int(state.attributes.get(ATTR_SUPPORTED_FEATURES) or 0)
    except (TypeError, ValueError):
        return ()
    return tuple(
        (flag.name or "").lower()
        for flag in AssistSatelliteEntityFeature
        if value & flag.value
    )


def _sections(info: SatelliteInfo, nearby: list[str]) -> dict[str, str]:
    """Return the prompt texts of one satellite by section name."""
    name = clean_name(info.name) or info.entity_id
    sections = {
        "identity": (
            f'You are speaking through the voice satellite "{name}" ({info.entity_id}).'
        )
    }
    area = clean_name(info.area or "")
    floor = clean_name(info.floor or "")
    if area and floor:
        sections["location"] = f"It is in the area {area} on floor {floor}."
    elif area:
        sections["location"] = f"It is in the area {area}."
    else:
        sections["location"] = (
            "Its area is not known; ask which room the user means when it matters."
        )
    if language := clean_name(info.language or ""):
        sections["language"] = (
            f"Its language is {language}: answer in it unless the user speaks"
            " another one."
        )
    if info.features:
        abilities = "; ".join(
            FEATURE_TEXT.get(f, f.replace("_", " ")) for f in info.features
        )
        sections["features"] = f"It can: {abilities}."
    if nearby:
        listed = ", ".join(nearby[:NEARBY_LIMIT])
        if len(nearby) > NEARBY_LIMIT:
            listed += f", and {len(nearby) - NEARBY_LIMIT} more"
        sections["nearby"] = (
            f"Exposed to you in the same area: {listed}. When the user does not"
            " name an area, they mean these."
        )
    return sections
