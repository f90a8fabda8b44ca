"""Fixtures for the component tests (pytest-homeassistant-custom-component)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any
from unittest.mock import AsyncMock, patch

from openai import _base_client as openai_base_client
import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from tests.components.common import PEER_API_KEY, PEER_MODEL
from tests.components.pipeline.helpers import (
    Home,
    async_setup_home,
    async_setup_rtvoice,
    async_teardown_home,
)
from tests.peers.openai_server import OpenAIPeer


@pytest.fixture(autouse=True)
def auto_enable_custom_integrations(enable_custom_integrations: None) -> None:
    """Let Home Assistant load custom_components/rtvoice in every component test."""


@pytest.fixture(autouse=True)
async def setup_homeassistant_core(hass: HomeAssistant) -> None:
    """Set up HA's core integration, which a real HA always runs.

    The ``conversation`` dependency (exposed entities, the default agent) needs it.
    """
    assert await async_setup_component(hass, "homeassistant", {})


@pytest.fixture
async def openai_peer(socket_enabled: None) -> AsyncIterator[OpenAIPeer]:
    """Run a loopback OpenAI-compatible server for the test.

    It requires ``PEER_API_KEY`` and knows ``PEER_MODEL``; tests may change
    ``api_key`` (None = no key needed) and ``models`` while it runs.
    """
    peer = OpenAIPeer(api_key=PEER_API_KEY, models=[PEER_MODEL])
    await peer.start()
    try:
        yield peer
    finally:
        await peer.stop()


@pytest.fixture
def platform_header_threads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record, for every call, whether the openai SDK built its headers in the loop.

    The SDK caches its platform headers (``uname``, ``/etc/os-release``) for the
    process: the cache is emptied first, then the function is wrapped to record
    where it runs (it still runs). Entries of the list: True = in the event loop.
    """
    real = openai_base_client.platform_headers
    real.cache_clear()
    calls: list[bool] = []

    def probe(*args: Any, **kwargs: Any) -> dict[str, str]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            calls.append(False)
        else:
            calls.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(openai_base_client, "platform_headers", probe)
    return calls


@pytest.fixture
def mock_setup_entry() -> Generator[AsyncMock]:
    """Make entry setup a no-op so flows are tested in isolation.

    The usual HA pattern for flow tests: the runtime has its own tests; here only
    what the flows store (and that they trigger a setup/reload) matters. The
    component-level ``async_setup`` (actions) is skipped as well, so a flow test
    never depends on the rest of the integration.
    """
    with (
        patch("custom_components.rtvoice.async_setup", return_value=True),
        patch(
            "custom_components.rtvoice.async_setup_entry", return_value=True
        ) as mocked,
    ):
        yield mocked


@pytest.fixture
async def home(hass: HomeAssistant, tmp_path: Path) -> AsyncIterator[Home]:
    """HA with two satellites (kitchen, hall), the loopback STT and demo lights.

    rtvoice and the demo lights are unloaded at teardown.
    """
    home = await async_setup_home(hass, tmp_path)
    yield home
    await async_teardown_home(home)


@pytest.fixture
async def entry(home: Home, openai_peer: OpenAIPeer) -> MockConfigEntry:
    """Realtime Voice loaded against the loopback model."""
    return await async_setup_rtvoice(home, openai_peer)
