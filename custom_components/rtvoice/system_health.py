"""System health of Realtime Voice: endpoints and conversations.

For each loaded entry one line named after the entry: whether its OpenAI-compatible
endpoint answers HTTP at all (no key is sent, so any status counts as reachable),
or which Home Assistant conversation agent it delegates to. Plus how many
conversations are open right now.
"""

from __future__ import annotations

from typing import Any

from homeassistant.components import system_health
from homeassistant.core import HomeAssistant, callback

from .const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BASE_URL,
    CONF_BRAIN,
    DEFAULT_AGENT_ID,
    DEFAULT_BASE_URL,
    DOMAIN,
)
from .runtime import RtVoiceConfigEntry


@callback
def async_register(
    hass: HomeAssistant, register: system_health.SystemHealthRegistration
) -> None:
    """Register the system health callback."""
    register.async_register_info(system_health_info)


async def system_health_info(hass: HomeAssistant) -> dict[str, Any]:
    """Return the info shown on the system health page."""
    entries: list[RtVoiceConfigEntry] = hass.config_entries.async_loaded_entries(DOMAIN)
    info: dict[str, Any] = {
        "loaded_entries": len(entries),
        "active_conversations": sum(
            len(entry.runtime_data.kernel.children()) for entry in entries
        ),
    }
    titles = [entry.title for entry in entries]
    for entry in entries:
        name = entry.title
        if titles.count(name) > 1:
            name = f"{name} ({entry.entry_id})"
        if entry.data.get(CONF_BRAIN) == BRAIN_HA_AGENT:
            agent = entry.data.get(CONF_AGENT_ID) or DEFAULT_AGENT_ID
            info[f"{name} agent"] = f"Home Assistant agent {agent}"
        else:
            url = entry.data.get(CONF_BASE_URL) or DEFAULT_BASE_URL
            info[f"{name} endpoint"] = system_health.async_check_can_reach_url(
                hass, url
            )
    return info
