"""Satellites found on the network: the config flow's zeroconf steps.

ESPHome (``_esphomelib._tcp``) and Wyoming (``_wyoming._tcp``) devices announce
themselves; only voice satellites that no Realtime Voice entry owns reach the user,
who confirms (and picks the entry when there are several). The satellite is then
added to that entry as a config subentry, as "Add satellite" on the entry's page
would add it (``stored.new_subentry``).

Why a config flow and not a subentry flow: Home Assistant's zeroconf matching
starts a config flow of the integration (a discovery belongs to no entry yet), and
the frontend shows only config flows as "Discovered"; a subentry flow of 2025.4
can create its subentry only from the user source (``ConfigSubentryFlow.
async_create_entry`` refuses any other). So the discovery stays here and ends by
adding the subentry to the chosen entry itself
(``hass.config_entries.async_add_subentry``, the call HA makes when a subentry
flow finishes), then aborts with a message naming the entry. The flow's unique id
(the MAC; the Wyoming service name) makes "Ignore" stick to the device.
"""

from __future__ import annotations

from dataclasses import dataclass
import functools
import re
from typing import Any, Final

from aioesphomeapi import DeviceInfo
import voluptuous as vol

from homeassistant.config_entries import (
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
)
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import callback
from homeassistant.helpers.device_registry import format_mac
from homeassistant.helpers.selector import (
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
)
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo

from ..const import (
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_WAKE_WORD,
    DEFAULT_ESPHOME_PORT,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from ..device_text import device_text, id_text, markdown_text
from ..duplex_ha import ProbeError, async_probe_satellite
from ..duplex_owner import esphome_entry_for, owner_of, rtvoice_entries, satellite_conf
from ..flow_fields import PASSWORD_SELECTOR
from ..wyoming_ha import (
    DEFAULT_WAKE_WORD,
    WyomingProbeError,
    async_probe_gate,
    async_probe_wyoming,
    wyoming_key,
)
from .form import wake_word_selector
from .stored import new_subentry, owner_of_key

ESPHOME_ZEROCONF_TYPE: Final = "_esphomelib._tcp.local."
WYOMING_ZEROCONF_TYPE: Final = "_wyoming._tcp.local."
CONF_ENTRY_ID: Final = "entry_id"  # the Realtime Voice entry a satellite joins
# Probe reasons whose config-flow error key differs from the subentry flow's
# (the config flow's cannot_connect is about the model endpoint).
_DISCOVERY_ERRORS: Final = {"cannot_connect": "satellite_cannot_connect"}
_MAC: Final = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")  # format_mac's output


@dataclass
class _Discovered:
    """An ESPHome device found by zeroconf, until the user confirms it."""

    mac: str
    name: str
    host: str
    port: int
    key: str | None = None  # encryption key (HA's esphome entry's, or the user's)
    info: DeviceInfo | None = None  # set once the probe passed
    error: str | None = None  # why the probe did not pass (form error)


def _entry_choice(entries: list[ConfigEntry]) -> dict[vol.Marker, Any]:
    """Return the field choosing which Realtime Voice entry gets a discovered satellite.

    Empty with a single entry: that one gets it.
    """
    if len(entries) < 2:
        return {}
    choices = [SelectOptionDict(value=e.entry_id, label=e.title) for e in entries]
    return {
        vol.Required(CONF_ENTRY_ID, default=entries[0].entry_id): SelectSelector(
            SelectSelectorConfig(options=choices, mode=SelectSelectorMode.DROPDOWN)
        )
    }


class SatelliteDiscoveryFlow(ConfigFlow):
    """The zeroconf steps of Realtime Voice's config flow (not registered itself)."""

    _esphome: _Discovered | None = None

    async def async_step_zeroconf(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Dispatch a zeroconf discovery on its service type."""
        if discovery_info.type == ESPHOME_ZEROCONF_TYPE:
            return await self._async_discovered_esphome(discovery_info)
        if discovery_info.type == WYOMING_ZEROCONF_TYPE:
            return await self._async_discovered_wyoming(discovery_info)
        return self.async_abort(reason="not_supported")

    async def _async_discovered_esphome(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Offer an ESPHome device to a Realtime Voice entry, if it is a voice satellite.

        Every ESPHome device announces itself; only voice satellites reach the
        user. A plaintext device (or one whose key HA's ``esphome`` entry holds) is
        probed now; for an encrypted device without a known key the confirm form
        asks for it and the probe runs then. The flow's unique id is the MAC, so
        "Ignore" sticks to the device.
        """
        properties = discovery_info.properties
        raw_mac = str(properties.get("mac") or "")[:32]
        mac = format_mac(raw_mac)
        if not _MAC.fullmatch(mac):
            return self.async_abort(reason="mdns_missing_mac")
        await self.async_set_unique_id(mac)
        self._abort_if_unique_id_configured()  # the user ignored this device
        if not rtvoice_entries(self.hass):
            return self.async_abort(reason="no_realtime_voice_entry")
        if owner_of(self.hass, mac) is not None:
            return self.async_abort(reason="already_owned")
        name = device_text(
            properties.get("friendly_name")
            or str(discovery_info.hostname).removesuffix(".local.")
        ) or str(mac)
        self.context["title_placeholders"] = {"name": name}
        found = self._esphome = _Discovered(
            mac=mac,
            name=name,
            host=discovery_info.host,
            port=discovery_info.port or DEFAULT_ESPHOME_PORT,
        )
        if properties.get("api_encryption"):
            esphome = esphome_entry_for(self.hass, mac)
            found.key = (esphome.data.get(CONF_NOISE_PSK) or None) if esphome else None
            if found.key is None:
                return await self.async_step_esphome_confirm()  # asks for the key
        try:
            found.info = await async_probe_satellite(
                self.hass, found.host, found.port, found.key
            )
        except ProbeError as err:
            if err.reason in ("not_voice_satellite", "cannot_connect"):
                return self.async_abort(reason=err.reason)
            # The key (HA's, or none) does not fit: the user enters it.
            found.key, found.error = None, err.reason
        return await self.async_step_esphome_confirm()

    async def async_step_esphome_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Confirm a discovered satellite (its key, which entry when several)."""
        found = self._esphome
        assert found is not None
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        errors: dict[str, str] = {}
        if found.error is not None and user_input is None:
            errors["base"] = _DISCOVERY_ERRORS.get(found.error, found.error)
        if user_input is not None:
            if owner_of(self.hass, found.mac) is not None:
                return self.async_abort(reason="already_owned")  # added meanwhile
            chosen = user_input.get(CONF_ENTRY_ID, entries[0].entry_id)
            entry = next((e for e in entries if e.entry_id == chosen), None)
            if entry is None:
                errors[CONF_ENTRY_ID] = "entry_not_found"
            elif found.info is None:
                key = str(user_input.get(CONF_NOISE_PSK) or "").strip() or None
                try:
                    found.info = await async_probe_satellite(
                        self.hass, found.host, found.port, key
                    )
                except ProbeError as err:
                    if err.reason == "not_voice_satellite":
                        return self.async_abort(reason=err.reason)
                    errors["base"] = _DISCOVERY_ERRORS.get(err.reason, err.reason)
                else:
                    found.key = key
            if entry is not None and found.info is not None and not errors:
                satellite = satellite_conf(
                    found.host, found.port, found.key, found.info
                )
                return self._async_add_satellite(
                    entry,
                    SUBENTRY_ESPHOME,
                    satellite,
                    "duplex_added",
                    {"name": markdown_text(satellite[CONF_NAME]), "entry": entry.title},
                )
        schema = _entry_choice(entries)
        if found.info is None:
            schema[vol.Optional(CONF_NOISE_PSK)] = PASSWORD_SELECTOR
        if not schema:
            self._set_confirm_only()
        return self.async_show_form(
            step_id="esphome_confirm",
            data_schema=vol.Schema(schema),
            errors=errors,
            description_placeholders={
                "name": markdown_text(found.name),
                "host": markdown_text(found.host),
            },
        )

    @callback
    def _async_add_satellite(
        self,
        entry: ConfigEntry,
        kind: str,
        satellite: dict[str, Any],
        reason: str,
        placeholders: dict[str, str],
    ) -> ConfigFlowResult:
        """Add ``satellite`` to ``entry`` as a subentry, reload it, end the flow.

        What a finished "Add satellite" flow does (see the module's docstring
        for why a discovery cannot be one). A loaded entry's update listener
        reloads it (a new satellite needs a reload); an entry that is not loaded
        (a failed setup) gets a reload scheduled here.
        """
        self.hass.config_entries.async_add_subentry(
            entry, new_subentry(kind, satellite)
        )
        if entry.state is not ConfigEntryState.LOADED:
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        return self.async_abort(reason=reason, description_placeholders=placeholders)

    # -- zeroconf: Wyoming satellites --------------------------------------------------

    async def _async_discovered_wyoming(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Offer a discovered ``_wyoming._tcp`` service when it is a satellite.

        STT, TTS and wake word servers advertise the same type: they are left to
        HA's wyoming integration. The unique id (zeroconf name + satellite name,
        as HA's wyoming integration builds it) makes Ignore stick.
        """
        host, port = str(discovery_info.host), int(discovery_info.port or 0)
        try:
            info = await async_probe_gate(self.hass).probe(
                (f"{host}:{port}", f"name:{id_text(discovery_info.name, 255)}"),
                functools.partial(async_probe_wyoming, host, port),
            )
        except WyomingProbeError as err:
            return self.async_abort(reason=err.reason)
        assert info.satellite is not None
        name = info.satellite.name  # cleaned and cut (wyoming_proto)
        await self.async_set_unique_id(
            f"wyoming:{id_text(discovery_info.name)}_{id_text(name)}"
        )
        self._abort_if_unique_id_configured()
        satellite = {CONF_HOST: host, CONF_PORT: port}
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        if owner_of_key(self.hass, SUBENTRY_WYOMING, wyoming_key(satellite)):
            return self.async_abort(reason="already_configured")
        self._wyoming_discovered = {**satellite, CONF_NAME: name}
        self.context["title_placeholders"] = {"name": name}
        return await self.async_step_wyoming_confirm()

    async def async_step_wyoming_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Confirm a discovered satellite: add it to an entry, which reloads."""
        satellite = self._wyoming_discovered
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        if user_input is not None:
            entry_id = user_input.get(CONF_ENTRY_ID, entries[0].entry_id)
            entry = next((e for e in entries if e.entry_id == entry_id), entries[0])
            stored = {**satellite, CONF_WAKE_WORD: user_input[CONF_WAKE_WORD]}
            if owner_of_key(self.hass, SUBENTRY_WYOMING, wyoming_key(stored)):
                return self.async_abort(reason="already_configured")  # meanwhile
            return self._async_add_satellite(
                entry,
                SUBENTRY_WYOMING,
                stored,
                "wyoming_added",
                {"title": entry.title},
            )
        schema = _entry_choice(entries)
        schema[vol.Required(CONF_WAKE_WORD, default=DEFAULT_WAKE_WORD)] = (
            wake_word_selector()
        )
        return self.async_show_form(
            step_id="wyoming_confirm",
            data_schema=vol.Schema(schema),
            description_placeholders={
                "name": markdown_text(satellite[CONF_NAME]),
                "address": markdown_text(wyoming_key(satellite)),
            },
        )

    _wyoming_discovered: dict[str, Any]
