"""Tests of the config, reauth, reconfigure and options flows.

The OpenAI-compatible endpoint is a real loopback server (``tests.peers``) that the
real provider talks to over HA's shared httpx client. Entry setup is patched out
(``mock_setup_entry``) so the flows are tested in isolation from the runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
import contextlib
import json
import logging
from pathlib import Path
import re
import socket
from typing import Any
from unittest.mock import AsyncMock

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry
import voluptuous as vol
from yarl import URL

from custom_components.rtvoice import brain_check
from custom_components.rtvoice.brain_check import (
    distinct_title,
    ha_agent_unique_id,
    openai_unique_id,
)
from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_CARRY_OVER,
    CONF_CHUNK_TIMEOUT,
    CONF_CONTEXT_WINDOW,
    CONF_CREATE_ASSISTANT,
    CONF_FIRST_TOKEN_TIMEOUT,
    CONF_IDLE_TIMEOUT,
    CONF_LLM_HASS_API,
    CONF_MAX_ANSWER_CHARS,
    CONF_MAX_TOOL_TURNS,
    CONF_MODEL,
    CONF_NAME,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_AGENT_ID,
    DEFAULT_BASE_URL,
    DEFAULT_LLM_HASS_API,
    DEFAULT_MODEL,
    DEFAULT_NAME,
    DEFAULT_OPTIONS_HA_AGENT,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    LLM_API_NONE,
)
from homeassistant import config_entries
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType, InvalidData
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.selector import NumberSelector
from tests.components.common import PEER_API_KEY, PEER_MODEL, open_settings
from tests.peers.openai_server import Fail, OpenAIPeer

pytestmark = pytest.mark.usefixtures("mock_setup_entry")

TRANSLATIONS = json.loads(
    (
        Path(__file__).parents[2]
        / "custom_components"
        / "rtvoice"
        / "translations"
        / "en.json"
    ).read_text(encoding="utf-8")
)
OTHER_MODEL = "other-model"
OLD_KEY = "sk-old-key-abcdef"


# -- helpers -------------------------------------------------------------------------


def assert_translated(result: Mapping[str, Any], section: str = "config") -> None:
    """Fail unless every string the frontend needs for ``result`` is in en.json."""
    strings = TRANSLATIONS[section]
    if result["type"] is FlowResultType.ABORT:
        assert result["reason"] in strings["abort"]
        return
    if result["type"] is FlowResultType.CREATE_ENTRY:
        return
    step = strings["step"][result["step_id"]]
    assert step["title"]
    assert step["description"]
    placeholders = result.get("description_placeholders") or {}
    needed = set(re.findall(r"{(\w+)}", step["title"] + step["description"]))
    assert needed <= set(placeholders), f"{result['step_id']}: placeholders {needed}"
    if result["type"] is FlowResultType.MENU:
        assert set(step["menu_options"]) == set(result["menu_options"])
        return
    assert result["type"] is FlowResultType.FORM
    for key in result["data_schema"].schema:
        assert str(key) in step["data"], f"{result['step_id']}: no label for {key}"
        assert str(key) in step["data_description"], (
            f"{result['step_id']}: no data_description for {key}"
        )
    for error in (result.get("errors") or {}).values():
        assert error in strings["error"]
    for value in placeholders.values():
        assert value  # no empty placeholder ends up in the text


def suggested(result: Mapping[str, Any], field: str) -> Any:
    """Return what the form pre-fills for ``field`` (suggested value, else default)."""
    for key in result["data_schema"].schema:
        if str(key) == field:
            if key.description and "suggested_value" in key.description:
                return key.description["suggested_value"]
            return key.default() if callable(key.default) else None
    raise AssertionError(f"no field {field}")


def fields(result: Mapping[str, Any]) -> set[str]:
    """Return the field names of a form."""
    return {str(key) for key in result["data_schema"].schema}


async def start_brain(
    hass: HomeAssistant, brain: str
) -> config_entries.ConfigFlowResult:
    """Open the user flow and pick ``brain`` from the menu."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.MENU
    assert_translated(result)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"next_step_id": brain}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == brain
    assert_translated(result)
    return result


def openai_entry(
    base_url: str,
    *,
    model: str = PEER_MODEL,
    api_key: str | None = OLD_KEY,
    title: str = "Peer",
) -> MockConfigEntry:
    """Build an endpoint entry as the user flow stores it."""
    data: dict[str, Any] = {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: base_url,
        CONF_MODEL: model,
    }
    if api_key is not None:
        data[CONF_API_KEY] = api_key
    return MockConfigEntry(
        domain=DOMAIN,
        title=title,
        data=data,
        options=dict(DEFAULT_OPTIONS_OPENAI),
        unique_id=openai_unique_id(base_url, model),
    )


def agent_entry(agent_id: str, title: str = "Agent") -> MockConfigEntry:
    """Build an agent entry as the user flow stores it."""
    return MockConfigEntry(
        domain=DOMAIN,
        title=title,
        data={CONF_BRAIN: BRAIN_HA_AGENT, CONF_AGENT_ID: agent_id},
        options=dict(DEFAULT_OPTIONS_HA_AGENT),
        unique_id=ha_agent_unique_id(agent_id),
    )


# -- translations ----------------------------------------------------------------------


def test_translations_are_literal_strings() -> None:
    """Custom integrations cannot use [%key:...] references; every string is text."""

    def walk(node: Mapping[str, Any], path: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, f"{path}.{key}")
            else:
                assert isinstance(value, str) and value.strip(), f"{path}.{key}"
                assert "[%key:" not in value, f"{path}.{key}"

    walk(TRANSLATIONS, "en")
    for reason in (
        "already_configured",
        "already_in_progress",
        "reauth_successful",
        "reconfigure_successful",
        "reauth_not_supported",
    ):
        assert reason in TRANSLATIONS["config"]["abort"]


# -- user flow: OpenAI-compatible endpoint ---------------------------------------------


async def test_user_menu_offers_both_brains(hass: HomeAssistant) -> None:
    """The first step is a menu choosing the brain."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": config_entries.SOURCE_USER}
    )
    assert result["type"] is FlowResultType.MENU
    assert result["menu_options"] == [BRAIN_OPENAI, BRAIN_HA_AGENT]
    assert_translated(result)


async def test_openai_form_defaults(hass: HomeAssistant) -> None:
    """The endpoint form pre-fills name, OpenAI's URL and a small model."""
    result = await start_brain(hass, BRAIN_OPENAI)
    assert fields(result) == {
        CONF_NAME,
        CONF_BASE_URL,
        CONF_API_KEY,
        CONF_MODEL,
        CONF_CREATE_ASSISTANT,
    }
    assert suggested(result, CONF_NAME) == DEFAULT_NAME
    assert suggested(result, CONF_BASE_URL) == DEFAULT_BASE_URL
    assert suggested(result, CONF_MODEL) == DEFAULT_MODEL
    assert suggested(result, CONF_API_KEY) is None


async def test_flow_builds_openai_platform_headers_off_the_loop(
    hass: HomeAssistant,
    openai_peer: OpenAIPeer,
    mock_setup_entry: AsyncMock,
    platform_header_threads: list[bool],
) -> None:
    """The endpoint check builds the SDK's platform headers in the executor first."""
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Kitchen brain",
            CONF_BASE_URL: openai_peer.base_url,
            CONF_API_KEY: PEER_API_KEY,
            CONF_MODEL: PEER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert platform_header_threads
    assert platform_header_threads[0] is False  # the first (uncached) call


async def test_openai_creates_entry_with_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer, mock_setup_entry: AsyncMock
) -> None:
    """A reachable endpoint that accepts the key and knows the model is saved."""
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Kitchen brain",
            CONF_BASE_URL: f"  {openai_peer.base_url}/ ",
            CONF_API_KEY: f" {PEER_API_KEY} ",
            CONF_MODEL: f" {PEER_MODEL} ",
        },
    )
    await hass.async_block_till_done()

    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "Kitchen brain"
    assert result["data"] == {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: openai_peer.base_url,
        CONF_API_KEY: PEER_API_KEY,
        CONF_MODEL: PEER_MODEL,
        CONF_CREATE_ASSISTANT: True,  # the default: the first setup creates one
    }
    assert result["options"] == DEFAULT_OPTIONS_OPENAI
    entry = result["result"]
    assert entry.unique_id == f"{openai_peer.base_url}|{PEER_MODEL}"
    assert len(mock_setup_entry.mock_calls) == 1


async def test_openai_without_key_for_local_server(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A server that needs no key gets none stored; a blank name falls back."""
    openai_peer.api_key = None
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "   ",
            CONF_BASE_URL: openai_peer.base_url,
            CONF_MODEL: PEER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == DEFAULT_NAME
    assert result["data"] == {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: openai_peer.base_url,
        CONF_MODEL: PEER_MODEL,
        CONF_CREATE_ASSISTANT: True,
    }


@pytest.mark.usefixtures("socket_enabled")
async def test_openai_model_only_reachable_by_chat(hass: HomeAssistant) -> None:
    """A server without /models routes is checked with a tiny chat request."""
    async with OpenAIPeer(serve_models=False) as peer:
        result = await start_brain(hass, BRAIN_OPENAI)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"],
            {
                CONF_NAME: DEFAULT_NAME,
                CONF_BASE_URL: peer.base_url,
                CONF_MODEL: PEER_MODEL,
            },
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY
        assert [request.model for request in peer.requests] == [PEER_MODEL]


@pytest.mark.parametrize(
    ("api_key", "model", "error"),
    [
        ("sk-wrong", PEER_MODEL, "invalid_auth"),
        (None, PEER_MODEL, "invalid_auth"),
        (PEER_API_KEY, "no-such-model", "model_not_found"),
    ],
)
async def test_openai_rejected_then_fixed(
    hass: HomeAssistant,
    openai_peer: OpenAIPeer,
    api_key: str | None,
    model: str,
    error: str,
) -> None:
    """What the server rejects is shown as a form error; fixed input then succeeds."""
    result = await start_brain(hass, BRAIN_OPENAI)
    user_input = {
        CONF_NAME: DEFAULT_NAME,
        CONF_BASE_URL: openai_peer.base_url,
        CONF_MODEL: model,
    }
    if api_key is not None:
        user_input[CONF_API_KEY] = api_key
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], user_input
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": error}
    assert_translated(result)
    # The form keeps what the user typed.
    assert suggested(result, CONF_MODEL) == model
    assert not hass.config_entries.async_entries(DOMAIN)

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {**user_input, CONF_API_KEY: PEER_API_KEY, CONF_MODEL: PEER_MODEL},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["data"][CONF_API_KEY] == PEER_API_KEY


async def test_openai_cannot_connect(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Nothing listening at the URL (the peer was stopped): cannot_connect."""
    base_url = openai_peer.base_url
    await openai_peer.stop()
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: DEFAULT_NAME,
            CONF_BASE_URL: base_url,
            CONF_API_KEY: PEER_API_KEY,
            CONF_MODEL: PEER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    assert_translated(result)


@pytest.mark.usefixtures("socket_enabled")
async def test_openai_unexpected_error_logs_a_redacted_url(
    hass: HomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    """User info of the base URL never reaches our log (query: see redact tests)."""
    async with OpenAIPeer(serve_models=False) as peer:
        peer.enqueue(Fail(429, "Too many requests"))
        url = URL(peer.base_url).with_user("alice").with_password("url-secret")
        result = await start_brain(hass, BRAIN_OPENAI)
        with caplog.at_level(logging.DEBUG):
            result = await hass.config_entries.flow.async_configure(
                result["flow_id"],
                {
                    CONF_NAME: DEFAULT_NAME,
                    CONF_BASE_URL: str(url),
                    CONF_MODEL: PEER_MODEL,
                },
            )
    assert result["errors"] == {"base": "unknown"}
    ours = [r for r in caplog.records if r.name.startswith("custom_components")]
    (logged,) = [r.getMessage() for r in ours if r.levelno >= logging.ERROR]
    assert f"at {peer.base_url}" in logged
    for record in ours:
        assert "url-secret" not in record.getMessage()
        assert "alice" not in record.getMessage()


@pytest.mark.usefixtures("socket_enabled")
@pytest.mark.parametrize("secret", ["sk-very-secret-key-987654", None])
async def test_openai_unexpected_error_logged_without_key(
    hass: HomeAssistant, caplog: pytest.LogCaptureFixture, secret: str | None
) -> None:
    """Any other failure is "unknown", logged with the traceback but not the key."""
    async with OpenAIPeer(serve_models=False) as peer:
        # A rate-limit answer that even echoes the key back.
        peer.enqueue(Fail(429, f"Too many requests for key {secret}"))
        result = await start_brain(hass, BRAIN_OPENAI)
        user_input = {
            CONF_NAME: DEFAULT_NAME,
            CONF_BASE_URL: peer.base_url,
            CONF_MODEL: PEER_MODEL,
        }
        if secret is not None:
            user_input[CONF_API_KEY] = secret
        with caplog.at_level(logging.DEBUG):
            result = await hass.config_entries.flow.async_configure(
                result["flow_id"], user_input
            )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "unknown"}
    assert_translated(result)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    logged = errors[0].getMessage()
    assert "Unexpected error" in logged
    assert "Traceback" in logged  # the whole chain, for bug reports
    assert "RateLimitError" in logged
    if secret is not None:
        assert "Too many requests for key ***" in logged
        assert secret not in caplog.text
    else:
        assert "Too many requests for key None" in logged


@pytest.mark.parametrize(
    ("base_url", "model", "errors"),
    [
        ("api.openai.com/v1", PEER_MODEL, {CONF_BASE_URL: "invalid_url"}),
        ("ftp://example.com/v1", PEER_MODEL, {CONF_BASE_URL: "invalid_url"}),
        ("http:///v1", PEER_MODEL, {CONF_BASE_URL: "invalid_url"}),
        (
            "not a url",
            "  ",
            {CONF_BASE_URL: "invalid_url", CONF_MODEL: "model_required"},
        ),
        ("http://127.0.0.1:1/v1", "", {CONF_MODEL: "model_required"}),
    ],
)
async def test_openai_bad_fields_need_no_network(
    hass: HomeAssistant, base_url: str, model: str, errors: dict[str, str]
) -> None:
    """Malformed URL or empty model is refused before any request is made.

    Sockets stay disabled in this test: a connection attempt would raise.
    """
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_NAME: DEFAULT_NAME, CONF_BASE_URL: base_url, CONF_MODEL: model},
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == errors
    assert_translated(result)


async def test_openai_duplicate_aborts(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The same base URL (trailing slash ignored) and model cannot be added twice."""
    openai_entry(openai_peer.base_url).add_to_hass(hass)
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Again",
            CONF_BASE_URL: f"{openai_peer.base_url}/",
            CONF_API_KEY: PEER_API_KEY,
            CONF_MODEL: PEER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert_translated(result)
    assert len(hass.config_entries.async_entries(DOMAIN)) == 1


async def test_openai_same_server_other_model_is_allowed(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Uniqueness is per (URL, model): another model on the same server is new."""
    openai_peer.models.add(OTHER_MODEL)
    openai_entry(openai_peer.base_url).add_to_hass(hass)
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: "Other",
            CONF_BASE_URL: openai_peer.base_url,
            CONF_API_KEY: PEER_API_KEY,
            CONF_MODEL: OTHER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["result"].unique_id == f"{openai_peer.base_url}|{OTHER_MODEL}"


# -- user flow: Home Assistant conversation agent ----------------------------------------


async def test_ha_agent_form_defaults_to_builtin_agent(hass: HomeAssistant) -> None:
    """The agent form pre-selects the built-in intent agent."""
    result = await start_brain(hass, BRAIN_HA_AGENT)
    assert fields(result) == {CONF_NAME, CONF_AGENT_ID, CONF_CREATE_ASSISTANT}
    assert (
        suggested(result, CONF_AGENT_ID)
        == DEFAULT_AGENT_ID
        == ("conversation.home_assistant")
    )
    assert suggested(result, CONF_NAME) == DEFAULT_NAME


async def test_ha_agent_creates_entry(
    hass: HomeAssistant, mock_setup_entry: AsyncMock
) -> None:
    """The built-in agent needs no network check and gets the agent options."""
    result = await start_brain(hass, BRAIN_HA_AGENT)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_NAME: "Offline", CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == "Offline"
    assert result["data"] == {
        CONF_BRAIN: BRAIN_HA_AGENT,
        CONF_AGENT_ID: DEFAULT_AGENT_ID,
        CONF_CREATE_ASSISTANT: True,
    }
    assert result["options"] == DEFAULT_OPTIONS_HA_AGENT
    assert CONF_LLM_HASS_API not in result["options"]
    assert result["result"].unique_id == f"ha_agent:{DEFAULT_AGENT_ID}"
    assert len(mock_setup_entry.mock_calls) == 1


async def test_ha_agent_blank_name_falls_back(hass: HomeAssistant) -> None:
    """A blank name becomes the default title."""
    result = await start_brain(hass, BRAIN_HA_AGENT)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_NAME: "", CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == DEFAULT_NAME


async def test_ha_agent_unknown_agent(hass: HomeAssistant) -> None:
    """An agent that does not exist is refused; a valid one then succeeds."""
    result = await start_brain(hass, BRAIN_HA_AGENT)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_NAME: DEFAULT_NAME, CONF_AGENT_ID: "conversation.does_not_exist"},
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {CONF_AGENT_ID: "agent_not_found"}
    assert_translated(result)
    assert suggested(result, CONF_AGENT_ID) == "conversation.does_not_exist"

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_NAME: DEFAULT_NAME, CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY


async def test_ha_agent_refuses_own_agent(
    hass: HomeAssistant, entity_registry: er.EntityRegistry
) -> None:
    """Delegating to a Realtime Voice agent would loop: refused."""
    own = entity_registry.async_get_or_create(
        "conversation", DOMAIN, "some-entry", suggested_object_id="realtime_voice"
    )
    result = await start_brain(hass, BRAIN_HA_AGENT)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_NAME: DEFAULT_NAME, CONF_AGENT_ID: own.entity_id}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {CONF_AGENT_ID: "agent_is_self"}
    assert_translated(result)


async def test_ha_agent_duplicate_aborts(hass: HomeAssistant) -> None:
    """The same agent cannot be added twice."""
    agent_entry(DEFAULT_AGENT_ID).add_to_hass(hass)
    result = await start_brain(hass, BRAIN_HA_AGENT)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_NAME: "Again", CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert_translated(result)


# -- reauth --------------------------------------------------------------------------------


async def test_reauth_replaces_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer, mock_setup_entry: AsyncMock
) -> None:
    """A wrong new key is refused; a valid one is stored and the entry reloads."""
    entry = openai_entry(openai_peer.base_url, api_key=OLD_KEY)
    entry.add_to_hass(hass)
    result = await entry.start_reauth_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reauth_confirm"
    assert fields(result) == {CONF_API_KEY}
    assert result["description_placeholders"] == {
        "name": "Peer",
        "base_url": openai_peer.base_url,
        "model": PEER_MODEL,
    }
    assert_translated(result)

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: "sk-still-wrong"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "invalid_auth"}
    assert_translated(result)
    assert entry.data[CONF_API_KEY] == OLD_KEY

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: f"{PEER_API_KEY}\n"}
    )
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reauth_successful"
    assert_translated(result)
    assert dict(entry.data) == {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: openai_peer.base_url,
        CONF_MODEL: PEER_MODEL,
        CONF_API_KEY: PEER_API_KEY,
    }
    assert entry.unique_id == openai_unique_id(openai_peer.base_url, PEER_MODEL)
    assert len(mock_setup_entry.mock_calls) == 1  # reloaded with the new key


async def test_reauth_server_down(hass: HomeAssistant, openai_peer: OpenAIPeer) -> None:
    """An unreachable server during reauth is cannot_connect; nothing is stored."""
    entry = openai_entry(openai_peer.base_url, api_key=OLD_KEY)
    entry.add_to_hass(hass)
    await openai_peer.stop()
    result = await entry.start_reauth_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: PEER_API_KEY}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    assert entry.data[CONF_API_KEY] == OLD_KEY


async def test_reauth_not_for_agent_entries(hass: HomeAssistant) -> None:
    """An agent entry has no key: its reauth flow aborts with an explanation."""
    entry = agent_entry(DEFAULT_AGENT_ID)
    entry.add_to_hass(hass)
    result = await entry.start_reauth_flow(hass)
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reauth_not_supported"
    assert_translated(result)


# -- reconfigure: endpoint -----------------------------------------------------------------


async def test_reconfigure_openai_form(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """The form pre-fills URL and model but never sends the stored key out."""
    entry = openai_entry(openai_peer.base_url, api_key=PEER_API_KEY)
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure_openai"
    assert fields(result) == {CONF_BASE_URL, CONF_API_KEY, CONF_MODEL}
    assert suggested(result, CONF_BASE_URL) == openai_peer.base_url
    assert suggested(result, CONF_MODEL) == PEER_MODEL
    assert suggested(result, CONF_API_KEY) is None
    assert PEER_API_KEY not in repr(result)
    assert_translated(result)


async def test_reconfigure_openai_model_keeps_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer, mock_setup_entry: AsyncMock
) -> None:
    """Same server, other model, key left empty: the stored key is kept and used."""
    openai_peer.models.add(OTHER_MODEL)
    entry = openai_entry(openai_peer.base_url, api_key=PEER_API_KEY)
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_BASE_URL: f"{openai_peer.base_url}/", CONF_MODEL: OTHER_MODEL},
    )
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert_translated(result)
    assert dict(entry.data) == {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: openai_peer.base_url,
        CONF_MODEL: OTHER_MODEL,
        CONF_API_KEY: PEER_API_KEY,
    }
    assert entry.unique_id == f"{openai_peer.base_url}|{OTHER_MODEL}"
    assert len(mock_setup_entry.mock_calls) == 1


async def test_reconfigure_openai_new_server_never_gets_old_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Moving to another server with the key left empty does not send the old key.

    The new server accepts exactly the old key, so carrying it over would pass; it
    must fail instead, and succeed once the user types a key.
    """
    entry = openai_entry(openai_peer.base_url, api_key=OLD_KEY)
    entry.add_to_hass(hass)
    async with OpenAIPeer(api_key=OLD_KEY) as other:
        result = await entry.start_reconfigure_flow(hass)
        new = {CONF_BASE_URL: other.base_url, CONF_MODEL: PEER_MODEL}
        result = await hass.config_entries.flow.async_configure(result["flow_id"], new)
        assert result["type"] is FlowResultType.FORM
        assert result["errors"] == {"base": "invalid_auth"}
        assert_translated(result)
        assert suggested(result, CONF_BASE_URL) == other.base_url

        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {**new, CONF_API_KEY: OLD_KEY}
        )
        assert result["type"] is FlowResultType.ABORT
        assert result["reason"] == "reconfigure_successful"
    assert entry.data[CONF_BASE_URL] == other.base_url
    assert entry.data[CONF_API_KEY] == OLD_KEY
    assert entry.unique_id == openai_unique_id(other.base_url, PEER_MODEL)


async def test_reconfigure_openai_to_keyless_server_drops_key(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A new server that needs no key: the stored key is removed from the entry."""
    entry = openai_entry(openai_peer.base_url, api_key=PEER_API_KEY)
    entry.add_to_hass(hass)
    async with OpenAIPeer() as keyless:
        result = await entry.start_reconfigure_flow(hass)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"],
            {CONF_BASE_URL: keyless.base_url, CONF_MODEL: PEER_MODEL},
        )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert dict(entry.data) == {
        CONF_BRAIN: BRAIN_OPENAI,
        CONF_BASE_URL: keyless.base_url,
        CONF_MODEL: PEER_MODEL,
    }


async def test_reconfigure_openai_errors_keep_entry(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Bad URL, unknown model and a dead server are form errors; nothing changes."""
    entry = openai_entry(openai_peer.base_url, api_key=PEER_API_KEY)
    entry.add_to_hass(hass)
    before = dict(entry.data)
    result = await entry.start_reconfigure_flow(hass)
    flow_id = result["flow_id"]

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_BASE_URL: "localhost:11434", CONF_MODEL: PEER_MODEL}
    )
    assert result["errors"] == {CONF_BASE_URL: "invalid_url"}
    assert_translated(result)

    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_BASE_URL: openai_peer.base_url, CONF_MODEL: "gone-model"}
    )
    assert result["errors"] == {"base": "model_not_found"}

    base_url = openai_peer.base_url
    await openai_peer.stop()
    result = await hass.config_entries.flow.async_configure(
        flow_id, {CONF_BASE_URL: base_url, CONF_MODEL: PEER_MODEL}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    assert dict(entry.data) == before
    assert entry.unique_id == openai_unique_id(base_url, PEER_MODEL)


async def test_reconfigure_openai_collision_aborts(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """Reconfiguring onto another entry's URL and model is refused."""
    openai_peer.models.add(OTHER_MODEL)
    taken = openai_entry(openai_peer.base_url, model=OTHER_MODEL, title="Taken")
    taken.add_to_hass(hass)
    entry = openai_entry(openai_peer.base_url, api_key=PEER_API_KEY)
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_BASE_URL: openai_peer.base_url, CONF_MODEL: OTHER_MODEL},
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert_translated(result)
    assert entry.data[CONF_MODEL] == PEER_MODEL
    assert entry.unique_id == openai_unique_id(openai_peer.base_url, PEER_MODEL)


# -- reconfigure: agent ------------------------------------------------------------------


async def test_reconfigure_agent(
    hass: HomeAssistant, mock_setup_entry: AsyncMock
) -> None:
    """An entry whose agent is gone is pointed at the built-in agent."""
    entry = agent_entry("conversation.removed_agent")
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure_ha_agent"
    assert fields(result) == {CONF_AGENT_ID}
    assert suggested(result, CONF_AGENT_ID) == "conversation.removed_agent"
    assert_translated(result)

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_AGENT_ID: "conversation.also_missing"}
    )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {CONF_AGENT_ID: "agent_not_found"}
    assert suggested(result, CONF_AGENT_ID) == "conversation.also_missing"
    assert_translated(result)

    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "reconfigure_successful"
    assert dict(entry.data) == {
        CONF_BRAIN: BRAIN_HA_AGENT,
        CONF_AGENT_ID: DEFAULT_AGENT_ID,
    }
    assert entry.unique_id == ha_agent_unique_id(DEFAULT_AGENT_ID)
    assert len(mock_setup_entry.mock_calls) == 1


async def test_reconfigure_agent_collision_aborts(hass: HomeAssistant) -> None:
    """Reconfiguring onto an agent another entry uses is refused."""
    agent_entry(DEFAULT_AGENT_ID, title="Taken").add_to_hass(hass)
    entry = agent_entry("conversation.removed_agent")
    entry.add_to_hass(hass)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_AGENT_ID: DEFAULT_AGENT_ID}
    )
    assert result["type"] is FlowResultType.ABORT
    assert result["reason"] == "already_configured"
    assert entry.data[CONF_AGENT_ID] == "conversation.removed_agent"


# -- options ---------------------------------------------------------------------------


async def test_options_openai(hass: HomeAssistant) -> None:
    """The endpoint brain offers every option, pre-filled from the entry."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    result = await open_settings(hass, entry)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "init"
    assert_translated(result, "options")
    assert fields(result) == {
        CONF_PROMPT,
        CONF_LLM_HASS_API,
        CONF_CONTEXT_WINDOW,
        CONF_MAX_TOOL_TURNS,
        CONF_MAX_ANSWER_CHARS,
        CONF_TEMPERATURE,
        CONF_FIRST_TOKEN_TIMEOUT,
        CONF_CHUNK_TIMEOUT,
        CONF_IDLE_TIMEOUT,
        CONF_CARRY_OVER,
    }
    for key, value in DEFAULT_OPTIONS_OPENAI.items():
        assert suggested(result, key) == value, key
    schema = result["data_schema"]
    assert schema is not None
    api_selector = schema.schema[
        next(k for k in schema.schema if str(k) == CONF_LLM_HASS_API)
    ]
    api_ids = [option["value"] for option in api_selector.config["options"]]
    assert api_ids[0] == LLM_API_NONE
    assert DEFAULT_LLM_HASS_API in api_ids

    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {
            CONF_PROMPT: "  You are {{ 'terse' }}.  ",
            CONF_LLM_HASS_API: LLM_API_NONE,
            CONF_CONTEXT_WINDOW: 16000.0,
            CONF_MAX_TOOL_TURNS: 5.0,
            CONF_MAX_ANSWER_CHARS: 2000.0,
            CONF_TEMPERATURE: 0.2,
            CONF_FIRST_TOKEN_TIMEOUT: 120.0,
            CONF_CHUNK_TIMEOUT: 5.0,
            CONF_IDLE_TIMEOUT: 60.0,
            CONF_CARRY_OVER: False,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    expected = {
        CONF_PROMPT: "You are {{ 'terse' }}.",
        CONF_LLM_HASS_API: LLM_API_NONE,
        CONF_CONTEXT_WINDOW: 16000,
        CONF_MAX_TOOL_TURNS: 5,
        CONF_MAX_ANSWER_CHARS: 2000,
        CONF_TEMPERATURE: 0.2,
        CONF_FIRST_TOKEN_TIMEOUT: 120,
        CONF_CHUNK_TIMEOUT: 5,
        CONF_IDLE_TIMEOUT: 60,
        CONF_CARRY_OVER: False,
    }
    assert dict(entry.options) == expected
    for key in (CONF_CONTEXT_WINDOW, CONF_MAX_TOOL_TURNS, CONF_IDLE_TIMEOUT):
        assert type(entry.options[key]) is int

    # Reopened, the form shows what was stored.
    result = await open_settings(hass, entry)
    for key, value in expected.items():
        assert suggested(result, key) == value, key


async def test_options_empty_prompt_means_builtin(hass: HomeAssistant) -> None:
    """Clearing the prompt (the field is then absent) stores the empty default."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        entry, options={**entry.options, CONF_PROMPT: "old prompt"}
    )
    result = await open_settings(hass, entry)
    assert suggested(result, CONF_PROMPT) == "old prompt"
    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {
            CONF_LLM_HASS_API: DEFAULT_LLM_HASS_API,
            CONF_CONTEXT_WINDOW: 8000,
            CONF_MAX_TOOL_TURNS: 8,
            CONF_TEMPERATURE: 0.7,
            CONF_IDLE_TIMEOUT: 300,
            CONF_CARRY_OVER: True,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert dict(entry.options) == DEFAULT_OPTIONS_OPENAI


async def test_options_missing_api_falls_back_to_assist(hass: HomeAssistant) -> None:
    """An LLM API that no longer exists is not offered; Assist is suggested."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(
        entry, options={**entry.options, CONF_LLM_HASS_API: "removed_api"}
    )
    result = await open_settings(hass, entry)
    assert suggested(result, CONF_LLM_HASS_API) == DEFAULT_LLM_HASS_API
    with pytest.raises(InvalidData):
        await hass.config_entries.options.async_configure(
            result["flow_id"],
            {
                CONF_LLM_HASS_API: "removed_api",
                CONF_CONTEXT_WINDOW: 8000,
                CONF_MAX_TOOL_TURNS: 0,
                CONF_TEMPERATURE: 0.7,
                CONF_IDLE_TIMEOUT: 300,
                CONF_CARRY_OVER: True,
            },
        )


async def test_options_entry_without_stored_options(hass: HomeAssistant) -> None:
    """An entry with no options yet shows the defaults."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    hass.config_entries.async_update_entry(entry, options={})
    result = await open_settings(hass, entry)
    for key, value in DEFAULT_OPTIONS_OPENAI.items():
        assert suggested(result, key) == value, key


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (CONF_CONTEXT_WINDOW, 999),
        (CONF_CONTEXT_WINDOW, 200001),
        (CONF_MAX_TOOL_TURNS, -1),
        (CONF_MAX_TOOL_TURNS, 26),
        (CONF_MAX_ANSWER_CHARS, 99),
        (CONF_TEMPERATURE, 2.1),
        (CONF_IDLE_TIMEOUT, 9),
        (CONF_IDLE_TIMEOUT, 3601),
        (CONF_PROMPT, "{{ unclosed"),
    ],
)
async def test_options_out_of_range_rejected(
    hass: HomeAssistant, field: str, value: Any
) -> None:
    """Values outside the documented ranges (or a broken template) are refused."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    result = await open_settings(hass, entry)
    with pytest.raises((InvalidData, vol.Invalid)):
        await hass.config_entries.options.async_configure(
            result["flow_id"], {**DEFAULT_OPTIONS_OPENAI, field: value}
        )
    assert dict(entry.options) == DEFAULT_OPTIONS_OPENAI


async def test_options_ha_agent_hides_model_options(hass: HomeAssistant) -> None:
    """The agent brain only offers prompt, idle timeout and carry-over."""
    entry = agent_entry(DEFAULT_AGENT_ID)
    entry.add_to_hass(hass)
    result = await open_settings(hass, entry)
    assert result["type"] is FlowResultType.FORM
    assert_translated(result, "options")
    assert fields(result) == {CONF_PROMPT, CONF_IDLE_TIMEOUT, CONF_CARRY_OVER}
    for key, value in DEFAULT_OPTIONS_HA_AGENT.items():
        assert suggested(result, key) == value, key

    result = await hass.config_entries.options.async_configure(
        result["flow_id"],
        {
            CONF_PROMPT: "Answer in French.",
            CONF_IDLE_TIMEOUT: 45,
            CONF_CARRY_OVER: False,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert dict(entry.options) == {
        CONF_PROMPT: "Answer in French.",
        CONF_IDLE_TIMEOUT: 45,
        CONF_CARRY_OVER: False,
    }


# -- what the lists offer, titles (issue 12, item 13) ------------------------------------


async def test_second_entry_gets_a_distinct_title(
    hass: HomeAssistant, openai_peer: OpenAIPeer, mock_setup_entry: AsyncMock
) -> None:
    """Default names collide: the second entry is named after its model or agent."""
    agent_entry(DEFAULT_AGENT_ID, title=DEFAULT_NAME).add_to_hass(hass)
    result = await start_brain(hass, BRAIN_OPENAI)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {
            CONF_NAME: DEFAULT_NAME,
            CONF_BASE_URL: openai_peer.base_url,
            CONF_API_KEY: PEER_API_KEY,
            CONF_MODEL: PEER_MODEL,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    assert result["title"] == f"{DEFAULT_NAME} ({PEER_MODEL})"
    assert distinct_title(hass, DEFAULT_NAME, PEER_MODEL) == (
        f"{DEFAULT_NAME} ({PEER_MODEL}) 2"
    )
    assert distinct_title(hass, "Kitchen", PEER_MODEL) == "Kitchen"


# -- numeric options say their range (issue 12, item 14) ---------------------------------


async def test_numeric_options_describe_their_range(hass: HomeAssistant) -> None:
    """Every number field's helper text states its range and default, as the form has."""
    entry = openai_entry(DEFAULT_BASE_URL)
    entry.add_to_hass(hass)
    result = await open_settings(hass, entry)
    descriptions = TRANSLATIONS["options"]["step"]["init"]["data_description"]
    numbers = {
        str(key): (selector.config, key.default())
        for key, selector in result["data_schema"].schema.items()
        if isinstance(selector, NumberSelector)
    }
    assert len(numbers) == 7
    for field, (config, default) in numbers.items():
        expected = f"({config['min']:g} to {config['max']:g}, default {default:g})"
        assert expected in descriptions[field], field


# -- why a connection check failed (issue 12, items 3) -----------------------------------


@contextlib.asynccontextmanager
async def raw_server(reply: bytes | None) -> AsyncIterator[str]:
    """Run a loopback TCP server answering every request with ``reply`` (None: never).

    Stands for a broken model server (HTTP 503) or a hung one; yields its base URL.
    """
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if reply is None:
            held.append(writer)  # keep the connection open, say nothing
            return
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def free_port() -> int:
    """Return a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.usefixtures("socket_enabled")
@pytest.mark.parametrize(
    ("server", "cause"),
    [
        ("dns", "the host name cannot be resolved"),
        ("refused", "the connection was refused: nothing listens on that port"),
        ("hung", "no answer within 0.05 s"),
        ("http_503", "the server failed with HTTP 503"),
    ],
)
async def test_connection_errors_say_why(
    hass: HomeAssistant,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    server: str,
    cause: str,
) -> None:
    """DNS, refused port, timeout and HTTP 5xx: the form and the debug log say which."""
    monkeypatch.setattr(brain_check, "VALIDATION_TIMEOUT", 0.05)
    caplog.set_level(logging.DEBUG, logger="custom_components.rtvoice")
    reply = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
    async with raw_server(None if server == "hung" else reply) as served:
        base_url = {
            "dns": "http://rtvoice-test.invalid:8000/v1",
            "refused": f"http://127.0.0.1:{free_port()}/v1",
        }.get(server, served)
        result = await start_brain(hass, BRAIN_OPENAI)
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"],
            {
                CONF_NAME: DEFAULT_NAME,
                CONF_BASE_URL: base_url,
                CONF_API_KEY: PEER_API_KEY,
                CONF_MODEL: PEER_MODEL,
            },
        )
    assert result["errors"] == {"base": "cannot_connect"}
    assert result["description_placeholders"] == {"error": cause}
    message = TRANSLATIONS["config"]["error"]["cannot_connect"]
    assert "{error}" in message
    logged = [r for r in caplog.records if r.name.startswith("custom_components")]
    assert [r.levelno for r in logged] == [logging.DEBUG]
    assert cause in logged[0].getMessage()
    assert PEER_API_KEY not in caplog.text
