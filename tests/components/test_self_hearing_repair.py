"""The repair of a satellite whose mic hears its answers (vad, no echo cancellation).

The detection itself is tested on the duplex session (tests/duplex/test_self_hearing.py);
here the binding HA builds for a satellite: its report raises the repair with the
satellite's name, and settings that make it needless (echo cancellation on, another
barge-in mode) clear it when the binding is built again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry

from custom_components.rtvoice.const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    DOMAIN,
)
from custom_components.rtvoice.duplex_ha import ISSUE_HEARS_ITSELF, satellite_binding
from custom_components.rtvoice.duplex_link import RoundEnds
from homeassistant.core import HomeAssistant
from homeassistant.helpers import issue_registry as ir

ISSUE = f"{ISSUE_HEARS_ITSELF}_kitchen_duplex"
TRANSLATIONS = (
    Path(__file__).parents[2] / "custom_components/rtvoice/translations/en.json"
)


def binding(hass: HomeAssistant, entry: MockConfigEntry, **conf: object):
    """Build the binding of the satellite "Kitchen duplex" with ``conf``."""
    runtime = entry.runtime_data
    return satellite_binding(
        hass,
        runtime.sessions,
        runtime.kernel,
        RoundEnds(),
        name="Kitchen duplex",
        conf=conf,
    )


@pytest.mark.parametrize(
    "fixed",
    [
        {CONF_BARGE_IN: "vad", CONF_ECHO_CANCELLATION: True},
        {CONF_BARGE_IN: "wake_word"},
    ],
)
async def test_the_report_raises_the_repair_and_new_settings_clear_it(
    hass: HomeAssistant, entry: MockConfigEntry, fixed: dict[str, object]
) -> None:
    """Vad without echo cancellation: the report is a repair; a fix clears it."""
    hearing = binding(hass, entry, **{CONF_BARGE_IN: "vad"})
    assert hearing.echo is None
    assert hearing.on_hears_itself is not None
    hearing.on_hears_itself()
    issue = ir.async_get(hass).async_get_issue(DOMAIN, ISSUE)
    assert issue is not None
    assert issue.translation_key == ISSUE_HEARS_ITSELF
    assert issue.translation_placeholders == {"satellite": "Kitchen duplex"}
    assert not issue.is_fixable

    binding(hass, entry, **fixed)  # the user changed the settings: rebuilt
    assert ir.async_get(hass).async_get_issue(DOMAIN, ISSUE) is None


def test_the_repair_has_its_text() -> None:
    """The issue's title and description exist, with the satellite's name."""
    issue = json.loads(TRANSLATIONS.read_text())["issues"][ISSUE_HEARS_ITSELF]
    assert "{satellite}" in issue["title"]
    assert "echo cancellation" in issue["description"]
