"""The pipeline select of each duplex and Wyoming satellite (as in HA's own).

HA's ``AssistPipelineSelect`` on the satellite's device: "preferred" or a
pipeline by name. The duplex conversations read it at every utterance and every
sentence (``duplex_ha.chosen_pipeline``, ``wyoming_ha.wyoming_chosen_pipeline``), so a change applies to the next one; the
satellite entity names it as its ``pipeline_entity_id`` (announcements use its TTS).

No VAD sensitivity select: in duplex mode the end of an utterance is found by the
duplex session's own segmenter, which HA's sensitivity does not drive.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from homeassistant.components.assist_pipeline.select import AssistPipelineSelect
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.setup import async_setup_component

from .const import DOMAIN, SUBENTRY_ESPHOME, SUBENTRY_WYOMING
from .duplex_ha import satellite_device_info, satellite_unique_id
from .runtime import RtVoiceConfigEntry
from .satellites.stored import subentry_ids
from .wyoming_ha import wyoming_device_info, wyoming_unique_id

PARALLEL_UPDATES = 0

PIPELINE_DOMAIN = "assist_pipeline"


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add a pipeline select per stored satellite, in its subentry."""
    duplex = entry.runtime_data.duplex
    wyoming = entry.runtime_data.wyoming
    if not duplex.configs and not wyoming.configs:
        return
    # The select reads the pipeline store: make sure it exists (the platforms of
    # an entry are set up side by side, assist_satellite's dependencies too).
    await async_setup_component(hass, PIPELINE_DOMAIN, {})
    subentries = subentry_ids(entry, SUBENTRY_ESPHOME)
    for key, conf in duplex.configs.items():
        async_add_entities(
            [DuplexPipelineSelect(hass, entry.entry_id, key, conf)],
            config_subentry_id=subentries.get(key),
        )
    subentries = subentry_ids(entry, SUBENTRY_WYOMING)
    for key, conf in wyoming.configs.items():
        async_add_entities(
            [WyomingPipelineSelect(hass, entry.entry_id, key, conf)],
            config_subentry_id=subentries.get(key),
        )


class DuplexPipelineSelect(AssistPipelineSelect):
    """Which Assist pipeline's speech engines a duplex satellite uses."""

    _attr_has_entity_name = True

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        key: str,
        conf: Mapping[str, Any],
    ) -> None:
        """Place the select on the satellite's device."""
        super().__init__(hass, DOMAIN, satellite_unique_id(entry_id, key))
        self._attr_device_info = satellite_device_info(key, conf)


class WyomingPipelineSelect(AssistPipelineSelect):
    """Which Assist pipeline's speech engines a Wyoming satellite uses."""

    _attr_has_entity_name = True

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        key: str,
        conf: Mapping[str, Any],
    ) -> None:
        """Place the select on the satellite's device."""
        super().__init__(hass, DOMAIN, wyoming_unique_id(entry_id, key))
        self._attr_device_info = wyoming_device_info(key, conf)
