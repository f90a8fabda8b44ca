"""The subentry flow of a Wyoming satellite: add and reconfigure.

"Add Wyoming satellite" on the entry's page starts it: host, port and wake word;
``describe`` must show a satellite (``wyoming_ha.async_probe_wyoming``). Its
address (host:port) is the subentry's unique id, so a satellite is owned by one
entry at most. Reconfigure changes the address (tested again), the wake word and
the satellite's settings (``satellites.form``) in one form; a new address moves
the satellite's device and entities to it (``stored.async_rekey``), so they keep
their ids, names and areas.

A discovered satellite does not come through here: a discovery starts a config
flow, whose zeroconf step (``satellites.discovery``) adds the subentry to the
chosen entry itself (why: its docstring).
"""

from __future__ import annotations

from typing import Any, Final

import voluptuous as vol

from homeassistant.config_entries import ConfigSubentryFlow, SubentryFlowResult
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.helpers.selector import TextSelector

from ...const import CONF_NAME, CONF_WAKE_WORD, DEFAULT_WYOMING_PORT, SUBENTRY_WYOMING
from ...wyoming_ha import (
    DEFAULT_WAKE_WORD,
    WyomingProbeError,
    async_probe_wyoming,
    wyoming_key,
)
from ..form import (
    current_settings,
    current_wake_word,
    echo_placeholder,
    settings_fields,
    settings_from_input,
    wake_word_selector,
)
from ..stored import async_rekey, owner_of_key, satellite_title

_PORT = vol.All(vol.Coerce(int), vol.Range(min=1, max=65535))


def _address_fields() -> dict[vol.Marker, Any]:
    return {
        vol.Required(CONF_HOST): TextSelector(),
        vol.Required(CONF_PORT, default=DEFAULT_WYOMING_PORT): _PORT,
        vol.Required(CONF_WAKE_WORD, default=DEFAULT_WAKE_WORD): wake_word_selector(),
    }


ADD_SCHEMA: Final = vol.Schema(_address_fields())
RECONFIGURE_SCHEMA: Final = vol.Schema({**_address_fields(), **settings_fields()})


class WyomingSatelliteFlow(ConfigSubentryFlow):
    """Add a Wyoming satellite to an entry, or change one."""

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Add a satellite by host and port, once ``describe`` showed it is one."""
        errors: dict[str, str] = {}
        if user_input is not None:
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            key = wyoming_key({CONF_HOST: host, CONF_PORT: port})
            if (owner := owner_of_key(self.hass, SUBENTRY_WYOMING, key)) is not None:
                return self.async_abort(
                    reason="already_owned",
                    description_placeholders={"entry": owner[0].title},
                )
            try:
                info = await async_probe_wyoming(host, port)
            except WyomingProbeError as err:
                errors["base"] = err.reason
            else:
                assert info.satellite is not None
                conf = {
                    CONF_HOST: host,
                    CONF_PORT: port,
                    CONF_NAME: info.satellite.name,
                    CONF_WAKE_WORD: str(user_input[CONF_WAKE_WORD]),
                }
                return self.async_create_entry(
                    title=satellite_title(conf), data=conf, unique_id=key
                )
        return self.async_show_form(
            step_id="user",
            data_schema=self.add_suggested_values_to_schema(
                ADD_SCHEMA, user_input or {}
            ),
            errors=errors,
        )

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> SubentryFlowResult:
        """Change the satellite's address, wake word or settings (one form)."""
        entry = self._get_entry()
        subentry = self._get_reconfigure_subentry()
        conf = dict(subentry.data)
        old_key = wyoming_key(conf)
        errors: dict[str, str] = {}
        if user_input is not None:
            settings, errors = settings_from_input(user_input)
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            key = wyoming_key({CONF_HOST: host, CONF_PORT: port})
            address: dict[str, Any] = {}
            if not errors and key != old_key:
                if owner_of_key(self.hass, SUBENTRY_WYOMING, key) is not None:
                    errors["base"] = "already_owned"
                else:
                    try:
                        info = await async_probe_wyoming(host, port)
                    except WyomingProbeError as err:
                        errors["base"] = err.reason
                    else:
                        assert info.satellite is not None
                        address = {
                            CONF_HOST: host,
                            CONF_PORT: port,
                            CONF_NAME: info.satellite.name,
                        }
            if not errors:
                data = {
                    **conf,
                    **address,
                    **settings,
                    CONF_WAKE_WORD: str(user_input[CONF_WAKE_WORD]),
                }
                async_rekey(self.hass, entry, SUBENTRY_WYOMING, old_key, key)
                return self.async_update_and_abort(
                    entry,
                    subentry,
                    data=data,
                    title=satellite_title(data),
                    unique_id=wyoming_key(data),
                )
        shown = {
            CONF_HOST: conf.get(CONF_HOST),
            CONF_PORT: conf.get(CONF_PORT, DEFAULT_WYOMING_PORT),
            CONF_WAKE_WORD: current_wake_word(conf),
            **current_settings(conf),
            **(user_input or {}),
        }
        return self.async_show_form(
            step_id="reconfigure",
            data_schema=self.add_suggested_values_to_schema(RECONFIGURE_SCHEMA, shown),
            errors=errors,
            description_placeholders={
                "name": subentry.title,
                "echo_cancellation": echo_placeholder(),
            },
        )
