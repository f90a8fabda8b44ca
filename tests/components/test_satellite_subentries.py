"""Satellites as config subentries, driven as the entry's page drives them (issue 17).

Each duplex satellite (ESPHome, Wyoming) is a config subentry of its Realtime Voice
entry. What the frontend uses is what these tests use: the entry's description
(``config_entries/get_single``: its subentry types, with reconfigure), the subentry
flow endpoints over HA's HTTP API (``/api/config/config_entries/subentries/flow``:
"Add ESPHome satellite", "Reconfigure") and the websocket commands
``config_entries/subentries/list`` and ``config_entries/subentries/delete``. The
satellites are real peers on 127.0.0.1 (the ESPHome emulator, a wyoming-satellite);
an entry of an older version proves that its stored satellites move into subentries
with their devices and entities and keep working.
"""

from __future__ import annotations

import json
from pathlib import Path
import re
import socket
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
from pytest_homeassistant_custom_component.typing import (
    ClientSessionGenerator,
    WebSocketGenerator,
)

from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_DUPLEX_SATELLITES,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_WAKE_WORD,
    CONF_WYOMING_SATELLITES,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from custom_components.rtvoice.duplex import BargeIn
from homeassistant.config_entries import ConfigEntry, ConfigEntryState
from homeassistant.const import CONF_HOST, CONF_PORT, STATE_UNAVAILABLE
from homeassistant.core import HomeAssistant
from homeassistant.helpers import device_registry as dr, entity_registry as er
from homeassistant.setup import async_setup_component
from tests.components.common import (
    async_load_entry,
    openai_data,
    openai_entry,
    reconfigure_satellite,
    start_satellite_flow,
    stored_satellites,
)
from tests.components.esphome_rig import wait
from tests.components.test_duplex_satellite import duplex_device, wait_for_state
from tests.components.test_wyoming_satellite import (
    SATELLITE_NAME,
    sat_python,  # noqa: F401 - a fixture
    satellite_rig,
    the_link,
)
from tests.peers.openai_server import OpenAIPeer

pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY = 30.0
MAC = "AA:BB:CC:DD:EE:42"  # duplex_device's
KEY = "aa:bb:cc:dd:ee:42"  # its satellite key: the formatted MAC
FLOW = "/api/config/config_entries/subentries/flow"
TRANSLATIONS = json.loads(
    (
        Path(__file__).parents[2]
        / "custom_components"
        / "rtvoice"
        / "translations"
        / "en.json"
    ).read_text(encoding="utf-8")
)


def assert_translated(result: dict[str, Any], kind: str) -> None:
    """Fail unless the frontend finds every text of ``result`` in en.json."""
    strings = TRANSLATIONS["config_subentries"][kind]
    if result["type"] == "abort":
        assert result["reason"] in strings["abort"]
        return
    if result["type"] == "create_entry":
        return
    step = strings["step"][result["step_id"]]
    assert step["title"] and step["description"]
    placeholders = result.get("description_placeholders") or {}
    needed = set(re.findall(r"{(\w+)}", step["title"] + step["description"]))
    assert needed <= set(placeholders), result["step_id"]
    if result["type"] == "menu":
        assert set(step["menu_options"]) == set(result["menu_options"])
        return
    for field in result["data_schema"]:
        assert field["name"] in step["data"], field["name"]
        assert field["name"] in step["data_description"], field["name"]
    for error in (result.get("errors") or {}).values():
        assert error in strings["error"]


def free_port() -> int:
    """Return a port of 127.0.0.1 where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Page:
    """The entry's page: HTTP flows and websocket commands, as the frontend sends them."""

    def __init__(self, http: Any, ws: Any, entry: ConfigEntry) -> None:
        """Talk to HA as the frontend does for ``entry``."""
        self.http = http
        self.ws = ws
        self.entry = entry

    async def command(self, kind: str, **data: Any) -> Any:
        """Send one websocket command; its result (it must succeed)."""
        await self.ws.send_json_auto_id({"type": kind, **data})
        answer = await self.ws.receive_json()
        assert answer["success"], answer
        return answer["result"]

    async def subentries(self) -> list[dict[str, Any]]:
        """Return the satellites listed on the page."""
        return list(
            await self.command(
                "config_entries/subentries/list", entry_id=self.entry.entry_id
            )
        )

    async def delete(self, subentry_id: str) -> None:
        """Press "Delete" on a satellite."""
        await self.command(
            "config_entries/subentries/delete",
            entry_id=self.entry.entry_id,
            subentry_id=subentry_id,
        )

    async def start(self, kind: str, subentry_id: str | None = None) -> dict[str, Any]:
        """Press "Add …" (or "Reconfigure" on ``subentry_id``); the first result."""
        body: dict[str, Any] = {"handler": [self.entry.entry_id, kind]}
        if subentry_id is not None:
            body["subentry_id"] = subentry_id
        response = await self.http.post(FLOW, json=body)
        assert response.status == 200, await response.text()
        result = dict(await response.json())
        assert_translated(result, kind)
        return result

    async def submit(
        self, result: dict[str, Any], kind: str, user_input: dict[str, Any]
    ) -> dict[str, Any]:
        """Submit a form of the flow; the next result."""
        response = await self.http.post(f"{FLOW}/{result['flow_id']}", json=user_input)
        assert response.status == 200, await response.text()
        result = dict(await response.json())
        assert_translated(result, kind)
        return result


async def open_page(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    hass_ws_client: WebSocketGenerator,
    entry: ConfigEntry,
) -> Page:
    """Serve HA's config API and open the entry's page.

    Every component with views is set up before the server starts (a started
    aiohttp app takes no new routes).
    """
    for component in ("websocket_api", "config"):
        assert await async_setup_component(hass, component, {})
    http = await hass_client()
    return Page(http, await hass_ws_client(hass), entry)


def satellite_registry(
    hass: HomeAssistant, entry: ConfigEntry, identifier: str
) -> tuple[dr.DeviceEntry | None, list[er.RegistryEntry]]:
    """Return the satellite's device (by our identifier) and the entry's entities on it."""
    device = dr.async_get(hass).async_get_device(identifiers={(DOMAIN, identifier)})
    if device is None:
        return None, []
    entities = [
        e
        for e in er.async_entries_for_device(
            er.async_get(hass), device.id, include_disabled_entities=True
        )
        if e.config_entry_id == entry.entry_id
    ]
    return device, entities


async def test_an_esphome_satellite_is_added_reconfigured_and_deleted_on_the_page(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    hass_ws_client: WebSocketGenerator,
    openai_peer: OpenAIPeer,
) -> None:
    """Add (connection tested), list, reconfigure (barge-in), delete: as a user does.

    The satellite's device and its entities belong to its subentry; deleting the
    subentry removes them and the entry runs on without it.
    """
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    page = await open_page(hass, hass_client, hass_ws_client, entry)
    described = await page.command("config_entries/get_single", entry_id=entry.entry_id)
    assert described["config_entry"]["supported_subentry_types"] == {
        SUBENTRY_ESPHOME: {"supports_reconfigure": True},
        SUBENTRY_WYOMING: {"supports_reconfigure": True},
    }
    assert TRANSLATIONS["config_subentries"][SUBENTRY_ESPHOME]["initiate_flow"] == {
        "user": "Add ESPHome satellite",
        "reconfigure": "Reconfigure ESPHome satellite",
    }
    async with duplex_device(encrypted=True) as device:
        form = await page.start(SUBENTRY_ESPHOME)
        assert (form["type"], form["step_id"]) == ("form", "connect")  # no menu:
        # HA's esphome has no satellite to take over.
        address = {CONF_HOST: device.host, CONF_PORT: device.port}
        result = await page.submit(
            form, SUBENTRY_ESPHOME, {**address, CONF_NOISE_PSK: device.noise_psk}
        )
        assert result["type"] == "create_entry", result
        assert result["title"] == "Kitchen duplex"
        await hass.async_block_till_done()  # the entry reloads with the satellite
        assert entry.state is ConfigEntryState.LOADED
        await wait(device.wait_for_voice_client(), SAFETY)

        [listed] = await page.subentries()
        assert {k: listed[k] for k in ("subentry_type", "title", "unique_id")} == {
            "subentry_type": SUBENTRY_ESPHOME,
            "title": "Kitchen duplex",
            "unique_id": KEY,
        }
        subentry_id = listed["subentry_id"]
        satellite_device, entities = satellite_registry(hass, entry, f"duplex-{KEY}")
        assert satellite_device is not None
        assert satellite_device.config_entries_subentries == {
            entry.entry_id: {subentry_id}
        }
        assert sorted(e.domain for e in entities) == ["assist_satellite", "select"]
        assert {e.config_subentry_id for e in entities} == {subentry_id}
        [satellite] = [e.entity_id for e in entities if e.domain == "assist_satellite"]
        assert await wait_for_state(hass, satellite, {"idle"}) == "idle"

        # The same device cannot be added twice (to this or another entry).
        form = await page.start(SUBENTRY_ESPHOME)
        again = await page.submit(
            form, SUBENTRY_ESPHOME, {**address, CONF_NOISE_PSK: device.noise_psk}
        )
        assert (again["type"], again["reason"]) == ("abort", "already_owned")
        assert again["description_placeholders"] == {"entry": entry.title}

        # Reconfigure: the settings; the address unchanged and the key left empty.
        form = await page.start(SUBENTRY_ESPHOME, subentry_id)
        assert form["step_id"] == "reconfigure"
        shown = {
            field["name"]: field["description"]["suggested_value"]
            for field in form["data_schema"]
            if "suggested_value" in (field.get("description") or {})
        }
        assert shown[CONF_HOST] == device.host
        assert CONF_NOISE_PSK not in shown  # the stored key never goes to the page
        result = await page.submit(
            form, SUBENTRY_ESPHOME, {**shown, CONF_BARGE_IN: BargeIn.OFF.value}
        )
        assert (result["type"], result["reason"]) == (
            "abort",
            "reconfigure_successful",
        )
        await hass.async_block_till_done()  # the entry reloads with it
        [stored] = stored_satellites(entry, SUBENTRY_ESPHOME)
        assert stored[CONF_BARGE_IN] == "off"
        assert stored[CONF_NOISE_PSK] == device.noise_psk  # kept
        [binding] = entry.runtime_data.duplex.bindings.values()
        assert binding.options.barge_in is BargeIn.OFF

        await page.delete(subentry_id)
        await hass.async_block_till_done()  # the entry reloads without it
        assert await page.subentries() == []
        assert satellite_registry(hass, entry, f"duplex-{KEY}") == (None, [])
        assert er.async_get(hass).async_get(satellite) is None
        assert entry.state is ConfigEntryState.LOADED
        assert entry.runtime_data.duplex.links == {}
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
    assert device.voice.errors == []


async def test_a_wyoming_satellite_keeps_its_device_at_a_new_address(
    hass: HomeAssistant,
    hass_client: ClientSessionGenerator,
    hass_ws_client: WebSocketGenerator,
    openai_peer: OpenAIPeer,
    sat_python: str,  # noqa: F811 - the fixture
) -> None:
    """Reconfigured to where the satellite now is: tested, and nothing is lost.

    The satellite was stored at an address where nothing answers (it moved); the
    new address is probed, and its entity keeps its id, its device its id (with
    the user's name for it), both under the new address's key.
    """
    old_port = free_port()
    entry = openai_entry(
        hass,
        openai_peer,
        wyoming=[
            {
                CONF_HOST: "127.0.0.1",
                CONF_PORT: old_port,
                CONF_NAME: "Hall",
                CONF_WAKE_WORD: "satellite",
            }
        ],
    )
    await async_load_entry(hass, entry)
    page = await open_page(hass, hass_client, hass_ws_client, entry)
    [listed] = await page.subentries()
    old_device, old_entities = satellite_registry(
        hass, entry, f"wyoming-127.0.0.1:{old_port}"
    )
    assert old_device is not None
    dr.async_get(hass).async_update_device(old_device.id, name_by_user="Hall speaker")
    entity_ids = sorted(e.entity_id for e in old_entities)
    async with satellite_rig(sat_python) as satellite:
        form = await page.start(SUBENTRY_WYOMING, listed["subentry_id"])
        assert form["step_id"] == "reconfigure"
        result = await page.submit(
            form,
            SUBENTRY_WYOMING,
            {
                CONF_HOST: satellite.host,
                CONF_PORT: satellite.port,
                CONF_WAKE_WORD: "satellite",
                CONF_BARGE_IN: "wake_word",
                "echo_cancellation": False,
                "end_silence": 8,
            },
        )
        assert result["reason"] == "reconfigure_successful", result
        await hass.async_block_till_done()  # the entry reloads with it
        new_key = f"{satellite.host}:{satellite.port}"
        [listed] = await page.subentries()
        assert (listed["unique_id"], listed["title"]) == (new_key, SATELLITE_NAME)
        device, entities = satellite_registry(hass, entry, f"wyoming-{new_key}")
        assert device is not None and device.id == old_device.id
        assert device.name_by_user == "Hall speaker"
        assert sorted(e.entity_id for e in entities) == entity_ids
        new_id = f"{entry.entry_id}-wyoming-{new_key}"
        assert sorted(e.unique_id for e in entities) == [new_id, f"{new_id}-pipeline"]
        assert {e.config_subentry_id for e in entities} == {listed["subentry_id"]}
        await wait(the_link(entry).wait_connected(), SAFETY)
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()


async def test_an_older_entry_moves_its_satellites_into_subentries(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Entry 1.2 (satellites in the options) → 1.3: each a subentry, nothing lost.

    The ESPHome satellite's device (shared with HA's esphome, as a taken-over
    one is) and its entities, with what the user set on them, move to the
    satellite's subentry under the same ids; the satellite connects and its
    entity works. A satellite stored twice is kept once. Deleting the
    subentry then removes our entities and leaves esphome's device to esphome.
    """
    wyoming_conf = {
        CONF_HOST: "127.0.0.1",
        CONF_PORT: free_port(),
        CONF_NAME: "Hall",
        CONF_WAKE_WORD: "satellite",
    }
    async with duplex_device() as device:
        esphome_conf = {
            CONF_HOST: device.host,
            CONF_PORT: device.port,
            CONF_NOISE_PSK: None,
            CONF_NAME: "Kitchen duplex",
            CONF_MAC: MAC,
            CONF_ESPHOME_VERSION: "2026.9.0",
            CONF_BARGE_IN: "off",
        }
        entry = MockConfigEntry(
            domain=DOMAIN,
            title="Realtime Voice",
            data=openai_data(openai_peer),
            options={
                **DEFAULT_OPTIONS_OPENAI,
                CONF_DUPLEX_SATELLITES: [esphome_conf],
                CONF_WYOMING_SATELLITES: [wyoming_conf, dict(wyoming_conf)],
            },
            version=1,
            minor_version=2,
        )
        entry.add_to_hass(hass)
        esphome = MockConfigEntry(domain="esphome", unique_id=KEY)
        esphome.add_to_hass(hass)
        # What version 1.2 left in the registries, with the user's changes.
        dev_reg, ent_reg = dr.async_get(hass), er.async_get(hass)
        shared = dev_reg.async_get_or_create(
            config_entry_id=esphome.entry_id,
            connections={(dr.CONNECTION_NETWORK_MAC, KEY)},
            name="kitchen-duplex",
        )
        kitchen = dev_reg.async_get_or_create(
            config_entry_id=entry.entry_id,
            identifiers={(DOMAIN, f"duplex-{KEY}")},
            connections={(dr.CONNECTION_NETWORK_MAC, KEY)},
        )
        assert kitchen.id == shared.id
        dev_reg.async_update_device(kitchen.id, name_by_user="Kitchen speaker")
        old_ids = {}
        for domain, suffix in (("assist_satellite", ""), ("select", "-pipeline")):
            registered = ent_reg.async_get_or_create(
                domain,
                DOMAIN,
                f"{entry.entry_id}-duplex-{KEY}{suffix}",
                config_entry=entry,
                device_id=kitchen.id,
                suggested_object_id=f"kitchen_{domain}",
            )
            ent_reg.async_update_entity(registered.entity_id, name=f"My {domain}")
            old_ids[domain] = registered.entity_id

        await async_load_entry(hass, entry)

        assert (entry.version, entry.minor_version) == (1, 3)
        assert CONF_DUPLEX_SATELLITES not in entry.options
        assert CONF_WYOMING_SATELLITES not in entry.options
        assert entry.options["prompt"] == DEFAULT_OPTIONS_OPENAI["prompt"]
        assert stored_satellites(entry, SUBENTRY_ESPHOME) == [esphome_conf]
        assert stored_satellites(entry, SUBENTRY_WYOMING) == [wyoming_conf]
        subentries = {s.subentry_type: s for s in entry.subentries.values()}
        assert subentries[SUBENTRY_ESPHOME].unique_id == KEY
        assert subentries[SUBENTRY_ESPHOME].title == "Kitchen duplex"
        assert subentries[SUBENTRY_WYOMING].unique_id == (
            f"127.0.0.1:{wyoming_conf[CONF_PORT]}"
        )
        subentry_id = subentries[SUBENTRY_ESPHOME].subentry_id

        moved = dev_reg.async_get(kitchen.id)
        assert moved is not None
        assert moved.name_by_user == "Kitchen speaker"
        assert moved.config_entries_subentries == {
            esphome.entry_id: {None},
            entry.entry_id: {subentry_id},
        }
        _, on_device = satellite_registry(hass, entry, f"duplex-{KEY}")
        assert sorted(e.entity_id for e in on_device) == sorted(old_ids.values())
        for domain, entity_id in old_ids.items():
            registered = ent_reg.async_get(entity_id)
            assert registered is not None, domain
            assert registered.config_subentry_id == subentry_id
            assert registered.name == f"My {domain}"
        wyoming_device, wyoming_entities = satellite_registry(
            hass, entry, f"wyoming-127.0.0.1:{wyoming_conf[CONF_PORT]}"
        )
        assert wyoming_device is not None
        assert {e.config_subentry_id for e in wyoming_entities} == {
            subentries[SUBENTRY_WYOMING].subentry_id
        }

        # The satellite works as before: connected, its stored setting applied.
        await wait(device.wait_for_voice_client(), SAFETY)
        satellite = old_ids["assist_satellite"]
        assert await wait_for_state(hass, satellite, {"idle"}) == "idle"
        [binding] = entry.runtime_data.duplex.bindings.values()
        assert binding.options.barge_in is BargeIn.OFF

        assert hass.config_entries.async_remove_subentry(entry, subentry_id)
        await hass.async_block_till_done()  # the entry reloads without it
        assert ent_reg.async_get(satellite) is None
        left = dev_reg.async_get(kitchen.id)
        assert left is not None  # esphome's device stays, without us
        assert left.config_entries == {esphome.entry_id}
        assert entry.runtime_data.duplex.links == {}
        state = hass.states.get(satellite)
        assert state is None or state.state == STATE_UNAVAILABLE
        assert await hass.config_entries.async_unload(entry.entry_id)
        await hass.async_block_till_done()
    assert device.voice.errors == []


async def test_a_wyoming_satellite_is_owned_by_one_entry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Its address is taken: adding it anywhere, or moving another one there, is refused.

    Refused before anything connects (nothing listens at these addresses).
    """
    hall = {CONF_HOST: "127.0.0.1", CONF_PORT: free_port(), CONF_NAME: "Hall"}
    attic = {CONF_HOST: "127.0.0.1", CONF_PORT: free_port(), CONF_NAME: "Attic"}
    first = openai_entry(hass, openai_peer, title="First", wyoming=[hall])
    second = openai_entry(hass, openai_peer, title="Second", wyoming=[attic])

    form = await start_satellite_flow(hass, second, SUBENTRY_WYOMING)
    result = await hass.config_entries.subentries.async_configure(
        form["flow_id"], {CONF_HOST: hall[CONF_HOST], CONF_PORT: hall[CONF_PORT]}
    )
    assert (result["type"], result["reason"]) == ("abort", "already_owned")
    assert result["description_placeholders"] == {"entry": "First"}

    form = await reconfigure_satellite(hass, second, SUBENTRY_WYOMING)
    result = await hass.config_entries.subentries.async_configure(
        form["flow_id"],
        {
            CONF_HOST: hall[CONF_HOST],
            CONF_PORT: hall[CONF_PORT],
            CONF_WAKE_WORD: "satellite",
            CONF_BARGE_IN: "wake_word",
            "echo_cancellation": False,
            "end_silence": 8,
        },
    )
    assert result["errors"] == {"base": "already_owned"}
    assert stored_satellites(second, SUBENTRY_WYOMING) == [attic]
    assert stored_satellites(first, SUBENTRY_WYOMING) == [hall]
