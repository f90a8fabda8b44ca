"""System health through HA's system_health component and the loopback peer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    get_system_health_info,
)

from custom_components.rtvoice.const import DOMAIN
from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from tests.components.common import agent_entry, async_load_entry, openai_entry
from tests.components.pipeline.helpers import (
    QUIET_SATELLITE,
    Home,
    async_setup_home,
    wait,
)
from tests.peers.openai_server import OpenAIPeer


@pytest.fixture
async def home(hass: HomeAssistant, tmp_path: Path) -> AsyncIterator[Home]:
    """HA with satellites; every rtvoice entry is unloaded at teardown."""
    home = await async_setup_home(hass, tmp_path)
    assert await async_setup_component(hass, "system_health", {})
    yield home
    for entry in hass.config_entries.async_loaded_entries(DOMAIN):
        assert await hass.config_entries.async_unload(entry.entry_id)
    await hass.async_block_till_done()


def _agent_entry(hass: HomeAssistant, title: str = "Offline") -> MockConfigEntry:
    return agent_entry(hass, "conversation.home_assistant", title=title)


async def _info(hass: HomeAssistant) -> dict[str, Any]:
    """Return the info with every pending check awaited, as the page shows it."""
    info = await get_system_health_info(hass, DOMAIN)
    return {
        key: await wait(value) if asyncio.iscoroutine(value) else value
        for key, value in info.items()
    }


async def test_endpoints_agents_and_conversations(
    hass: HomeAssistant, home: Home, openai_peer: OpenAIPeer
) -> None:
    """Reachability per endpoint, the agent of delegating entries, open conversations."""
    openai = await async_load_entry(hass, openai_entry(hass, openai_peer))
    await async_load_entry(hass, _agent_entry(hass))
    await openai.runtime_data.control.async_start(QUIET_SATELLITE)
    await openai.runtime_data.control.async_start(None)
    requests_before = len(openai_peer.requests)

    assert await _info(hass) == {
        "loaded_entries": 2,
        "active_conversations": 2,
        "Realtime Voice endpoint": "ok",
        "Offline agent": "Home Assistant agent conversation.home_assistant",
    }
    assert len(openai_peer.requests) == requests_before  # no chat request, no tokens


async def test_unreachable_endpoint(
    hass: HomeAssistant, home: Home, openai_peer: OpenAIPeer
) -> None:
    """An endpoint that went away is reported as unreachable."""
    await async_load_entry(hass, openai_entry(hass, openai_peer))
    await openai_peer.stop()
    info = await _info(hass)
    assert info["Realtime Voice endpoint"] == {"type": "failed", "error": "unreachable"}
    assert info["active_conversations"] == 0


async def test_same_titles_stay_apart(
    hass: HomeAssistant, home: Home, openai_peer: OpenAIPeer
) -> None:
    """Entries with the same title are told apart by their entry id."""
    first = await async_load_entry(hass, _agent_entry(hass, "Voice"))
    second = await async_load_entry(hass, _agent_entry(hass, "Voice"))
    info = await _info(hass)
    assert info[f"Voice ({first.entry_id}) agent"] == (
        "Home Assistant agent conversation.home_assistant"
    )
    assert f"Voice ({second.entry_id}) agent" in info
    assert info["loaded_entries"] == 2


async def test_nothing_loaded(hass: HomeAssistant, home: Home) -> None:
    """Without loaded entries the page shows zeros."""
    assert await async_setup_component(hass, DOMAIN, {})
    assert await _info(hass) == {"loaded_entries": 0, "active_conversations": 0}
