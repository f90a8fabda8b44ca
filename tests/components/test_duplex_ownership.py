"""Owning a duplex satellite: discovery, take-over, per-satellite settings, the repair.

A satellite is a config subentry of the entry: discovery adds one from the config
flow, "Add ESPHome satellite" (the subentry flow) adds or takes one over, and its
reconfigure form holds its settings.

Real peers on 127.0.0.1: the ESPHome emulator (the probes are real aioesphomeapi
clients), HA's own ``esphome`` integration where an esphome entry is needed (added
through its config flow, as ``esphome_rig`` does), HA's issue registry and repairs
flow manager. Two things are stood in for:

- the zeroconf announcement: the emulator does not speak mDNS and HA's zeroconf is
  mocked by the harness (``mock_async_zeroconf``, DESIGN §5.6), so the discovery
  flow is started with the ``ZeroconfServiceInfo`` HA would hand over (the TXT
  records ESPHome publishes: ``mac``, ``friendly_name``, ``api_encryption``);
- a missing livekit wheel: ``unavailable_reason`` is monkeypatched.
"""

from __future__ import annotations

from ipaddress import ip_address
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_TURN_EAGERNESS,
    DEFAULT_TURN_EAGERNESS,
    DOMAIN,
    SUBENTRY_ESPHOME,
)
from custom_components.rtvoice.duplex import echo
from custom_components.rtvoice.duplex_owner import ESPHOME_VOICE_KEYS, conflict_issue_id
from custom_components.rtvoice.satellites.discovery import CONF_ENTRY_ID
from custom_components.rtvoice.satellites.esphome.flow import CONF_ESPHOME_ENTRY
from homeassistant.components.repairs import repairs_flow_manager
from homeassistant.config_entries import (
    SOURCE_IGNORE,
    SOURCE_ZEROCONF,
    ConfigEntry,
    ConfigEntryState,
)
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import entity_registry as er, issue_registry as ir
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo
from homeassistant.setup import async_setup_component
from tests.components.common import (
    async_load_entry,
    openai_entry,
    reconfigure_satellite,
    start_satellite_flow,
    stored_satellites,
)
from tests.components.esphome_rig import entity_of, esphome_flow, wait
from tests.peers.esphome import ATOM_ECHO_FEATURES, EmulatedDevice, Kind
from tests.peers.esphome.config import Feature
from tests.peers.openai_server import OpenAIPeer

pytestmark = pytest.mark.usefixtures("mock_async_zeroconf", "socket_enabled")

FIRMWARE = "2026.9.0"
MAC = "AA:BB:CC:DD:EE:42"
KEY = "aa:bb:cc:dd:ee:42"  # satellite_key: the formatted MAC
WRONG_KEY = "d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3d3c="
SAFETY = 30.0


def duplex_device(**config: Any) -> EmulatedDevice:
    """Return an Atom Echo-like voice satellite on firmware 2026.9."""
    config.setdefault("name", "kitchen-duplex")
    config.setdefault("friendly_name", "Kitchen duplex")
    config.setdefault("mac_address", MAC)
    config.setdefault("esphome_version", FIRMWARE)
    config.setdefault("features", ATOM_ECHO_FEATURES)
    return EmulatedDevice(**config)


def announcement(device: EmulatedDevice) -> ZeroconfServiceInfo:
    """Return what HA's zeroconf hands the flow for ``device`` (ESPHome's TXT records)."""
    properties = {
        "mac": MAC.replace(":", "").lower(),
        "friendly_name": "Kitchen duplex",
        "version": FIRMWARE,
    }
    if device.noise_psk:
        properties["api_encryption"] = "Noise_NNpsk0_25519_ChaChaPoly_SHA256"
    return ZeroconfServiceInfo(
        ip_address=ip_address(device.host),
        ip_addresses=[ip_address(device.host)],
        port=device.port,
        hostname="kitchen-duplex.local.",
        type="_esphomelib._tcp.local.",
        name="kitchen-duplex._esphomelib._tcp.local.",
        properties=properties,
    )


async def discover(hass: HomeAssistant, device: EmulatedDevice) -> dict[str, Any]:
    """Start the zeroconf discovery flow of ``device``; its first result."""
    return dict(
        await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_ZEROCONF}, data=announcement(device)
        )
    )


async def take_over_form(hass: HomeAssistant, entry: ConfigEntry) -> dict[str, Any]:
    """Press "Add ESPHome satellite" and choose to take one over; the form."""
    menu = await start_satellite_flow(hass, entry, SUBENTRY_ESPHOME)
    assert menu["type"] is FlowResultType.MENU, menu
    assert menu["menu_options"] == ["connect", "take_over"]
    return dict(
        await hass.config_entries.subentries.async_configure(
            menu["flow_id"], {"next_step_id": "take_over"}
        )
    )


def esphome_device(**config: Any) -> EmulatedDevice:
    """Return an encrypted satellite HA 2025.4's own esphome integration can use.

    That esphome logs in, which firmware >= 2026.1 never answers: this one does.
    """
    return duplex_device(encrypted=True, answer_login=True, **config)


async def add_esphome_entry(hass: HomeAssistant, device: EmulatedDevice) -> ConfigEntry:
    """Add ``device`` through HA's own esphome flow; its assist satellite is enabled."""
    result = await esphome_flow(hass, device)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    esphome_entry: ConfigEntry = result["result"]
    await hass.async_block_till_done()
    assert esphome_entry.state is ConfigEntryState.LOADED
    await wait(device.wait_for_voice_client(), SAFETY)
    return esphome_entry


async def unload(hass: HomeAssistant, *entries: ConfigEntry) -> None:
    """Unload the loaded ones among ``entries`` (their links close)."""
    for entry in entries:
        if entry.state is ConfigEntryState.LOADED:
            assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()


def stored(entry: ConfigEntry) -> dict[str, Any]:
    """Return the one satellite ``entry`` owns."""
    [satellite] = stored_satellites(entry, SUBENTRY_ESPHOME)
    return satellite


# --------------------------------------------------------------------------- discovery


async def test_discovered_satellite_is_added_and_gets_its_entity(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A plaintext voice satellite: confirm only; stored, the entry reloads with its entity."""
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with duplex_device() as device:
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.FORM
        assert result["step_id"] == "esphome_confirm"
        assert result["data_schema"].schema == {}  # nothing to ask
        assert result["description_placeholders"] == {
            "name": "Kitchen duplex",
            "host": device.host,
        }
        result = dict(
            await hass.config_entries.flow.async_configure(result["flow_id"], {})
        )
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "duplex_added"
        assert stored(entry) == {
            CONF_HOST: device.host,
            CONF_PORT: device.port,
            CONF_NOISE_PSK: None,
            CONF_NAME: "Kitchen duplex",
            CONF_MAC: MAC,
            CONF_ESPHOME_VERSION: FIRMWARE,
        }
        [subentry] = entry.subentries.values()  # a satellite of the entry's page
        assert (subentry.title, subentry.unique_id) == ("Kitchen duplex", KEY)
        await hass.async_block_till_done()  # the entry reloads with the satellite
        assert entry.state is ConfigEntryState.LOADED
        satellite = entity_of(hass, entry, "assist_satellite")
        assert hass.states.get(satellite) is not None
        registered = er.async_get(hass).async_get(satellite)
        assert registered is not None
        assert registered.config_subentry_id == subentry.subentry_id
        await wait(device.wait_for_voice_client(), SAFETY)  # our link owns it
        await unload(hass, entry)
    assert device.voice.errors == []


async def test_discovered_device_without_voice_assistant_aborts(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """An ESPHome plug is never put in front of the user."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device(features=Feature(0)) as device:
        result = await discover(hass, device)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "not_voice_satellite"
    assert entry.subentries == {}


async def test_discovery_aborts_when_owned_or_without_an_entry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """No Realtime Voice entry, or the MAC is owned already: abort before any probe."""
    async with duplex_device() as device:
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "no_realtime_voice_entry"

        owned = {CONF_HOST: "192.0.2.1", CONF_PORT: 6053, CONF_MAC: MAC}
        openai_entry(hass, openai_peer, esphome=[owned])
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "already_owned"
    # Neither probed: the emulator saw no client.
    assert [e for e in device.events if e.kind is Kind.CONNECTED] == []


async def test_ignored_satellite_is_not_offered_again(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The flow's unique id is the MAC: "Ignore" keeps the device away."""
    openai_entry(hass, openai_peer)
    async with duplex_device() as device:
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.FORM
        hass.config_entries.flow.async_abort(result["flow_id"])
        ignored = await hass.config_entries.flow.async_init(
            DOMAIN,
            context={"source": SOURCE_IGNORE},
            data={"unique_id": KEY, "title": "Kitchen duplex"},
        )
        assert ignored["type"] is FlowResultType.CREATE_ENTRY
        result = await discover(hass, device)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"


async def test_discovered_encrypted_satellite_asks_for_its_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """No esphome entry knows the key: the confirm form asks and tests it."""
    entry = openai_entry(hass, openai_peer)
    async with duplex_device(encrypted=True) as device:
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.FORM
        assert result["step_id"] == "esphome_confirm"
        assert CONF_NOISE_PSK in result["data_schema"].schema
        result = dict(
            await hass.config_entries.flow.async_configure(
                result["flow_id"], {CONF_NOISE_PSK: WRONG_KEY}
            )
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "invalid_key"}
        result = dict(
            await hass.config_entries.flow.async_configure(
                result["flow_id"], {CONF_NOISE_PSK: device.noise_psk}
            )
        )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "duplex_added"
    assert stored(entry)[CONF_NOISE_PSK] == device.noise_psk


async def test_discovery_asks_which_entry_when_there_are_several(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Two Realtime Voice entries: the user picks the one that owns the satellite."""
    first = openai_entry(hass, openai_peer, title="First")
    second = openai_entry(hass, openai_peer, title="Second")
    async with duplex_device() as device:
        result = await discover(hass, device)
        assert CONF_ENTRY_ID in result["data_schema"].schema
        result = dict(
            await hass.config_entries.flow.async_configure(
                result["flow_id"], {CONF_ENTRY_ID: second.entry_id}
            )
        )
    assert result["reason"] == "duplex_added"
    assert result["description_placeholders"] == {
        "name": "Kitchen duplex",
        "entry": "Second",
    }
    assert first.subentries == {}
    assert stored(second)[CONF_MAC] == MAC


# --------------------------------------------------- HA's esphome entry: key, repair


async def test_discovery_uses_the_esphome_key_and_the_repair_disables_its_entity(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Encrypted, set up in HA's esphome: its key is used; the repair then fixes the clash.

    The repair appears once our entry owns the satellite while HA's esphome
    satellite entity is enabled; its fix disables that entity (by the user) and
    the issue is gone.
    """
    assert await async_setup_component(hass, "repairs", {})
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with esphome_device() as device:
        esphome_entry = await add_esphome_entry(hass, device)
        theirs = entity_of(hass, esphome_entry, "assist_satellite")
        # ESPHome's voice entities: the satellite and its three selects (the
        # assistant, finished-speaking detection, wake word; issue 17 item 3).
        voice = sorted(
            e.entity_id
            for e in er.async_entries_for_config_entry(
                er.async_get(hass), esphome_entry.entry_id
            )
            if not e.disabled and e.unique_id.rpartition("-")[2] in ESPHOME_VOICE_KEYS
        )
        assert theirs in voice
        assert sorted(e.split(".")[0] for e in voice) == [
            "assist_satellite",
            "select",
            "select",
            "select",
        ]
        issue_id = conflict_issue_id(entry.entry_id, KEY)

        result = await discover(hass, device)
        assert result["step_id"] == "esphome_confirm"
        assert result["data_schema"].schema == {}  # the key came from esphome
        result = dict(
            await hass.config_entries.flow.async_configure(result["flow_id"], {})
        )
        assert result["reason"] == "duplex_added"
        assert stored(entry)[CONF_NOISE_PSK] == device.noise_psk
        await hass.async_block_till_done()

        # Issue 17 item 3: while ESPHome's satellite is still enabled on the
        # device, the entry's sensors are there once, without "_2" ids.
        sensors = sorted(
            e.entity_id
            for e in er.async_entries_for_config_entry(
                er.async_get(hass), entry.entry_id
            )
            if e.domain == "sensor"
        )
        assert len(sensors) == 4, sensors  # state and three counters
        assert [s for s in sensors if s.endswith("_2")] == []

        issues = ir.async_get(hass)
        issue = issues.async_get_issue(DOMAIN, issue_id)
        assert issue is not None and issue.is_fixable
        assert issue.translation_placeholders is not None
        assert issue.translation_placeholders["entities"] == ", ".join(voice)

        manager = repairs_flow_manager(hass)
        assert manager is not None
        flow = await manager.async_init(DOMAIN, data={"issue_id": issue_id})
        assert flow["type"] is FlowResultType.FORM and flow["step_id"] == "confirm"
        done = await manager.async_configure(flow["flow_id"], {})
        assert done["type"] is FlowResultType.CREATE_ENTRY

        for entity_id in voice:  # one assistant choice left on the device: ours
            registry_entry = er.async_get(hass).async_get(entity_id)
            assert registry_entry is not None
            assert registry_entry.disabled_by is er.RegistryEntryDisabler.USER
        others = [
            e
            for e in er.async_entries_for_config_entry(
                er.async_get(hass), esphome_entry.entry_id
            )
            if e.entity_id not in voice
        ]
        assert all(e.disabled_by is not er.RegistryEntryDisabler.USER for e in others)
        assert issues.async_get_issue(DOMAIN, issue_id) is None
        await hass.async_block_till_done()
        assert issues.async_get_issue(DOMAIN, issue_id) is None  # not raised again
        await unload(hass, entry, esphome_entry)
    assert device.voice.errors == []


async def test_take_over_copies_the_key_and_removing_clears_the_repair(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Adding an ESPHome satellite offers HA's esphome voice satellites; key copied.

    The repair is raised while HA's entity stays enabled, and goes when the
    satellite's subentry is deleted again.
    """
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with esphome_device() as device:
        esphome_entry = await add_esphome_entry(hass, device)
        form = await take_over_form(hass, entry)
        assert form["type"] is FlowResultType.FORM
        result = await hass.config_entries.subentries.async_configure(
            form["flow_id"], {CONF_ESPHOME_ENTRY: esphome_entry.entry_id}
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        assert stored(entry) == {
            CONF_HOST: device.host,
            CONF_PORT: device.port,
            CONF_NOISE_PSK: device.noise_psk,
            CONF_NAME: "Kitchen duplex",
            CONF_MAC: MAC,
            CONF_ESPHOME_VERSION: FIRMWARE,
        }
        await hass.async_block_till_done()
        issue_id = conflict_issue_id(entry.entry_id, KEY)
        assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is not None

        # Owned now: nothing is left to take over, discovery aborts.
        form = await start_satellite_flow(hass, entry, SUBENTRY_ESPHOME)
        assert form["type"] is FlowResultType.FORM and form["step_id"] == "connect"
        hass.config_entries.subentries.async_abort(form["flow_id"])
        assert (await discover(hass, device))["reason"] == "already_owned"

        [subentry] = entry.subentries.values()
        assert hass.config_entries.async_remove_subentry(entry, subentry.subentry_id)
        await hass.async_block_till_done()
        assert ir.async_get(hass).async_get_issue(DOMAIN, issue_id) is None
        await unload(hass, entry, esphome_entry)
    assert device.voice.errors == []


async def test_take_over_reports_a_changed_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """HA's esphome entry holds a key the device no longer takes: a form error."""
    entry = openai_entry(hass, openai_peer)
    async with esphome_device() as device:
        esphome_entry = await add_esphome_entry(hass, device)
        hass.config_entries.async_update_entry(
            esphome_entry, data={**esphome_entry.data, CONF_NOISE_PSK: WRONG_KEY}
        )
        form = await take_over_form(hass, entry)
        result = await hass.config_entries.subentries.async_configure(
            form["flow_id"], {CONF_ESPHOME_ENTRY: esphome_entry.entry_id}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "invalid_key"}
        assert entry.subentries == {}
        await unload(hass, esphome_entry)


# --------------------------------------------------------------- per-satellite settings


def owning_entry(hass: HomeAssistant, peer: OpenAIPeer, *names: str) -> MockConfigEntry:
    """Return an entry (not loaded: nothing connects) owning satellites ``names``."""
    satellites = [
        {
            CONF_HOST: f"192.0.2.{number}",
            CONF_PORT: 6053,
            CONF_NOISE_PSK: None,
            CONF_NAME: name,
            CONF_MAC: f"AA:BB:CC:DD:EE:{number:02X}",
            CONF_ESPHOME_VERSION: FIRMWARE,
        }
        for number, name in enumerate(names, start=1)
    ]
    return openai_entry(hass, peer, esphome=satellites)


async def test_satellite_settings_are_stored_in_its_subentry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Reconfigure one satellite: barge-in, echo cancellation, end silence; only it changes.

    The address is unchanged, so nothing connects (the devices are not there).
    """
    entry = owning_entry(hass, openai_peer, "Kitchen", "Hall")
    options = dict(entry.options)
    form = await reconfigure_satellite(hass, entry, SUBENTRY_ESPHOME, 1)
    assert form["step_id"] == "reconfigure"
    assert form["description_placeholders"] == {
        "name": "Hall",
        "key": "none (the satellite does not use encryption)",
        "echo_cancellation": "available",
    }
    assert suggested_values(form) == {
        CONF_HOST: "192.0.2.2",
        CONF_PORT: 6053,
        CONF_BARGE_IN: "wake_word",
        CONF_ECHO_CANCELLATION: False,
        CONF_END_SILENCE: 8,
        CONF_TURN_EAGERNESS: DEFAULT_TURN_EAGERNESS,
    }
    result = await hass.config_entries.subentries.async_configure(
        form["flow_id"],
        {
            CONF_HOST: "192.0.2.2",
            CONF_PORT: 6053,
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: True,
            CONF_END_SILENCE: 12.0,
            CONF_TURN_EAGERNESS: "low",
        },
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    kitchen, hall = stored_satellites(entry, SUBENTRY_ESPHOME)
    assert CONF_BARGE_IN not in kitchen
    assert hall[CONF_BARGE_IN] == "vad"
    assert hall[CONF_ECHO_CANCELLATION] is True
    assert hall[CONF_END_SILENCE] == 12
    assert hall[CONF_TURN_EAGERNESS] == "low"
    assert hall[CONF_MAC] == "AA:BB:CC:DD:EE:02"  # the identity is kept
    assert dict(entry.options) == options  # the entry's own settings are not touched

    # Shown again with what is stored.
    form = await reconfigure_satellite(hass, entry, SUBENTRY_ESPHOME, 1)
    assert suggested_values(form) == {
        CONF_HOST: "192.0.2.2",
        CONF_PORT: 6053,
        CONF_BARGE_IN: "vad",
        CONF_ECHO_CANCELLATION: True,
        CONF_END_SILENCE: 12,
        CONF_TURN_EAGERNESS: "low",
    }


def suggested_values(form: dict[str, Any]) -> dict[str, Any]:
    """Return what a form pre-fills (its suggested values)."""
    return {
        str(key): key.description["suggested_value"]
        for key in form["data_schema"].schema
        if key.description and "suggested_value" in key.description
    }


async def test_echo_cancellation_is_refused_where_it_cannot_run(
    hass: HomeAssistant, openai_peer: OpenAIPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a canceller the form says why and refuses it; vad alone is allowed.

    The monkeypatch simulates a missing canceller (every install has one).
    """
    reason = "the livekit package is not installed (No module named 'livekit')"
    monkeypatch.setattr(echo, "unavailable_reason", lambda: reason)
    entry = owning_entry(hass, openai_peer, "Kitchen")
    form = await reconfigure_satellite(hass, entry, SUBENTRY_ESPHOME)
    assert form["step_id"] == "reconfigure"
    assert form["description_placeholders"]["echo_cancellation"] == (
        f"not available here: {reason}"
    )
    address = {CONF_HOST: "192.0.2.1", CONF_PORT: 6053}
    form = await hass.config_entries.subentries.async_configure(
        form["flow_id"],
        {
            **address,
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: True,
            CONF_END_SILENCE: 8,
        },
    )
    assert form["type"] is FlowResultType.FORM
    assert form["errors"] == {CONF_ECHO_CANCELLATION: "echo_cancellation_unavailable"}
    assert CONF_BARGE_IN not in stored(entry)

    result = await hass.config_entries.subentries.async_configure(
        form["flow_id"],
        {
            **address,
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: False,
            CONF_END_SILENCE: 8,
        },
    )
    assert result["type"] is FlowResultType.ABORT
    assert stored(entry)[CONF_BARGE_IN] == "vad"
    assert stored(entry)[CONF_ECHO_CANCELLATION] is False


# ------------------------------------------------------------- reconfigure: a new address


async def test_reconfigure_tests_a_new_address_on_the_same_device(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A new address is probed with the stored key and must reach the same MAC.

    Another device there (another MAC) or a wrong key typed: a form error and
    nothing stored. The right device: stored, its key kept (never shown).
    """
    async with (
        duplex_device(encrypted=True) as device,
        duplex_device(encrypted=True, mac_address="AA:BB:CC:DD:EE:43") as other,
    ):
        old = {
            CONF_HOST: "192.0.2.1",
            CONF_PORT: 6053,
            CONF_NOISE_PSK: device.noise_psk,
            CONF_NAME: "Kitchen duplex",
            CONF_MAC: MAC,
            CONF_ESPHOME_VERSION: FIRMWARE,
        }
        entry = openai_entry(hass, openai_peer, esphome=[old])
        settings = {CONF_BARGE_IN: "wake_word", CONF_ECHO_CANCELLATION: False}
        settings[CONF_END_SILENCE] = 8

        async def submit(**user_input: Any) -> dict[str, Any]:
            form = await reconfigure_satellite(hass, entry, SUBENTRY_ESPHOME)
            return dict(
                await hass.config_entries.subentries.async_configure(
                    form["flow_id"], {**settings, **user_input}
                )
            )

        result = await submit(
            **{
                CONF_HOST: other.host,
                CONF_PORT: other.port,
                CONF_NOISE_PSK: other.noise_psk,
            }
        )
        assert result["errors"] == {"base": "another_device"}
        result = await submit(
            **{
                CONF_HOST: device.host,
                CONF_PORT: device.port,
                CONF_NOISE_PSK: WRONG_KEY,
            }
        )
        assert result["errors"] == {"base": "invalid_key"}
        assert stored(entry) == old

        result = await submit(**{CONF_HOST: device.host, CONF_PORT: device.port})
        assert result["reason"] == "reconfigure_successful", result
        assert stored(entry) == {
            **old,
            CONF_HOST: device.host,
            CONF_PORT: device.port,
            **settings,
            CONF_TURN_EAGERNESS: DEFAULT_TURN_EAGERNESS,
        }
        [subentry] = entry.subentries.values()
        assert subentry.unique_id == KEY


async def test_reconfigure_drops_a_key_the_device_no_longer_uses(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The stored key is refused as unneeded (the device dropped encryption): it goes.

    Only when the key field was left empty: a typed key is the user's to fix.
    """
    async with duplex_device() as device:  # plaintext now
        old = {
            CONF_HOST: "192.0.2.1",
            CONF_PORT: 6053,
            CONF_NOISE_PSK: WRONG_KEY,
            CONF_NAME: "Kitchen duplex",
            CONF_MAC: MAC,
            CONF_ESPHOME_VERSION: FIRMWARE,
        }
        entry = openai_entry(hass, openai_peer, esphome=[old])
        address = {CONF_HOST: device.host, CONF_PORT: device.port}
        form = await reconfigure_satellite(hass, entry, SUBENTRY_ESPHOME)
        assert form["description_placeholders"]["key"] == (
            "one is stored, an empty field keeps it"
        )
        result = await hass.config_entries.subentries.async_configure(
            form["flow_id"], {**address, CONF_NOISE_PSK: WRONG_KEY}
        )
        assert result["errors"] == {"base": "encryption_not_offered"}
        result = await hass.config_entries.subentries.async_configure(
            form["flow_id"], address
        )
    assert result["reason"] == "reconfigure_successful"
    assert stored(entry)[CONF_NOISE_PSK] is None
    assert stored(entry)[CONF_PORT] == device.port
