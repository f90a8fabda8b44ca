"""Tests of the SatelliteDirectory on a real Home Assistant.

A real ``assist_satellite`` entity (a small ``AssistSatelliteEntity`` subclass served by
a test integration's platform) sits on a device in the area Kitchen on the floor
Ground floor; demo lights sit in the Kitchen and the Bedroom. Registries, states,
exposure settings and pipelines are HA's own; the kernel registries are the real ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import DOMAIN
from custom_components.rtvoice.kernel import (
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Kernel,
    PromptRegistry,
    PromptSection,
)
from custom_components.rtvoice.satellites.directory import (
    NEARBY_LIMIT,
    SatelliteDirectory,
    SatelliteInfo,
    channel_names,
    clean_name,
    prompt_owner,
)
from homeassistant.components.assist_pipeline import PipelineEvent
from homeassistant.components.assist_pipeline.pipeline import (
    KEY_ASSIST_PIPELINE,
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.components.assist_satellite import AssistSatelliteEntityFeature
from homeassistant.components.homeassistant import exposed_entities
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import ConfigEntry
from homeassistant.const import EVENT_STATE_CHANGED, Platform
from homeassistant.core import HomeAssistant
from homeassistant.helpers import (
    area_registry as ar,
    device_registry as dr,
    entity_registry as er,
    floor_registry as fr,
)
from homeassistant.helpers.template import Template
from homeassistant.setup import async_setup_component
from homeassistant.util.event_type import EventType
from tests.components.common import (
    MinimalSatellite,
    async_setup_demo_entry,
    async_setup_test_integration,
    async_unload_demo_entry,
)
from tests.kernel.fakes import ScriptedProvider, Text, outcome

TEST_DOMAIN = "rtvoice_test_satellites"
FEATURES_BOTH = (
    AssistSatelliteEntityFeature.ANNOUNCE
    | AssistSatelliteEntityFeature.START_CONVERSATION
)
KITCHEN_SAT = "assist_satellite.kitchen_satellite"
PIPELINE_SELECT = "select.kitchen_satellite_pipeline"


class FakeSatellite(MinimalSatellite):
    """A minimal real assist satellite entity named after its device."""

    def __init__(
        self,
        unique_id: str,
        device_name: str,
        features: AssistSatelliteEntityFeature = AssistSatelliteEntityFeature(0),
        pipeline_entity_id: str | None = None,
    ) -> None:
        """Create the entity with its own device."""
        super().__init__(TEST_DOMAIN, unique_id, device_name, features)
        self._attr_pipeline_entity_id = pipeline_entity_id

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """Ignore pipeline events (no pipeline runs here)."""

    def set_features(self, features: AssistSatelliteEntityFeature) -> None:
        """Change the supported features and write the state."""
        self._attr_supported_features = features
        self.async_write_ha_state()


@dataclass
class Home:
    """The Home Assistant the tests run in."""

    hass: HomeAssistant
    entry: ConfigEntry
    floor: fr.FloorEntry
    kitchen: ar.AreaEntry
    bedroom: ar.AreaEntry
    satellite: FakeSatellite
    add_entities: list = field(default_factory=list)

    def add_satellites(self, *entities: FakeSatellite) -> None:
        """Add satellites to the running test platform."""
        self.add_entities[0](list(entities))

    def device_of(self, entity_id: str) -> str:
        """Device id of an entity."""
        entry = er.async_get(self.hass).async_get(entity_id)
        assert entry is not None and entry.device_id is not None
        return entry.device_id


@dataclass
class Rig:
    """A started directory with its prompt registry and recorded presence."""

    home: Home
    directory: SatelliteDirectory
    prompts: PromptRegistry
    presence: list[tuple[str, bool]]

    def info(self, entity_id: str) -> SatelliteInfo:
        """Info of a satellite the directory must know."""
        info = self.directory.info(entity_id)
        assert info is not None
        return info

    def sections(self, entity_id: str) -> dict[str, str]:
        """Sections of a satellite by name (without the owner prefix)."""
        owner = prompt_owner(entity_id)
        return {
            s.section.removeprefix(f"{owner}."): s.content
            for s in self.prompts.snapshot()
            if s.owner == owner
        }


class CountingPrompts(PromptRegistry):
    """A real PromptRegistry that records every declaration."""

    def __init__(self) -> None:
        """Create an empty registry with an empty log."""
        super().__init__()
        self.declared: list[str] = []

    def declare(self, s: PromptSection) -> None:
        """Record and declare."""
        self.declared.append(s.section)
        super().declare(s)


@pytest.fixture
async def home(hass: HomeAssistant, tmp_path: Path) -> AsyncIterator[Home]:
    """HA with a satellite in the Kitchen (Ground floor) and demo lights."""
    with patch(
        "homeassistant.components.tts._init_tts_cache_dir", return_value=str(tmp_path)
    ):
        assert await async_setup_component(hass, "homeassistant", {})
        assert await async_setup_component(hass, "assist_satellite", {})
        await hass.async_block_till_done()

    floor = fr.async_get(hass).async_create("Ground floor")
    area_reg = ar.async_get(hass)
    kitchen = area_reg.async_create("Kitchen", floor_id=floor.floor_id)
    bedroom = area_reg.async_create("Bedroom")

    # Demo lights (one device each); the demo entry sets up only its light platform.
    demo_entry = await async_setup_demo_entry(hass)
    ent_reg = er.async_get(hass)
    dev_reg = dr.async_get(hass)

    def put_device_in(entity_id: str, area_id: str) -> None:
        entry = ent_reg.async_get(entity_id)
        assert entry is not None and entry.device_id is not None
        dev_reg.async_update_device(entry.device_id, area_id=area_id)

    put_device_in("light.kitchen_lights", kitchen.id)  # inherits the device's area
    ent_reg.async_update_entity("light.ceiling_lights", area_id=kitchen.id)  # own area
    put_device_in("light.office_rgbw_lights", kitchen.id)
    async_expose_entity(hass, "conversation", "light.office_rgbw_lights", False)
    put_device_in("light.bed_light", bedroom.id)

    # The test integration serving assist satellites.
    satellite = FakeSatellite(
        "sat-kitchen", "Kitchen satellite", FEATURES_BOTH, PIPELINE_SELECT
    )
    adders: list = []

    async def platform_setup_entry(
        hass: HomeAssistant, entry: ConfigEntry, async_add_entities
    ) -> None:
        adders.append(async_add_entities)
        async_add_entities([satellite])

    entry = await async_setup_test_integration(
        hass, TEST_DOMAIN, {Platform.ASSIST_SATELLITE: platform_setup_entry}
    )
    assert hass.states.get(KITCHEN_SAT) is not None
    put_device_in(KITCHEN_SAT, kitchen.id)
    hass.states.async_set(PIPELINE_SELECT, "preferred")
    await hass.async_block_till_done()
    yield Home(hass, entry, floor, kitchen, bedroom, satellite, adders)
    await async_unload_demo_entry(hass, demo_entry)  # only what was set up


async def _start(home: Home, prompts: PromptRegistry | None = None) -> Rig:
    presence: list[tuple[str, bool]] = []
    prompts = prompts if prompts is not None else PromptRegistry()
    directory = SatelliteDirectory(home.hass, MockConfigEntry(domain=DOMAIN), prompts)
    await directory.async_start()
    directory.async_add_listener(lambda e, p: presence.append((e, p)))
    return Rig(home, directory, prompts, presence)


@pytest.fixture
async def rig(home: Home) -> AsyncIterator[Rig]:
    """Start a directory; stop it at teardown."""
    started = await _start(home)
    yield started
    started.directory.async_stop()


# --------------------------------------------------------------------------- start


async def test_channel_names() -> None:
    """The names are the contract of docs/architecture.md."""
    assert channel_names("assist_satellite.kitchen") == (
        "assist_satellite.kitchen:in",
        "assist_satellite.kitchen:out",
    )
    assert prompt_owner("assist_satellite.kitchen") == "satellite_kitchen"


async def test_start_knows_the_satellite(rig: Rig) -> None:
    """The existing satellite is known; its info comes from the registries."""
    assert rig.directory.satellites() == [KITCHEN_SAT]
    device_id = rig.home.device_of(KITCHEN_SAT)
    assert rig.directory.info(KITCHEN_SAT) == SatelliteInfo(
        entity_id=KITCHEN_SAT,
        name="Kitchen satellite",
        device_id=device_id,
        area="Kitchen",
        floor="Ground floor",
        language="en",
        features=("announce", "start_conversation"),
    )
    assert rig.directory.entity_for_device(device_id) == KITCHEN_SAT
    assert rig.directory.entity_for_device("nope") is None
    assert rig.directory.info("assist_satellite.nope") is None


async def test_kernel_child_in_satellite_scope(rig: Rig) -> None:
    """A child in the satellite's prompt scope is told the satellite's sections."""
    provider = ScriptedProvider(default=[Text("Hel"), Text("lo")])
    channels = ChannelRegistry()
    channels.register_input("c1:in", ChannelDef(realtime=True))
    channels.register_output(
        "c1:out", lambda _: None, definition=ChannelDef(realtime=True)
    )
    kernel = Kernel(provider, channels, prompts=rig.prompts)
    try:
        await kernel.spawn(
            ChildOptions(
                id="c1", input="c1:in", output="c1:out", prompt_scope=KITCHEN_SAT
            )
        )
        result = await outcome(kernel.push("c1", "hi"))
    finally:
        await kernel.stop_all()
    assert result.status == "completed"
    system = provider.calls[0].system
    assert '"Kitchen satellite"' in system
    assert "It is in the area Kitchen on floor Ground floor." in system


async def test_prompt_sections_for_scope_only(rig: Rig) -> None:
    """Name, area, floor, features and nearby render for the scope, not globally."""
    sections = rig.sections(KITCHEN_SAT)
    assert sections["identity"] == (
        'You are speaking through the voice satellite "Kitchen satellite"'
        f" ({KITCHEN_SAT})."
    )
    assert sections["location"] == "It is in the area Kitchen on floor Ground floor."
    assert sections["features"] == (
        "It can: make announcements; start a conversation by itself."
    )
    assert "en" in sections["language"]
    nearby = sections["nearby"]
    assert "Ceiling Lights (light)" in nearby
    assert "Kitchen Lights (light)" in nearby
    assert "Bed Light" not in nearby  # another area
    assert "Office RGBW Lights" not in nearby  # not exposed
    assert "Kitchen satellite" not in nearby  # not itself

    scoped = rig.prompts.render(KITCHEN_SAT)
    for text in sections.values():
        assert text in scoped
    assert rig.prompts.render() == ""
    assert rig.prompts.render("assist_satellite.other") == ""


# --------------------------------------------------------------------------- changes


async def test_added_satellite_registers(rig: Rig) -> None:
    """A satellite added later gets its sections and a presence notice."""
    rig.home.add_satellites(FakeSatellite("sat-hall", "Hall box"))
    await rig.home.hass.async_block_till_done()
    hall = "assist_satellite.hall_box"
    assert rig.directory.satellites() == [hall, KITCHEN_SAT]
    assert rig.presence == [(hall, True)]
    sections = rig.sections(hall)
    assert "features" not in sections  # no features
    assert "nearby" not in sections  # no area
    assert sections["location"].startswith("Its area is not known")


async def test_removed_satellite_unregisters(rig: Rig) -> None:
    """Removing the entity removes its sections and notifies listeners."""
    second: list[tuple[str, bool]] = []
    remove = rig.directory.async_add_listener(lambda e, p: second.append((e, p)))
    er.async_get(rig.home.hass).async_remove(KITCHEN_SAT)
    await rig.home.hass.async_block_till_done()
    assert rig.home.hass.states.get(KITCHEN_SAT) is None
    assert rig.directory.satellites() == []
    assert rig.directory.info(KITCHEN_SAT) is None
    assert rig.prompts.snapshot() == []
    assert rig.presence == [(KITCHEN_SAT, False)]
    assert second == [(KITCHEN_SAT, False)]
    remove()
    remove()  # idempotent
    rig.home.add_satellites(FakeSatellite("sat-hall", "Hall box"))
    await rig.home.hass.async_block_till_done()
    assert second == [(KITCHEN_SAT, False)]  # removed listener hears nothing
    assert rig.presence[-1] == ("assist_satellite.hall_box", True)


async def test_a_satellite_ours_replaces_is_left_out(rig: Rig) -> None:
    """A device taken over for duplex mode is one satellite: ours, not also HA's.

    HA esphome's satellite stays on the device (enabled until the repair disables
    it); listed too, it would get a second set of sensors of the same name.
    """
    hass = rig.home.hass
    ent_reg = er.async_get(hass)
    ours = ent_reg.async_get_or_create(
        "assist_satellite",
        DOMAIN,
        "duplex-kitchen",
        device_id=rig.home.device_of(KITCHEN_SAT),
        suggested_object_id="kitchen_duplex",
    )
    await hass.async_block_till_done()
    assert rig.directory.satellites() == [ours.entity_id]
    assert rig.presence == [(KITCHEN_SAT, False), (ours.entity_id, True)]
    assert rig.sections(KITCHEN_SAT) == {}

    ent_reg.async_remove(ours.entity_id)  # the satellite is given back
    await hass.async_block_till_done()
    assert rig.directory.satellites() == [KITCHEN_SAT]
    assert rig.presence[-2:] == [(ours.entity_id, False), (KITCHEN_SAT, True)]


async def test_rename_moves_everything(rig: Rig) -> None:
    """A new entity id moves the sections; listeners see removed + added."""
    pantry = "assist_satellite.pantry"
    er.async_get(rig.home.hass).async_update_entity(KITCHEN_SAT, new_entity_id=pantry)
    await rig.home.hass.async_block_till_done()
    assert rig.home.hass.states.get(pantry) is not None
    assert rig.directory.satellites() == [pantry]
    assert rig.presence == [(KITCHEN_SAT, False), (pantry, True)]
    assert {s.owner for s in rig.prompts.snapshot()} == {"satellite_pantry"}
    assert {s.scope for s in rig.prompts.snapshot()} == {pantry}
    assert f"({pantry})" in rig.sections(pantry)["identity"]
    assert rig.prompts.render(KITCHEN_SAT) == ""


async def test_device_area_change_updates_location_and_nearby(rig: Rig) -> None:
    """Moving the satellite's device to the Bedroom rewrites location and nearby."""
    hass = rig.home.hass
    dr.async_get(hass).async_update_device(
        rig.home.device_of(KITCHEN_SAT), area_id=rig.home.bedroom.id
    )
    await hass.async_block_till_done()
    sections = rig.sections(KITCHEN_SAT)
    assert sections["location"] == "It is in the area Bedroom."
    assert "Bed Light (light)" in sections["nearby"]
    assert "Kitchen Lights" not in sections["nearby"]
    assert rig.info(KITCHEN_SAT).area == "Bedroom"
    assert rig.presence == []  # still the same satellite


async def test_area_and_floor_renames_refresh(rig: Rig) -> None:
    """Area and floor registry updates reach the location section."""
    hass = rig.home.hass
    ar.async_get(hass).async_update(rig.home.kitchen.id, name="Galley")
    await hass.async_block_till_done()
    assert rig.sections(KITCHEN_SAT)["location"] == (
        "It is in the area Galley on floor Ground floor."
    )
    fr.async_get(hass).async_update(rig.home.floor.floor_id, name="Deck")
    await hass.async_block_till_done()
    assert rig.sections(KITCHEN_SAT)["location"] == (
        "It is in the area Galley on floor Deck."
    )
    assert rig.info(KITCHEN_SAT).floor == "Deck"


async def test_device_rename_updates_identity(rig: Rig) -> None:
    """The user's device name becomes the satellite's name."""
    hass = rig.home.hass
    dr.async_get(hass).async_update_device(
        rig.home.device_of(KITCHEN_SAT), name_by_user="Chef's helper"
    )
    await hass.async_block_till_done()
    assert '"Chef\'s helper"' in rig.sections(KITCHEN_SAT)["identity"]
    er.async_get(hass).async_update_entity(KITCHEN_SAT, name="Sous chef")
    await hass.async_block_till_done()
    assert '"Sous chef"' in rig.sections(KITCHEN_SAT)["identity"]


async def test_exposure_and_area_entities_refresh_nearby(rig: Rig) -> None:
    """Exposure changes and entities moving into or out of the area reach nearby."""
    hass = rig.home.hass
    async_expose_entity(hass, "conversation", "light.office_rgbw_lights", True)
    await hass.async_block_till_done()
    assert "Office RGBW Lights (light)" in rig.sections(KITCHEN_SAT)["nearby"]

    ent_reg = er.async_get(hass)
    ent_reg.async_update_entity("light.bed_light", area_id=rig.home.kitchen.id)
    await hass.async_block_till_done()
    assert "Bed Light (light)" in rig.sections(KITCHEN_SAT)["nearby"]

    ent_reg.async_update_entity("light.ceiling_lights", area_id=rig.home.bedroom.id)
    await hass.async_block_till_done()
    assert "Ceiling Lights" not in rig.sections(KITCHEN_SAT)["nearby"]

    dr.async_get(hass).async_update_device(
        rig.home.device_of("light.kitchen_lights"), area_id=rig.home.bedroom.id
    )
    await hass.async_block_till_done()
    assert "Kitchen Lights" not in rig.sections(KITCHEN_SAT)["nearby"]


async def test_nearby_is_capped(rig: Rig) -> None:
    """More than NEARBY_LIMIT exposed entities end in "and N more"."""
    hass = rig.home.hass
    ent_reg = er.async_get(hass)
    for i in range(NEARBY_LIMIT + 3):
        entry = ent_reg.async_get_or_create(
            "switch", TEST_DOMAIN, f"plug-{i}", suggested_object_id=f"plug_{i:02d}"
        )
        ent_reg.async_update_entity(entry.entity_id, area_id=rig.home.kitchen.id)
        hass.states.async_set(
            entry.entity_id, "off", {"friendly_name": f"Plug {i:02d}"}
        )
    await hass.async_block_till_done()
    nearby = rig.sections(KITCHEN_SAT)["nearby"]
    total = NEARBY_LIMIT + 3 + 2  # the plugs plus two exposed lights
    assert f", and {total - NEARBY_LIMIT} more." in nearby
    assert nearby.count("(switch)") + nearby.count("(light)") == NEARBY_LIMIT


async def test_state_only_satellite(rig: Rig) -> None:
    """A satellite without a registry entry follows its state."""
    hass = rig.home.hass
    legacy = "assist_satellite.legacy"
    hass.states.async_set(
        legacy, "idle", {"friendly_name": "Legacy box", "supported_features": 1}
    )
    await hass.async_block_till_done()
    assert rig.directory.satellites() == [KITCHEN_SAT, legacy]
    assert rig.presence == [(legacy, True)]
    assert rig.info(legacy).features == ("announce",)
    assert rig.sections(legacy)["features"] == "It can: make announcements."
    assert '"Legacy box"' in rig.sections(legacy)["identity"]

    hass.states.async_set(
        legacy, "idle", {"friendly_name": "Legacy box", "supported_features": 0}
    )
    await hass.async_block_till_done()
    assert "features" not in rig.sections(legacy)

    hass.states.async_remove(legacy)
    await hass.async_block_till_done()
    assert rig.presence == [(legacy, True), (legacy, False)]
    assert rig.directory.info(legacy) is None
    assert rig.sections(legacy) == {}


async def test_feature_change_of_entity(rig: Rig) -> None:
    """A satellite that changes its supported features updates its section."""
    rig.home.satellite.set_features(AssistSatelliteEntityFeature.ANNOUNCE)
    await rig.home.hass.async_block_till_done()
    assert rig.sections(KITCHEN_SAT)["features"] == "It can: make announcements."
    assert rig.info(KITCHEN_SAT).features == ("announce",)


async def test_language_follows_pipeline(rig: Rig) -> None:
    """The preferred pipeline's language, or the one the pipeline select picks."""
    hass = rig.home.hass
    assert "Its language is en:" in rig.sections(KITCHEN_SAT)["language"]

    preferred = async_get_pipeline(hass)
    await async_update_pipeline(hass, preferred, language="fr")
    await hass.async_block_till_done()
    assert "Its language is fr:" in rig.sections(KITCHEN_SAT)["language"]

    store = hass.data[KEY_ASSIST_PIPELINE].pipeline_store
    await store.async_create_item(
        {
            "conversation_engine": "conversation.home_assistant",
            "conversation_language": "de",
            "language": "de",
            "name": "Deutsch",
            "stt_engine": None,
            "stt_language": None,
            "tts_engine": None,
            "tts_language": None,
            "tts_voice": None,
            "wake_word_entity": None,
            "wake_word_id": None,
        }
    )
    await hass.async_block_till_done()
    assert "Its language is fr:" in rig.sections(KITCHEN_SAT)["language"]

    hass.states.async_set(PIPELINE_SELECT, "Deutsch")
    await hass.async_block_till_done()
    assert "Its language is de:" in rig.sections(KITCHEN_SAT)["language"]
    assert rig.info(KITCHEN_SAT).language == "de"

    hass.states.async_set(PIPELINE_SELECT, "No such pipeline")
    await hass.async_block_till_done()
    assert rig.info(KITCHEN_SAT).language == "fr"  # back to preferred


async def test_language_without_pipelines_is_ha_language(rig: Rig) -> None:
    """Without assist_pipeline data the language is HA's configured one."""
    hass = rig.home.hass
    data = hass.data.pop(KEY_ASSIST_PIPELINE)
    try:
        hass.config.language = "nl"
        hass.states.async_set(PIPELINE_SELECT, "Anything")
        await hass.async_block_till_done()
        assert rig.info(KITCHEN_SAT).language == "nl"
    finally:
        hass.data[KEY_ASSIST_PIPELINE] = data


# --------------------------------------------------------------------------- safety


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("{{ x }}", "x"),
        ("{% if true %}Box{% endif %}", "if true Box endif"),
        ("{# note #}Sat", "note Sat"),
        ("{{{{ nested }}}}", "nested"),
        ("{{{ odd }}}", "{ odd }"),
        ("line\nbreak\tand\x00nul", "line break and nul"),
        ("a" * 200, "a" * 79 + "…"),
    ],
)
async def test_clean_name(raw: str, clean: str) -> None:
    """Template delimiters and control characters never reach a prompt line."""
    assert clean_name(raw) == clean


async def test_template_looking_names_stay_literal(rig: Rig) -> None:
    """A device named like a template appears as harmless literal text."""
    hass = rig.home.hass
    rig.home.add_satellites(FakeSatellite("sat-evil", "{{ x }}", FEATURES_BOTH))
    await hass.async_block_till_done()
    evil = "assist_satellite.x"
    assert evil in rig.directory.satellites()
    ar.async_get(hass).async_update(rig.home.kitchen.id, name="{% raise %}Kitchen")
    dr.async_get(hass).async_update_device(
        rig.home.device_of(evil), area_id=rig.home.kitchen.id
    )
    hass.states.async_set(
        "light.kitchen_lights",
        "on",
        {"friendly_name": "{{ states('sensor.secret') }}"},
    )
    await hass.async_block_till_done()
    sections = rig.sections(evil)
    assert sections["identity"] == (
        f'You are speaking through the voice satellite "x" ({evil}).'
    )
    assert sections["location"] == (
        "It is in the area raise Kitchen on floor Ground floor."
    )
    assert "states('sensor.secret') (light)" in sections["nearby"]
    rendered = rig.prompts.render(evil)
    for marker in ("{{", "{%", "{#"):
        assert marker not in rendered
    # Even if something ran it through HA's template engine, nothing would change.
    assert Template(rendered, hass).async_render(parse_result=False) == rendered
    assert rig.info(evil).name == "{{ x }}"  # info keeps HA's name


async def test_listener_errors_are_contained(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing listener is logged and does not stop the others."""

    def broken(entity_id: str, present: bool) -> None:
        raise RuntimeError("boom")

    later: list[tuple[str, bool]] = []
    rig.directory.async_add_listener(broken)
    rig.directory.async_add_listener(lambda e, p: later.append((e, p)))
    rig.home.add_satellites(FakeSatellite("sat-hall", "Hall box"))
    await rig.home.hass.async_block_till_done()
    assert later == [("assist_satellite.hall_box", True)]
    assert "Satellite listener failed" in caplog.text


async def test_changes_in_one_iteration_coalesce(home: Home) -> None:
    """Several registry updates in one loop iteration give one refresh."""
    prompts = CountingPrompts()
    rig = await _start(home, prompts)
    try:
        prompts.declared.clear()
        hass = home.hass
        with patch.object(
            exposed_entities,
            "async_should_expose",
            wraps=exposed_entities.async_should_expose,
        ) as should_expose:
            ar.async_get(hass).async_update(home.kitchen.id, name="Galley")
            fr.async_get(hass).async_update(home.floor.floor_id, name="Deck")
            er.async_get(hass).async_update_entity(
                "light.kitchen_lights", name="Counter light"
            )
            await hass.async_block_till_done()
        # One sync: each entity of the Kitchen was looked at exactly once.
        asked = [c.args[2] for c in should_expose.call_args_list]
        assert sorted(asked) == sorted(set(asked))
        assert "light.kitchen_lights" in asked
        owner = prompt_owner(KITCHEN_SAT)
        assert sorted(prompts.declared) == [f"{owner}.location", f"{owner}.nearby"]
        assert rig.sections(KITCHEN_SAT)["location"] == (
            "It is in the area Galley on floor Deck."
        )
        assert "Counter light (light)" in rig.sections(KITCHEN_SAT)["nearby"]
        # Unrelated changes (another area, a satellite's state) cause no sync at all.
        prompts.declared.clear()
        with patch.object(
            exposed_entities,
            "async_should_expose",
            wraps=exposed_entities.async_should_expose,
        ) as should_expose:
            ar.async_get(hass).async_update(home.bedroom.id, name="Sleep")
            er.async_get(hass).async_update_entity("light.bed_light", name="Lamp")
            kitchen_state = hass.states.get(KITCHEN_SAT)
            assert kitchen_state is not None
            attributes = dict(kitchen_state.attributes)
            hass.states.async_set(KITCHEN_SAT, "listening", attributes)
            await hass.async_block_till_done()
        assert should_expose.call_count == 0
        assert prompts.declared == []
    finally:
        rig.directory.async_stop()


def _listener_counts(
    hass: HomeAssistant, events: Iterable[EventType[Any]]
) -> dict[EventType[Any], int]:
    counts = hass.bus.async_listeners()
    return {e: counts.get(e, 0) for e in events}


async def test_stop_removes_everything(home: Home) -> None:
    """After stop: no channel, no section, no listener; later updates change nothing."""
    hass = home.hass
    events: list[EventType[Any]] = [
        er.EVENT_ENTITY_REGISTRY_UPDATED,
        dr.EVENT_DEVICE_REGISTRY_UPDATED,
        ar.EVENT_AREA_REGISTRY_UPDATED,
        fr.EVENT_FLOOR_REGISTRY_UPDATED,
        EVENT_STATE_CHANGED,
    ]
    before = _listener_counts(hass, events)
    store = hass.data[KEY_ASSIST_PIPELINE].pipeline_store
    pipeline_listeners = len(store.change_set_listeners)
    rig = await _start(home)
    assert _listener_counts(hass, events) != before
    assert len(store.change_set_listeners) == pipeline_listeners + 1
    await rig.directory.async_start()  # a second start is a no-op
    assert len(store.change_set_listeners) == pipeline_listeners + 1

    # A change is pending (scheduled, not yet run) when stop comes.
    ar.async_get(hass).async_update(home.kitchen.id, name="Galley")
    rig.directory.async_stop()

    assert rig.prompts.snapshot() == []
    assert rig.directory.satellites() == []
    assert _listener_counts(hass, events) == before
    assert len(store.change_set_listeners) == pipeline_listeners

    home.add_satellites(FakeSatellite("sat-hall", "Hall box"))
    hass.states.async_set("assist_satellite.legacy", "idle")
    dr.async_get(hass).async_update_device(
        home.device_of(KITCHEN_SAT), area_id=home.bedroom.id
    )
    await hass.async_block_till_done()
    assert rig.prompts.snapshot() == []
    assert rig.presence == []
    rig.directory.async_stop()  # stopping twice is harmless
