"""Owning a duplex satellite: discovery, take-over, per-satellite settings, the repair.

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

from custom_components.rtvoice.config_flow import CONF_ENTRY_ID, CONF_SATELLITE
from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_DUPLEX_SATELLITES,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_TURN_EAGERNESS,
    DOMAIN,
)
from custom_components.rtvoice.duplex import echo
from custom_components.rtvoice.duplex_owner import ESPHOME_VOICE_KEYS, conflict_issue_id
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
from tests.components.common import async_load_entry, openai_entry
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


async def options_step(
    hass: HomeAssistant, entry: ConfigEntry, step: str
) -> dict[str, Any]:
    """Open the options menu and pick ``step``; the step's first result."""
    menu = await hass.config_entries.options.async_init(entry.entry_id)
    assert menu["type"] is FlowResultType.MENU
    assert step in menu["menu_options"], menu["menu_options"]
    return dict(
        await hass.config_entries.options.async_configure(
            menu["flow_id"], {"next_step_id": step}
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
    [satellite] = entry.options[CONF_DUPLEX_SATELLITES]
    return dict(satellite)


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
        await hass.async_block_till_done()  # the entry reloads with the satellite
        assert entry.state is ConfigEntryState.LOADED
        satellite = entity_of(hass, entry, "assist_satellite")
        assert hass.states.get(satellite) is not None
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
    assert CONF_DUPLEX_SATELLITES not in entry.options


async def test_discovery_aborts_when_owned_or_without_an_entry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """No Realtime Voice entry, or the MAC is owned already: abort before any probe."""
    async with duplex_device() as device:
        result = await discover(hass, device)
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "no_realtime_voice_entry"

        owned = {CONF_HOST: "192.0.2.1", CONF_PORT: 6053, CONF_MAC: MAC}
        openai_entry(hass, openai_peer, options={CONF_DUPLEX_SATELLITES: [owned]})
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
    assert CONF_DUPLEX_SATELLITES not in first.options
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
    """The options offer HA's esphome voice satellites; the chosen one's key is copied.

    The repair is raised while HA's entity stays enabled, and goes when the
    satellite is removed from Realtime Voice again.
    """
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with esphome_device() as device:
        esphome_entry = await add_esphome_entry(hass, device)
        form = await options_step(hass, entry, "take_over_duplex")
        assert form["type"] is FlowResultType.FORM
        result = await hass.config_entries.options.async_configure(
            form["flow_id"], {CONF_ENTRY_ID: esphome_entry.entry_id}
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

        # Owned now: the options no longer offer it, discovery aborts.
        menu = await hass.config_entries.options.async_init(entry.entry_id)
        assert "take_over_duplex" not in menu["menu_options"]
        hass.config_entries.options.async_abort(menu["flow_id"])
        assert (await discover(hass, device))["reason"] == "already_owned"

        form = await options_step(hass, entry, "remove_duplex")
        result = await hass.config_entries.options.async_configure(
            form["flow_id"], {CONF_DUPLEX_SATELLITES: [KEY]}
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY
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
        form = await options_step(hass, entry, "take_over_duplex")
        result = await hass.config_entries.options.async_configure(
            form["flow_id"], {CONF_ENTRY_ID: esphome_entry.entry_id}
        )
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "invalid_key"}
        assert CONF_DUPLEX_SATELLITES not in entry.options
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
    return openai_entry(hass, peer, options={CONF_DUPLEX_SATELLITES: satellites})


async def test_satellite_settings_are_stored_in_its_dict(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Pick a satellite, set barge-in, echo cancellation, end silence: only it changes."""
    entry = owning_entry(hass, openai_peer, "Kitchen", "Hall")
    form = await options_step(hass, entry, "configure_duplex")
    assert form["step_id"] == "configure_duplex"
    form = await hass.config_entries.options.async_configure(
        form["flow_id"], {CONF_SATELLITE: "aa:bb:cc:dd:ee:02"}
    )
    assert form["step_id"] == "duplex_settings"
    assert form["description_placeholders"] == {
        "name": "Hall (192.0.2.2)",
        "echo_cancellation": "available",
    }
    result = await hass.config_entries.options.async_configure(
        form["flow_id"],
        {
            CONF_BARGE_IN: "vad",
            CONF_ECHO_CANCELLATION: True,
            CONF_END_SILENCE: 12.0,
            CONF_TURN_EAGERNESS: "low",
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    kitchen, hall = entry.options[CONF_DUPLEX_SATELLITES]
    assert CONF_BARGE_IN not in kitchen
    assert hall[CONF_BARGE_IN] == "vad"
    assert hall[CONF_ECHO_CANCELLATION] is True
    assert hall[CONF_END_SILENCE] == 12
    assert hall[CONF_TURN_EAGERNESS] == "low"
    assert hall[CONF_MAC] == "AA:BB:CC:DD:EE:02"  # the identity is kept
    assert "prompt" in entry.options

    # Shown again with what is stored.
    form = await options_step(hass, entry, "configure_duplex")
    form = await hass.config_entries.options.async_configure(
        form["flow_id"], {CONF_SATELLITE: "aa:bb:cc:dd:ee:02"}
    )
    suggested = {
        str(key): key.description["suggested_value"]
        for key in form["data_schema"].schema
    }
    assert suggested == {
        CONF_BARGE_IN: "vad",
        CONF_ECHO_CANCELLATION: True,
        CONF_END_SILENCE: 12,
        CONF_TURN_EAGERNESS: "low",
    }


async def test_echo_cancellation_is_refused_where_it_cannot_run(
    hass: HomeAssistant, openai_peer: OpenAIPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the livekit wheel the form says why and refuses it; vad alone is allowed.

    The monkeypatch simulates a missing livekit wheel (it is installed here).
    """
    reason = "the livekit package is not installed (No module named 'livekit')"
    monkeypatch.setattr(echo, "unavailable_reason", lambda: reason)
    entry = owning_entry(hass, openai_peer, "Kitchen")
    form = await options_step(hass, entry, "configure_duplex")
    assert form["step_id"] == "duplex_settings"  # one satellite: no pick
    assert form["description_placeholders"]["echo_cancellation"] == (
        f"not available here: {reason}"
    )
    form = await hass.config_entries.options.async_configure(
        form["flow_id"],
        {CONF_BARGE_IN: "vad", CONF_ECHO_CANCELLATION: True, CONF_END_SILENCE: 8},
    )
    assert form["type"] is FlowResultType.FORM
    assert form["errors"] == {CONF_ECHO_CANCELLATION: "echo_cancellation_unavailable"}
    assert CONF_BARGE_IN not in stored(entry)

    result = await hass.config_entries.options.async_configure(
        form["flow_id"],
        {CONF_BARGE_IN: "vad", CONF_ECHO_CANCELLATION: False, CONF_END_SILENCE: 8},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert stored(entry)[CONF_BARGE_IN] == "vad"
    assert stored(entry)[CONF_ECHO_CANCELLATION] is False
