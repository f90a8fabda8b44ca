"""Fixtures for the component tests (pytest-homeassistant-custom-component)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
from unittest.mock import AsyncMock, patch

import pytest

from homeassistant.core import HomeAssistant
from homeassistant.setup import async_setup_component
from tests.peers.openai_server import DEFAULT_MODEL, OpenAIPeer

PEER_API_KEY = "sk-peer-test-key-0123456789"
PEER_MODEL = DEFAULT_MODEL


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
