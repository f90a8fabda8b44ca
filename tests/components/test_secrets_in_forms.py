"""Secrets in the UI (issue 16 §4): forms, unique ids and the validation deadline.

A base URL may carry credentials (``http://user:pass@host/v1?api-key=…``). The reauth
and reconfigure forms go to the browser: they show the URL redacted, and the
redacted URL sent back unchanged keeps the stored one. Unique ids are stored and
shown in the clear: they never hold the URL's secrets, and entries made before
(minor version 1) are migrated. The connection check has one overall deadline: an
endpoint that trickles its answer a byte at a time ends the form with the translated
``cannot_connect`` error, its cause "no answer within … s". The check itself is replaced by a recorder where the test is about what
the flow does with the URL (the loopback peer takes no credentials in the URL).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
from typing import Any
from unittest.mock import AsyncMock

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice import brain_check, config_flow
from custom_components.rtvoice.const import (
    BRAIN_OPENAI,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_MODEL,
    CONF_NAME,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
)
from homeassistant.config_entries import SOURCE_USER
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from tests.components.test_config_flow import assert_translated, suggested

SECRET_URL = "http://alice:hunter2@127.0.0.1:9/v1?api-key=sk-in-the-url"
SECRETS = ("alice", "hunter2", "sk-in-the-url")
MODEL = "gpt-test"
SAFETY = 30.0


def secret_entry(hass: HomeAssistant, **kwargs: Any) -> MockConfigEntry:
    """Add an endpoint entry whose base URL holds credentials."""
    entry = MockConfigEntry(
        domain=DOMAIN,
        title="Secret",
        data={
            CONF_BRAIN: BRAIN_OPENAI,
            CONF_BASE_URL: SECRET_URL,
            CONF_MODEL: MODEL,
            CONF_API_KEY: "sk-stored",
        },
        options=dict(DEFAULT_OPTIONS_OPENAI),
        unique_id=brain_check.openai_unique_id(SECRET_URL, MODEL),
        minor_version=2,
        **kwargs,
    )
    entry.add_to_hass(hass)
    return entry


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Replace the connection check: record (base_url, api_key), accept."""
    calls: list[tuple[str, str]] = []

    async def check(
        hass: HomeAssistant, base_url: str, api_key: str, model: str
    ) -> tuple[dict[str, str], dict[str, str]]:
        calls.append((base_url, api_key))
        return {}, {}

    monkeypatch.setattr(config_flow, "async_validate_openai", check)
    return calls


def assert_no_secret(value: Any) -> None:
    """Fail if any of the URL's secrets is in ``repr(value)``."""
    text = repr(value)
    for secret in SECRETS:
        assert secret not in text, secret


async def test_reauth_form_shows_the_url_redacted(
    hass: HomeAssistant, checked: list[tuple[str, str]], mock_setup_entry: AsyncMock
) -> None:
    """The reauth form names the endpoint without its credentials."""
    entry = secret_entry(hass)
    result = await entry.start_reauth_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reauth_confirm"
    assert_translated(result)
    assert_no_secret(result)
    assert "127.0.0.1:9/v1" in result["description_placeholders"]["base_url"]
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_API_KEY: "sk-new"}
    )
    assert result["reason"] == "reauth_successful"
    assert checked == [(SECRET_URL, "sk-new")]  # checked against the stored URL


async def test_reconfigure_sends_the_url_redacted_and_keeps_it_when_unchanged(
    hass: HomeAssistant, checked: list[tuple[str, str]], mock_setup_entry: AsyncMock
) -> None:
    """The redacted URL goes out; sent back unchanged, the stored URL and key stay."""
    entry = secret_entry(hass)
    result = await entry.start_reconfigure_flow(hass)
    assert result["type"] is FlowResultType.FORM
    assert result["step_id"] == "reconfigure_openai"
    assert_no_secret(result)
    shown = suggested(result, CONF_BASE_URL)
    assert shown == "http://***:***@127.0.0.1:9/v1?api-key=***"
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {CONF_BASE_URL: shown, CONF_MODEL: "other-model"}
    )
    await hass.async_block_till_done()
    assert result["reason"] == "reconfigure_successful"
    assert checked == [(SECRET_URL, "sk-stored")]
    assert entry.data[CONF_BASE_URL] == SECRET_URL
    assert entry.data[CONF_API_KEY] == "sk-stored"
    assert entry.data[CONF_MODEL] == "other-model"
    assert_no_secret(entry.unique_id)


async def test_reconfigure_with_a_new_url_takes_it(
    hass: HomeAssistant, checked: list[tuple[str, str]], mock_setup_entry: AsyncMock
) -> None:
    """An edited URL is the new URL (and the stored key does not follow it)."""
    entry = secret_entry(hass)
    result = await entry.start_reconfigure_flow(hass)
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_BASE_URL: "http://127.0.0.1:10/v1", CONF_MODEL: MODEL},
    )
    await hass.async_block_till_done()
    assert result["reason"] == "reconfigure_successful"
    assert checked == [("http://127.0.0.1:10/v1", "")]
    assert entry.data[CONF_BASE_URL] == "http://127.0.0.1:10/v1"


async def test_new_entry_unique_id_holds_no_secret(
    hass: HomeAssistant, checked: list[tuple[str, str]], mock_setup_entry: AsyncMock
) -> None:
    """The user flow's entry: the URL with its credentials in data, not in the id."""
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"next_step_id": BRAIN_OPENAI}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"],
        {CONF_NAME: "Secret", CONF_BASE_URL: SECRET_URL, CONF_MODEL: MODEL},
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    entry = result["result"]
    assert entry.data[CONF_BASE_URL] == SECRET_URL
    assert entry.unique_id == f"http://127.0.0.1:9/v1|{MODEL}"


async def test_old_entries_are_migrated_to_unique_ids_without_secrets(
    hass: HomeAssistant, mock_setup_entry: AsyncMock
) -> None:
    """1.1 entries had the raw URL in their unique id; setup migrates them to 1.2."""
    old = MockConfigEntry(
        domain=DOMAIN,
        title="Old",
        data={CONF_BRAIN: BRAIN_OPENAI, CONF_BASE_URL: SECRET_URL, CONF_MODEL: MODEL},
        options=dict(DEFAULT_OPTIONS_OPENAI),
        unique_id=f"{SECRET_URL}|{MODEL}",
        version=1,
        minor_version=1,
    )
    old.add_to_hass(hass)
    # A second old entry that differs only in the URL's secrets.
    twin_url = SECRET_URL.replace("hunter2", "other")
    twin = MockConfigEntry(
        domain=DOMAIN,
        title="Twin",
        data={CONF_BRAIN: BRAIN_OPENAI, CONF_BASE_URL: twin_url, CONF_MODEL: MODEL},
        options=dict(DEFAULT_OPTIONS_OPENAI),
        unique_id=f"{twin_url}|{MODEL}",
        version=1,
        minor_version=1,
    )
    twin.add_to_hass(hass)
    assert await hass.config_entries.async_setup(old.entry_id)  # sets up both
    await hass.async_block_till_done()
    assert old.minor_version == twin.minor_version == 3  # 1.3: satellites too
    assert old.unique_id == f"http://127.0.0.1:9/v1|{MODEL}"
    assert twin.unique_id == f"http://127.0.0.1:9/v1|{MODEL}|{twin.entry_id}"
    assert_no_secret((old.unique_id, twin.unique_id))
    assert old.data[CONF_BASE_URL] == SECRET_URL  # the stored URL itself is kept


@contextlib.asynccontextmanager
async def trickling_endpoint() -> AsyncIterator[str]:
    """Serve HTTP answers at one byte every 0.2 s (the endpoint's pace); yield its URL."""
    tasks: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n"
            )
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.2)  # the endpoint's pace, not a synchronisation

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(AttributeError):
            server.close_clients()
        await server.wait_closed()


@pytest.mark.usefixtures("socket_enabled")
async def test_validation_has_one_overall_deadline(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trickling endpoint ends the form with a translated timeout, not a hang."""
    monkeypatch.setattr(brain_check, "VALIDATION_TIMEOUT", 1.0)
    async with trickling_endpoint() as base_url:
        result = await hass.config_entries.flow.async_init(
            DOMAIN, context={"source": SOURCE_USER}
        )
        result = await hass.config_entries.flow.async_configure(
            result["flow_id"], {"next_step_id": BRAIN_OPENAI}
        )
        async with asyncio.timeout(SAFETY):
            result = await hass.config_entries.flow.async_configure(
                result["flow_id"],
                {CONF_NAME: "Slow", CONF_BASE_URL: base_url, CONF_MODEL: MODEL},
            )
    assert result["type"] is FlowResultType.FORM
    assert result["errors"] == {"base": "cannot_connect"}
    assert result["description_placeholders"] == {"error": "no answer within 1 s"}
    assert_translated(result)
