"""The subentry flow of a duplex ESPHome satellite: add, take over, reconfigure.

"Add ESPHome satellite" on the entry's page starts it. A satellite is added by
host, port and encryption key, or taken over from Home Assistant's ``esphome``
integration (its host, port and key are copied); either way a connection test
(``duplex_ha.async_probe_satellite``) must pass first, and the device's MAC is
the subentry's unique id, so a satellite is owned by one entry at most.
Reconfigure changes the address or key (tested again; it must still be the same
device) and the satellite's settings (``satellites.form``) in one form.

A discovered satellite does not come through here: a discovery starts a config
flow, whose zeroconf step (``satellites.discovery``) adds the subentry to the
chosen entry itself (why: its docstring).
"""

from __future__ import annotations

from typing import Any, Final

import voluptuous as vol

from homeassistant.config_entries import (
    ConfigEntry,
    ConfigSubentryFlow,
    SubentryFlowResult,
)
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.helpers.selector import (
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TextSelector,
)

from ...const import CONF_MAC, CONF_NOISE_PSK, DEFAULT_ESPHOME_PORT, SUBENTRY_ESPHOME
from ...duplex_ha import ProbeError, async_probe_satellite, satellite_key
from ...duplex_owner import esphome_voice_entries, owner_of, satellite_conf
from ...flow_fields import PASSWORD_SELECTOR
from ..form import (
    current_settings,
    echo_placeholder,
    settings_fields,
    settings_from_input,
)
from ..stored import async_rekey, satellite_title

CONF_ESPHOME_ENTRY: Final = "esphome_entry"  # take over: HA's esphome entry

_PORT = vol.All(vol.Coerce(int), vol.Range(min=1, max=65535))
CONNECT_SCHEMA: Final = vol.Schema(
    {
        vol.Required(CONF_HOST): TextSelector(),
        vol.Required(CONF_PORT, default=DEFAULT_ESPHOME_PORT): _PORT,
        vol.Optional(CONF_NOISE_PSK): PASSWORD_SELECTOR,
    }
)
RECONFIGURE_SCHEMA: Final = CONNECT_SCHEMA.extend(settings_fields())


class EsphomeSatelliteFlow(ConfigSubentryFlow):
    """Add a duplex ESPHome satellite to an entry, or change one."""

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Offer to take one over from HA's esphome integration, if there is one."""
        if self._candidates():
            return self.async_show_menu(
                step_id="user", menu_options=["connect", "take_over"]
            )
        return await self.async_step_connect()

    async def async_step_connect(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Add a satellite by host, port and key, once a connection test passed."""
        errors: dict[str, str] = {}
        if user_input is not None:
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            key = str(user_input.get(CONF_NOISE_PSK) or "").strip() or None
            try:
                info = await async_probe_satellite(self.hass, host, port, key)
            except ProbeError as err:
                errors["base"] = err.reason
            else:
                return self._add(satellite_conf(host, port, key, info))
        return self.async_show_form(
            step_id="connect",
            data_schema=self.add_suggested_values_to_schema(
                CONNECT_SCHEMA, user_input or {}
            ),
            errors=errors,
        )

    async def async_step_take_over(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Take a satellite over from HA's ``esphome`` entry (host, port and key).

        The chosen entry's connection is copied and tested as if typed in; HA's
        esphome entry stays (its other entities keep working), and the repair
        issue offers to disable its voice entities.
        """
        candidates = self._candidates()
        errors: dict[str, str] = {}
        if user_input is not None:
            esphome = next(
                (e for e in candidates if e.entry_id == user_input[CONF_ESPHOME_ENTRY]),
                None,
            )
            if esphome is None:
                errors["base"] = "esphome_entry_not_found"
            else:
                host = str(esphome.data[CONF_HOST])
                port = int(esphome.data.get(CONF_PORT, DEFAULT_ESPHOME_PORT))
                key = esphome.data.get(CONF_NOISE_PSK) or None
                try:
                    info = await async_probe_satellite(self.hass, host, port, key)
                except ProbeError as err:
                    errors["base"] = err.reason
                else:
                    return self._add(satellite_conf(host, port, key, info))
        if not candidates:
            return self.async_abort(reason="no_esphome_satellites")
        choices = [
            SelectOptionDict(value=e.entry_id, label=f"{e.title} ({e.data[CONF_HOST]})")
            for e in candidates
        ]
        return self.async_show_form(
            step_id="take_over",
            data_schema=vol.Schema(
                {
                    vol.Required(CONF_ESPHOME_ENTRY): SelectSelector(
                        SelectSelectorConfig(
                            options=choices, mode=SelectSelectorMode.LIST
                        )
                    )
                }
            ),
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Change the satellite's address, key or settings (one form).

        The connection is tested again only when the address changes or a key is
        typed; an empty key keeps the stored one (and a device that no longer
        uses encryption drops it). It must be the same device (its MAC).
        """
        entry = self._get_entry()
        subentry = self._get_reconfigure_subentry()
        conf = dict(subentry.data)
        errors: dict[str, str] = {}
        if user_input is not None:
            settings, errors = settings_from_input(user_input)
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            typed = str(user_input.get(CONF_NOISE_PSK) or "").strip() or None
            connection: dict[str, Any] = {}
            if not errors and (
                typed is not None
                or host != conf.get(CONF_HOST)
                or port != int(conf.get(CONF_PORT, DEFAULT_ESPHOME_PORT))
            ):
                connection, errors = await self._reconnect(conf, host, port, typed)
            if not errors:
                data = {**conf, **connection, **settings}
                key = satellite_key(data)
                if key != subentry.unique_id and owner_of(self.hass, key) is not None:
                    errors["base"] = "already_owned"  # a device of another subentry
                else:
                    if subentry.unique_id is not None:
                        async_rekey(
                            self.hass, entry, SUBENTRY_ESPHOME, subentry.unique_id, key
                        )
                    return self.async_update_and_abort(
                        entry,
                        subentry,
                        data=data,
                        title=satellite_title(data),
                        unique_id=key,
                    )
        shown = {
            CONF_HOST: conf.get(CONF_HOST),
            CONF_PORT: conf.get(CONF_PORT, DEFAULT_ESPHOME_PORT),
            **current_settings(conf),
            **{k: v for k, v in (user_input or {}).items() if k != CONF_NOISE_PSK},
        }
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(RECONFIGURE_SCHEMA, shown),
            errors=errors,
            description_placeholders={
                "name": subentry.title,
                "key": (
                    "one is stored, an empty field keeps it"
                    if conf.get(CONF_NOISE_PSK)
                    else "none (the satellite does not use encryption)"
                ),
                "echo_cancellation": echo_placeholder(),
            },
        )

    async def _reconnect(
        self, conf: dict[str, Any], host: str, port: int, typed: str | None
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Test the new connection; its stored form, or the form's errors."""
        stored = conf.get(CONF_NOISE_PSK) or None
        key = typed or stored
        try:
            try:
                info = await async_probe_satellite(self.hass, host, port, key)
            except ProbeError as err:
                if typed is not None or err.reason != "encryption_not_offered":
                    raise
                key = None  # the device dropped encryption: so does its entry
                info = await async_probe_satellite(self.hass, host, port, key)
        except ProbeError as err:
            return {}, {"base": err.reason}
        new = satellite_conf(host, port, key, info)
        if conf.get(CONF_MAC) and satellite_key(new) != satellite_key(conf):
            return {}, {"base": "another_device"}
        return new, {}

    def _add(self, conf: dict[str, Any]) -> SubentryFlowResult:
        """Store a tested satellite unless an entry owns it already."""
        key = satellite_key(conf)
        if (owner := owner_of(self.hass, key)) is not None:
            return self.async_abort(
                reason="already_owned",
                description_placeholders={"entry": owner[0].title},
            )
        return self.async_create_entry(
            title=satellite_title(conf), data=conf, unique_id=key
        )

    def _candidates(self) -> list[ConfigEntry]:
        """HA's esphome voice satellites no Realtime Voice entry owns yet."""
        return [
            e
            for e in esphome_voice_entries(self.hass)
            if e.unique_id is not None and owner_of(self.hass, e.unique_id) is None
        ]
