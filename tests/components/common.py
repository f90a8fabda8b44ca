"""Setup shared by the component tests: peer credentials, entries, the demo lights."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any
from unittest.mock import Mock, patch

from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    MockModule,
    MockPlatform,
    mock_config_flow,
    mock_integration,
    mock_platform,
)

from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_MODEL,
    DEFAULT_OPTIONS_HA_AGENT,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from custom_components.rtvoice.satellites.stored import (
    new_subentry,
    satellite_subentries,
)
from homeassistant.components.assist_satellite import (
    AssistSatelliteConfiguration,
    AssistSatelliteEntity,
    AssistSatelliteEntityFeature,
)
from homeassistant.components.homeassistant.exposed_entities import async_expose_entity
from homeassistant.config_entries import (
    SOURCE_RECONFIGURE,
    SOURCE_USER,
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigSubentryData,
)
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import area_registry as ar, entity_registry as er
from homeassistant.helpers.device_registry import DeviceInfo
from homeassistant.setup import async_setup_component
from tests.peers.openai_server import DEFAULT_MODEL, OpenAIPeer

PEER_API_KEY = "sk-peer-test-key-0123456789"
PEER_MODEL = DEFAULT_MODEL
SAFETY_TIMEOUT = 10.0  # seconds: a safety net against hangs, never a synchronisation
KITCHEN = "light.kitchen_lights"
BED = "light.bed_light"


def openai_data(peer: OpenAIPeer, **data: Any) -> dict[str, Any]:
    """Entry data of an endpoint brain on the peer; ``data`` overrides fields."""
    return {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: peer.base_url,
        CONF_API_KEY: PEER_API_KEY,
        CONF_MODEL: PEER_MODEL,
        **data,
    }


def openai_entry(
    hass: HomeAssistant,
    peer: OpenAIPeer,
    *,
    title: str = "Realtime Voice",
    entry_id: str | None = None,
    options: Mapping[str, Any] | None = None,
    esphome: Iterable[Mapping[str, Any]] = (),
    wyoming: Iterable[Mapping[str, Any]] = (),
    **data: Any,
) -> MockConfigEntry:
    """Add (not set up) an openai-brain entry for the peer.

    ``options`` override the default options, ``data`` the entry data;
    ``esphome`` and ``wyoming`` are the satellites it owns (one subentry each).
    """
    entry = MockConfigEntry(
        domain=DOMAIN,
        title=title,
        entry_id=entry_id,
        data=openai_data(peer, **data),
        options={**DEFAULT_OPTIONS_OPENAI, **(options or {})},
        subentries_data=[
            *(satellite_subentry(SUBENTRY_ESPHOME, conf) for conf in esphome),
            *(satellite_subentry(SUBENTRY_WYOMING, conf) for conf in wyoming),
        ],
    )
    entry.add_to_hass(hass)
    return entry


def agent_entry(
    hass: HomeAssistant, agent_id: str | None = None, *, title: str = "Realtime Voice"
) -> MockConfigEntry:
    """Add (not set up) an ha_agent-brain entry (no agent id: the built-in agent)."""
    data: dict[str, Any] = {CONF_BRAIN: BRAIN_HA_AGENT}
    if agent_id is not None:
        data[CONF_AGENT_ID] = agent_id
    entry = MockConfigEntry(
        domain=DOMAIN,
        title=title,
        data=data,
        options=dict(DEFAULT_OPTIONS_HA_AGENT),
    )
    entry.add_to_hass(hass)
    return entry


async def async_load_entry(
    hass: HomeAssistant, entry: MockConfigEntry
) -> MockConfigEntry:
    """Set up an added entry through HA and check that it loaded."""
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    assert entry.state is ConfigEntryState.LOADED
    return entry


def demo_lights_only() -> AbstractContextManager[Any]:
    """Limit the demo integration to its light platform.

    The only mock around the demo lights (as HA core's own demo light tests do);
    otherwise the demo integration sets up ~30 other platforms.
    """
    return patch(
        "homeassistant.components.demo.COMPONENTS_WITH_CONFIG_ENTRY_DEMO_PLATFORM",
        [Platform.LIGHT],
    )


async def async_setup_demo_entry(hass: HomeAssistant) -> MockConfigEntry:
    """Set up the demo lights from a config entry (one device each)."""
    demo_entry = MockConfigEntry(domain="demo")
    demo_entry.add_to_hass(hass)
    with demo_lights_only():
        assert await hass.config_entries.async_setup(demo_entry.entry_id)
        await hass.async_block_till_done()
    return demo_entry


async def async_unload_demo_entry(hass: HomeAssistant, demo_entry: ConfigEntry) -> None:
    """Unload the demo lights (with the platforms they were set up with)."""
    with demo_lights_only():
        assert await hass.config_entries.async_unload(demo_entry.entry_id)


async def async_setup_demo_lights(
    hass: HomeAssistant, kitchen_area: str | None = None
) -> None:
    """Set up Assist and the demo lights; expose Kitchen Lights, hide Bed Light.

    With ``kitchen_area``, Kitchen Lights is put into a new area of that name.
    """
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "intent", {})
    assert await async_setup_component(hass, "conversation", {})
    with demo_lights_only():
        assert await async_setup_component(hass, "demo", {})
        await hass.async_block_till_done()
    assert hass.states.get(KITCHEN) is not None
    if kitchen_area is not None:
        area = ar.async_get(hass).async_create(kitchen_area)
        er.async_get(hass).async_update_entity(KITCHEN, area_id=area.id)
    async_expose_entity(hass, "conversation", KITCHEN, True)
    async_expose_entity(hass, "conversation", BED, False)


class MinimalSatellite(AssistSatelliteEntity):
    """A minimal real assist satellite entity on its own device, without wake words."""

    _attr_has_entity_name = True
    _attr_name = None

    def __init__(
        self,
        domain: str,
        unique_id: str,
        device_name: str,
        features: AssistSatelliteEntityFeature,
    ) -> None:
        """Create the entity with its own device (identified in ``domain``)."""
        self._attr_unique_id = unique_id
        self._attr_device_info = DeviceInfo(
            identifiers={(domain, unique_id)}, name=device_name
        )
        self._attr_supported_features = features

    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        """Return a configuration without wake words."""
        return AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=1
        )

    async def async_set_configuration(
        self, config: AssistSatelliteConfiguration
    ) -> None:
        """Accept any configuration."""


async def async_setup_test_integration(
    hass: HomeAssistant,
    domain: str,
    platforms: Mapping[Platform, Callable[..., Any]],
) -> MockConfigEntry:
    """Set up a test integration serving entities, with one config entry.

    ``platforms`` maps each platform to its ``async_setup_entry``.
    """

    async def setup_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
        await hass.config_entries.async_forward_entry_setups(entry, list(platforms))
        return True

    async def unload_entry(hass: HomeAssistant, entry: ConfigEntry) -> bool:
        return await hass.config_entries.async_unload_platforms(entry, list(platforms))

    mock_integration(
        hass,
        MockModule(
            domain, async_setup_entry=setup_entry, async_unload_entry=unload_entry
        ),
    )
    for platform, platform_setup in platforms.items():
        mock_platform(
            hass, f"{domain}.{platform}", MockPlatform(async_setup_entry=platform_setup)
        )
    mock_platform(hass, f"{domain}.config_flow", Mock())
    entry = MockConfigEntry(domain=domain)
    entry.add_to_hass(hass)
    with mock_config_flow(domain, ConfigFlow):
        assert await hass.config_entries.async_setup(entry.entry_id)
        await hass.async_block_till_done()
    return entry


async def open_settings(hass: HomeAssistant, entry: ConfigEntry) -> Any:
    """Open an entry's options flow: the settings form (satellites are subentries)."""
    form = await hass.config_entries.options.async_init(entry.entry_id)
    assert form["step_id"] == "init" and form["type"] == "form", form
    return form


# --------------------------------------------------------------------------- satellites


def satellite_subentry(kind: str, conf: Mapping[str, Any]) -> ConfigSubentryData:
    """Return the stored form of a satellite's subentry, as a flow creates it."""
    subentry = new_subentry(kind, conf)
    return ConfigSubentryData(
        data=subentry.data,
        subentry_type=kind,
        title=subentry.title,
        unique_id=subentry.unique_id,
    )


def stored_satellites(entry: ConfigEntry, kind: str) -> list[dict[str, Any]]:
    """Return the data of the entry's satellite subentries of one kind."""
    return [dict(s.data) for s in satellite_subentries(entry, kind)]


async def start_satellite_flow(
    hass: HomeAssistant, entry: ConfigEntry, kind: str
) -> dict[str, Any]:
    """Press "Add … satellite" on the entry: the subentry flow's first result."""
    return dict(
        await hass.config_entries.subentries.async_init(
            (entry.entry_id, kind), context={"source": SOURCE_USER}
        )
    )


async def add_esphome_satellite(
    hass: HomeAssistant, entry: ConfigEntry, user_input: Mapping[str, Any]
) -> dict[str, Any]:
    """Add an ESPHome satellite by its address (the menu's first choice, if shown)."""
    result = await start_satellite_flow(hass, entry, SUBENTRY_ESPHOME)
    if result["type"] is FlowResultType.MENU:
        result = dict(
            await hass.config_entries.subentries.async_configure(
                result["flow_id"], {"next_step_id": "connect"}
            )
        )
    assert result["type"] is FlowResultType.FORM and result["step_id"] == "connect"
    return dict(
        await hass.config_entries.subentries.async_configure(
            result["flow_id"], dict(user_input)
        )
    )


async def reconfigure_satellite(
    hass: HomeAssistant, entry: ConfigEntry, kind: str, index: int = 0
) -> dict[str, Any]:
    """Press "Reconfigure" on the entry's satellite ``index`` of one kind."""
    subentry = satellite_subentries(entry, kind)[index]
    return dict(
        await hass.config_entries.subentries.async_init(
            (entry.entry_id, kind),
            context={
                "source": SOURCE_RECONFIGURE,
                "subentry_id": subentry.subentry_id,
            },
        )
    )
