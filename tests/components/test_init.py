"""Entry setup through Home Assistant: errors come with translated messages.

HA keeps the message of a failed setup as ``entry.reason`` (shown on the entry's
card) together with its translation key; the message is rendered from
translations/en.json. Real peers: the loopback OpenAI server, HA's real
conversation component.
"""

from __future__ import annotations

from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BRAIN,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
)
from homeassistant.components import conversation
from homeassistant.config_entries import SOURCE_REAUTH, ConfigEntryState
from homeassistant.const import EVENT_HOMEASSISTANT_STOP, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import intent
from homeassistant.setup import async_setup_component
from tests.components.common import (
    KITCHEN,
    agent_entry,
    async_load_entry,
    async_setup_demo_lights,
    openai_data,
)
from tests.peers.openai_server import OpenAIPeer


async def async_set_up(hass: HomeAssistant, data: dict[str, Any]) -> MockConfigEntry:
    """Add an entry and let HA set it up (the setup is expected to fail)."""
    entry = MockConfigEntry(
        domain=DOMAIN, title="Realtime Voice", data=data, options=DEFAULT_OPTIONS_OPENAI
    )
    entry.add_to_hass(hass)
    assert not await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    return entry


async def test_openai_platform_headers_are_built_off_the_loop(
    hass: HomeAssistant, openai_peer: OpenAIPeer, platform_header_threads: list[bool]
) -> None:
    """Entry setup builds the SDK's platform headers in the executor first."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Realtime Voice",
        data=openai_data(openai_peer),
        options=DEFAULT_OPTIONS_OPENAI,
    )
    entry.add_to_hass(hass)
    await async_load_entry(hass, entry)
    assert platform_header_threads
    assert platform_header_threads[0] is False  # the first (uncached) call


async def test_stop_listener_lives_and_dies_with_the_entry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The HA-stop listener is the entry's: reloads never add one, unload removes it."""

    def stop_listeners() -> int:
        return hass.bus.async_listeners().get(EVENT_HOMEASSISTANT_STOP, 0)

    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Realtime Voice",
        data=openai_data(openai_peer),
        options=DEFAULT_OPTIONS_OPENAI,
    )
    entry.add_to_hass(hass)
    await async_load_entry(hass, entry)  # also sets up HA's httpx client and more
    loaded = stop_listeners()
    for _ in range(2):
        assert await hass.config_entries.async_reload(entry.entry_id)
    assert stop_listeners() == loaded
    assert await hass.config_entries.async_unload(entry.entry_id)
    assert stop_listeners() == loaded - 1


async def test_unreachable_endpoint_retries_with_a_translated_reason(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A server that is down: the entry retries; its reason reads as en.json says."""
    data = openai_data(openai_peer)
    await openai_peer.stop()  # the port is closed now: connection refused
    entry = await async_set_up(hass, data)

    assert entry.state is ConfigEntryState.SETUP_RETRY
    assert entry.error_reason_translation_key == "cannot_connect"
    assert entry.reason == (
        "The model server cannot be used right now: "
        "cannot connect to the model server (ConnectError)"
    )


async def test_unknown_model_retries_with_a_translated_reason(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A model the server does not have: retry, the reason names the model."""
    entry = await async_set_up(hass, openai_data(openai_peer, model="llama-missing"))

    assert entry.state is ConfigEntryState.SETUP_RETRY
    assert entry.error_reason_translation_key == "model_not_found"
    assert entry.error_reason_translation_placeholders is not None
    assert entry.error_reason_translation_placeholders["model"] == "llama-missing"
    assert entry.reason is not None
    assert entry.reason.startswith(
        "The model server does not know the model llama-missing: "
        "model 'llama-missing' not found (HTTP 404)"
    )


async def test_rejected_key_asks_for_reauth_with_a_translated_reason(
    hass: HomeAssistant, openai_peer: OpenAIPeer, caplog: pytest.LogCaptureFixture
) -> None:
    """A wrong key: setup error, a reauth flow, a translated reason without the key."""
    wrong_key = "sk-wrong-key-7777"
    entry = await async_set_up(hass, openai_data(openai_peer, api_key=wrong_key))
    [logged] = [r for r in caplog.records if "could not authenticate" in r.message]
    assert logged.getMessage().count("rejected the API key") == 1

    assert entry.state is ConfigEntryState.SETUP_ERROR
    assert entry.error_reason_translation_key == "auth_failed"
    assert entry.reason is not None
    # One clear sentence (issue 12 item 4): it said "rejected the API key" twice.
    assert entry.reason == (
        f"The model server {openai_peer.base_url} rejected the API key (HTTP 401);"
        " enter a new key when Home Assistant asks for it"
    )
    assert wrong_key not in entry.reason
    (flow,) = hass.config_entries.flow.async_progress_by_handler(DOMAIN)
    assert flow["context"]["source"] == SOURCE_REAUTH
    assert flow["context"]["entry_id"] == entry.entry_id


async def test_missing_agent_retries_with_a_translated_reason(
    hass: HomeAssistant,
) -> None:
    """An agent that is not loaded (yet): the entry retries and says which agent."""
    assert await async_setup_component(hass, "conversation", {})
    entry = await async_set_up(
        hass, {CONF_BRAIN: BRAIN_HA_AGENT, CONF_AGENT_ID: "conversation.nobody"}
    )

    assert entry.state is ConfigEntryState.SETUP_RETRY
    assert entry.error_reason_translation_key == "agent_not_available"
    assert entry.reason == "The conversation agent conversation.nobody is not available"


async def test_unknown_brain_fails_with_a_translated_reason(
    hass: HomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry naming an unknown brain cannot be set up; the log says why."""
    entry = await async_set_up(hass, {CONF_BRAIN: "telepathy"})

    assert entry.state is ConfigEntryState.SETUP_ERROR
    assert entry.error_reason_translation_key == "unknown_brain"
    assert entry.reason == (
        "This entry names an unknown brain: telepathy. "
        "Delete the entry and add it again"
    )
    assert entry.reason in caplog.text


async def test_agent_brain_reports_the_agents_answer_type(
    hass: HomeAssistant, hass_admin_user: MockUser
) -> None:
    """Through the built-in agent: a done action is done, a failed one an error.

    The agent's speech is spoken either way; its error answer stays an error, as HA's
    own agent reports it, instead of becoming "action done".
    """
    await async_setup_demo_lights(hass, kitchen_area="Kitchen")
    await async_load_entry(hass, agent_entry(hass))
    context = Context(user_id=hass_admin_user.id)
    agent = "conversation.realtime_voice"

    done = await conversation.async_converse(
        hass, "turn on the kitchen lights", None, context, agent_id=agent
    )
    assert done.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert hass.states.get(KITCHEN).state == STATE_ON

    failed = await conversation.async_converse(
        hass, "blorp the flibber", done.conversation_id, context, agent_id=agent
    )
    assert failed.response.response_type is intent.IntentResponseType.ERROR
    assert failed.response.speech["plain"]["speech"]  # still spoken
