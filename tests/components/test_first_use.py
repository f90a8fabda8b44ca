"""What a new user hits first (issue 12): bad input, permissions, honest answers.

Everything runs against a real Home Assistant with the loopback model; the users are
real HA users (``hass_admin_user`` / ``hass_read_only_user``, a non-admin).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.chat_feed import NOT_UNDERSTOOD
from custom_components.rtvoice.const import BRAIN_HA_AGENT, CONF_BRAIN
from homeassistant.components import conversation
from homeassistant.core import Context
from homeassistant.helpers import intent
from tests.components.pipeline.helpers import AGENT, Home, async_setup_rtvoice
from tests.peers.openai_server import OpenAIPeer


def rtvoice_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Records above debug from anywhere (HA logs our tracebacks under its own name)."""
    return [r for r in caplog.records if r.levelno > logging.DEBUG]


# ── 1: blank input ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
@pytest.mark.parametrize("brain", ["openai", BRAIN_HA_AGENT])
async def test_blank_input_is_not_understood(
    home: Home,
    openai_peer: OpenAIPeer,
    caplog: pytest.LogCaptureFixture,
    text: str,
    brain: str,
) -> None:
    """Blank text gets HA's own "could not understand" answer and starts nothing."""
    hass = home.hass
    if brain == BRAIN_HA_AGENT:
        await async_setup_rtvoice(home, None, data={CONF_BRAIN: BRAIN_HA_AGENT})
    else:
        await async_setup_rtvoice(home, openai_peer)
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    result = await conversation.async_converse(
        hass, text, None, Context(), language="en", agent_id=AGENT
    )
    response = result.response
    assert response.response_type is intent.IntentResponseType.ERROR
    assert response.error_code is intent.IntentResponseErrorCode.NO_INTENT_MATCH
    assert response.speech["plain"]["speech"] == NOT_UNDERSTOOD
    assert home.control.list_conversations() == []
    assert home.control.known_ids() == []
    assert openai_peer.requests == []
    assert rtvoice_records(caplog) == []
