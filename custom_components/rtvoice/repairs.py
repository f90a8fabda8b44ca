"""Repairs: the fix of "HA's ``esphome`` satellite entity holds a duplex satellite".

Only one API client can own a device's voice assistant: the last one to subscribe.
While HA's ``esphome`` integration has an enabled ``assist_satellite`` entity on the
device of one of our duplex satellites, the two take the voice assistant from each
other at every reconnect. ``duplex_owner.async_watch_satellite_conflicts`` raises a
fixable issue per (entry, satellite); its fix here disables ESPHome's voice
entities of the device: the satellite and its assistant, finished-speaking and
wake word selects and assist-in-progress sensor, so the device page shows one
assistant choice, Realtime Voice's (the ESPHome device and its other entities stay).

The entity is disabled with ``disabled_by=USER``: the user decided it in the
repair dialog, the entity page then says "disabled by user" and the usual switch
re-enables it. ``INTEGRATION`` would claim that ``esphome`` (the entity's own
integration) disabled it by default, which is not what happened.
"""

from __future__ import annotations

import voluptuous as vol

from homeassistant import data_entry_flow
from homeassistant.components.repairs import RepairsFlow
from homeassistant.core import HomeAssistant
from homeassistant.helpers import entity_registry as er, issue_registry as ir

from .const import DOMAIN
from .duplex_owner import (
    DATA_SATELLITE,
    ISSUE_ESPHOME_SATELLITE_ENABLED,
    esphome_voice_entities,
)


class DisableEsphomeSatelliteFlow(RepairsFlow):
    """Confirm, then disable HA's ``esphome`` satellite entities of the device."""

    def __init__(self, key: str) -> None:
        """Fix the conflict of the satellite ``key`` (its MAC)."""
        self._key = key

    async def async_step_init(
        self, user_input: dict[str, str] | None = None
    ) -> data_entry_flow.FlowResult:
        """Start with the confirmation."""
        return await self.async_step_confirm()

    async def async_step_confirm(
        self, user_input: dict[str, str] | None = None
    ) -> data_entry_flow.FlowResult:
        """Disable the entities once the user confirmed (read again now)."""
        if user_input is not None:
            registry = er.async_get(self.hass)
            for entity in esphome_voice_entities(self.hass, self._key):
                registry.async_update_entity(
                    entity.entity_id, disabled_by=er.RegistryEntryDisabler.USER
                )
            return self.async_create_entry(data={})
        issue = ir.async_get(self.hass).async_get_issue(DOMAIN, self.issue_id)
        return self.async_show_form(
            step_id="confirm",
            data_schema=vol.Schema({}),
            description_placeholders=(
                issue.translation_placeholders if issue is not None else None
            ),
        )


async def async_create_fix_flow(
    hass: HomeAssistant,
    issue_id: str,
    data: dict[str, str | int | float | None] | None,
) -> RepairsFlow:
    """Create the fix flow of a Realtime Voice issue."""
    if issue_id.startswith(ISSUE_ESPHOME_SATELLITE_ENABLED) and data:
        return DisableEsphomeSatelliteFlow(str(data[DATA_SATELLITE]))
    raise ValueError(f"unknown repair {issue_id}")
