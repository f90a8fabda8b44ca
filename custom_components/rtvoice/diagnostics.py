"""Diagnostics of a Realtime Voice entry: configuration, structure and counters.

What users may safely attach to an issue. Never included: the API key, the prompt
(both redacted), credentials or query strings of the base URL, and any text that
went through a conversation — transcripts, prompt section contents and tool
results are reduced to counts and names.
"""

from __future__ import annotations

from typing import Any, Final

from homeassistant.components.diagnostics import async_redact_data
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import HomeAssistant

from .const import CONF_API_KEY, CONF_BASE_URL, CONF_NOISE_PSK, CONF_PROMPT
from .kernel import Capability
from .redact import safe_url
from .runtime import RtVoiceConfigEntry, RtVoiceRuntime

TO_REDACT: Final = {CONF_API_KEY, CONF_NOISE_PSK, CONF_PROMPT}


async def async_get_config_entry_diagnostics(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> dict[str, Any]:
    """Return the diagnostics of an entry (redacted, without conversation text)."""
    data = dict(entry.data)
    if isinstance(base_url := data.get(CONF_BASE_URL), str):
        data[CONF_BASE_URL] = safe_url(base_url)
    diagnostics: dict[str, Any] = {
        "entry": {
            "title": entry.title,
            "state": entry.state.value,
            "data": data,
            "options": dict(entry.options),
        }
    }
    if entry.state is ConfigEntryState.LOADED:
        diagnostics["runtime"] = _runtime(entry.runtime_data)
    return async_redact_data(diagnostics, TO_REDACT)


def _runtime(runtime: RtVoiceRuntime) -> dict[str, Any]:
    """Structure and counters of a loaded entry."""
    kernel = runtime.kernel
    satellites = []
    for entity_id in runtime.satellites.satellites():
        if (info := runtime.satellites.info(entity_id)) is None:
            continue  # pragma: no cover - listed satellites have info
        satellites.append(
            {
                "entity_id": info.entity_id,
                "area": info.area,
                "floor": info.floor,
                "language": info.language,
                "features": list(info.features),
            }
        )
    return {
        "tools": runtime.tools is not None,
        "satellites": satellites,
        # id, satellite, device, state and counters; no text.
        "conversations": runtime.control.list_conversations(),
        "archived_conversations": [
            {"id": child_id, "messages": len(kernel.transcript(child_id) or ())}
            for child_id in sorted(kernel.archived())
        ],
        "channels": [
            {
                "name": channel.name,
                "kind": channel.kind,
                "capabilities": [
                    flag.name for flag in Capability if flag in channel.capabilities
                ],
                "owner": channel.owner,
            }
            for channel in sorted(runtime.channels.list(), key=lambda c: c.name)
        ],
        # Names and sizes only: section texts name people, rooms and devices.
        "prompt_sections": [
            {
                "section": section.section,
                "owner": section.owner,
                "order": section.order,
                "scope": section.scope,
                "volatile": section.volatile,
                "chars": len(section.content),
            }
            for section in runtime.prompts.snapshot()
        ],
    }
