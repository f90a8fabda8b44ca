"""A new user's first hour (issue 17): the assistant, the words on the forms.

Item → test:
- 1, 2: adding the integration creates a "Realtime Voice" assistant that uses the
  entry's agent, the preferred assistant's speech engines and "Prefer handling
  commands locally" off → ``test_adding_the_entry_creates_its_assistant_once``,
  ``test_no_assistant_when_the_user_says_no``,
  ``test_an_assistant_the_user_changed_is_never_touched``;
- 8: no stray spaces around option names, step titles that fit the dialog →
  ``test_form_texts_have_no_inline_code``, ``test_step_titles_fit_the_dialog``;
- 9 (the preamble before a tool) → tests/duplex/test_tool_preamble.py,
  tests/components/test_tool_preamble.py, tests/kernel/test_round_hooks.py;
- 6 (the development instance offline) → tests/components/test_dev_instance.py;
- the walk of README's first use in a browser (satellites as subentries): texts send
  the user to a satellite's row, not to the options or a "Reconfigure" it lacks →
  ``test_texts_send_satellite_changes_to_its_row``.
"""

from __future__ import annotations

import json
from pathlib import Path
import re
from typing import Any

from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_CREATE_ASSISTANT,
    CONF_NAME,
    DOMAIN,
)
from homeassistant.components.assist_pipeline import (
    async_get_pipeline,
    async_get_pipelines,
    async_update_pipeline,
)
from homeassistant.config_entries import SOURCE_USER
from homeassistant.data_entry_flow import FlowResultType
from tests.components.pipeline.helpers import STT_ENTITY, TTS_ENTITY, Home

TRANSLATIONS = (
    Path(__file__).parents[2]
    / "custom_components"
    / DOMAIN
    / "translations"
    / "en.json"
)
AGENT = "conversation.realtime_voice"
# The longest step title the frontend's dialog shows uncut at its usual width
# ("Take over an ESPHome satellite (duplex, pre…" was cut at 44).
TITLE_MAX = 40
# Where texts used to send the user for a satellite: the options menu (gone since
# satellites are subentries) and "Reconfigure", which a satellite's row does not
# show (Home Assistant 2025.4: a "Configure" button, newer: a cog; ⋮ → Delete).
STALE_SATELLITE_WAYS = re.compile(
    r"Realtime Voice's options|its options|Remove a (duplex |Wyoming )?satellite"
    r"|with Reconfigure|add, reconfigure and delete",
    re.IGNORECASE,
)


async def add_entry(home: Home, *, create_assistant: bool | None) -> Any:
    """Add Realtime Voice (built-in agent brain) through the config flow."""
    hass = home.hass
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": SOURCE_USER}
    )
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"next_step_id": BRAIN_HA_AGENT}
    )
    user_input: dict[str, Any] = {
        CONF_NAME: "Realtime Voice",
        CONF_AGENT_ID: "conversation.home_assistant",
    }
    if create_assistant is not None:
        user_input[CONF_CREATE_ASSISTANT] = create_assistant
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], user_input
    )
    await hass.async_block_till_done()
    assert result["type"] is FlowResultType.CREATE_ENTRY
    home.entry = result["result"]
    return result["result"]


def ours(home: Home) -> list[Any]:
    """Return the assistants whose agent is Realtime Voice's."""
    return [p for p in async_get_pipelines(home.hass) if p.conversation_engine == AGENT]


async def test_adding_the_entry_creates_its_assistant_once(home: Home) -> None:
    """The default: one assistant, the preferred one's engines, local intents off."""
    hass = home.hass
    preferred = async_get_pipeline(hass)
    await async_update_pipeline(
        hass,
        preferred,
        stt_engine=STT_ENTITY,
        stt_language="en",
        tts_engine=TTS_ENTITY,
        tts_language="en",
    )
    entry = await add_entry(home, create_assistant=None)
    (assistant,) = ours(home)
    assert assistant.name == "Realtime Voice"
    assert assistant.prefer_local_intents is False
    assert (assistant.stt_engine, assistant.tts_engine) == (STT_ENTITY, TTS_ENTITY)
    assert async_get_pipeline(hass).id == preferred.id  # the preferred one stays
    assert CONF_CREATE_ASSISTANT not in entry.data  # the offer is used up

    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    assert len(ours(home)) == 1


async def test_no_assistant_when_the_user_says_no(home: Home) -> None:
    """Unticked: no assistant is created."""
    entry = await add_entry(home, create_assistant=False)
    assert ours(home) == []
    assert CONF_CREATE_ASSISTANT not in entry.data


async def test_an_assistant_the_user_changed_is_never_touched(home: Home) -> None:
    """Once created, a reload neither recreates nor resets it."""
    hass = home.hass
    entry = await add_entry(home, create_assistant=True)
    (assistant,) = ours(home)
    await async_update_pipeline(hass, assistant, prefer_local_intents=True)
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    (assistant,) = ours(home)
    assert assistant.prefer_local_intents is True


def _texts(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [t for k, v in node.items() for t in _texts(v, f"{path}.{k}")]
    return [(path, node)] if isinstance(node, str) else []


def _form_texts() -> list[tuple[str, str]]:
    """Return the texts of every flow: config, options, the satellites' subentries."""
    strings = json.loads(TRANSLATIONS.read_text())
    return [
        text
        for section in ("config", "options", "config_subentries")
        for text in _texts(strings[section], section)
    ]


def test_form_texts_have_no_inline_code() -> None:
    """The frontend pads inline code: "Barge-in by voice ( vad )"."""
    assert [path for path, text in _form_texts() if "`" in text] == []


def test_step_titles_fit_the_dialog() -> None:
    """Every step title (config, options, subentries) is short enough not to be cut."""
    titles = [(path, text) for path, text in _form_texts() if path.endswith(".title")]
    assert titles
    assert [(p, t) for p, t in titles if len(t) > TITLE_MAX] == []


def test_texts_send_satellite_changes_to_its_row() -> None:
    """Forms, aborts and repairs name what the entry's page shows for a satellite.

    Found walking README's first use in a browser: the ESPHome and Wyoming repairs
    said to remove a satellite "from Realtime Voice's options", which no longer
    list satellites, and the "already owned" aborts said "Reconfigure".
    """
    texts = _texts(json.loads(TRANSLATIONS.read_text()))
    assert [(p, t) for p, t in texts if STALE_SATELLITE_WAYS.search(t)] == []
