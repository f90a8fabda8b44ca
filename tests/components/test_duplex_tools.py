"""Duplex conversations get Home Assistant's tools, as pipeline turns do.

The rig of ``test_duplex_entity``: the emulated Voice PE-like satellite (real
aioesphomeapi client), the offline Wyoming speech servers through HA's
``wyoming`` integration, the OpenAI-compatible peer (it scripts the model's tool
call). The entry uses the Assist LLM API; the demo's Kitchen Lights are exposed
to Assist. HA's real Assist API builds the tools and the API prompt for the
satellite's device (its area), and its intent really switches the light. Waits
are on events; timeouts are safety nets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from custom_components.rtvoice.const import CONF_END_SILENCE, CONF_WAKE_WORD, DOMAIN
from custom_components.rtvoice.tools import api_prompt_section
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.helpers import (
    area_registry as ar,
    device_registry as dr,
    entity_registry as er,
)
from tests.components.common import (
    KITCHEN,
    async_load_entry,
    async_setup_demo_lights,
    openai_entry,
)
from tests.components.esphome_rig import entity_of, spoken, wait
from tests.components.test_duplex_entity import ASK, SAFETY, duplex_rig
from tests.components.test_wyoming_satellite import (
    ASK_LIGHTS,
    WAKE,
    add_wyoming,
    sat_python,  # noqa: F401 - a fixture
    satellite_rig,
    say,
    speech_pipeline,
    the_link,
    wait_for_state,
    wake_available,  # noqa: F401 - a fixture
)
from tests.peers.esphome import EventType
from tests.peers.openai_server import OpenAIPeer, RecordedRequest, Text, ToolCall

pytestmark = pytest.mark.usefixtures("socket_enabled")

API_PROMPT = "When controlling Home Assistant always call the intent tools."


def tool_names(request: RecordedRequest) -> set[str]:
    """Return the names of the tools a model request offers."""
    return {tool["function"]["name"] for tool in request.tools or []}


def system_prompt(request: RecordedRequest) -> str:
    """Return the system message of a model request."""
    system, *_ = request.messages
    assert system["role"] == "system"
    return str(system["content"])


def turn_on_kitchen(call_id: str) -> ToolCall:
    """Return the model's call asking Assist to turn on the Kitchen Lights."""
    return ToolCall(call_id, "HassTurnOn", json.dumps({"name": "Kitchen Lights"}))


def tool_results(request: RecordedRequest) -> list[dict[str, Any]]:
    """Return the tool messages a model request carries back."""
    return [m for m in request.messages if m["role"] == "tool"]


async def light_off(hass: HomeAssistant) -> None:
    """Switch the Kitchen Lights off (the tool call is to switch them on)."""
    await hass.services.async_call(
        "light", "turn_off", {"entity_id": KITCHEN}, blocking=True
    )
    assert hass.states.get(KITCHEN).state == "off"  # type: ignore[union-attr]


def place_satellite(hass: HomeAssistant, satellite: str, area: str) -> None:
    """Put the satellite's device into ``area`` (created when new)."""
    areas = ar.async_get(hass)
    found = areas.async_get_area_by_name(area) or areas.async_create(area)
    device_id = er.async_get(hass).async_get(satellite).device_id  # type: ignore[union-attr]
    assert device_id is not None
    dr.async_get(hass).async_update_device(device_id, area_id=found.id)


async def test_duplex_satellite_switches_a_light_with_assist_tools(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """The model gets Assist's tools and API prompt in every session of the child.

    First session: the request lists HassTurnOn and carries the API prompt for
    the satellite's area; the scripted tool call switches the light on. The
    session ends by silence (1 s), the child waits idle; a second wake word
    resumes it: the turn is prepared again (the satellite moved to another area:
    the API prompt says so), the tools are still there and switch the light.
    The close drops what was prepared (the API prompt section).
    """
    await async_setup_demo_lights(hass, kitchen_area="Kitchen")
    async with duplex_rig(hass, tmp_path, openai_peer, **{CONF_END_SILENCE: 1}) as rig:
        place_satellite(hass, rig.satellite, "Kitchen")
        await light_off(hass)
        openai_peer.enqueue(turn_on_kitchen("call-1"))
        openai_peer.enqueue(Text("The kitchen lights are on."))
        since = rig.device.mark()
        rig.device.say(await spoken(ASK))

        first = await wait(openai_peer.wait_for_request(1), SAFETY)
        assert "HassTurnOn" in tool_names(first)
        assert API_PROMPT in system_prompt(first)
        assert "You are in area Kitchen" in system_prompt(first)
        after_call = await wait(openai_peer.wait_for_request(2), SAFETY)
        [result] = tool_results(after_call)
        assert result["tool_call_id"] == "call-1"
        assert "error" not in json.loads(result["content"])
        assert hass.states.get(KITCHEN).state == "on"  # type: ignore[union-attr]

        # Silence after the answer: back to the wake word, the child stays.
        await wait(rig.device.wait_for_event(EventType.RUN_END, since), SAFETY)
        conversation = rig.link.conversation
        assert conversation is not None
        assert conversation.idle

        place_satellite(hass, rig.satellite, "Hall")
        await light_off(hass)
        openai_peer.enqueue(turn_on_kitchen("call-2"))
        openai_peer.enqueue(Text("They are on again."))
        rig.device.say(await spoken(ASK))  # a wake word: resumed

        third = await wait(openai_peer.wait_for_request(3), SAFETY)
        assert rig.link.conversation is conversation  # the same child
        assert not conversation.idle
        assert "HassTurnOn" in tool_names(third)
        assert API_PROMPT in system_prompt(third)
        assert "You are in area Hall" in system_prompt(third)  # prepared again
        assert "You are in area Kitchen" not in system_prompt(third)
        fourth = await wait(openai_peer.wait_for_request(4), SAFETY)
        assert [r["tool_call_id"] for r in tool_results(fourth)] == [
            "call-1",
            "call-2",
        ]
        assert hass.states.get(KITCHEN).state == "on"  # type: ignore[union-attr]

        prompts = rig.entry.runtime_data.prompts
        section = api_prompt_section(conversation.child_id)
        assert section in {s.section for s in prompts.snapshot()}
        await rig.link.close_conversation(conversation)
        assert section not in {s.section for s in prompts.snapshot()}


async def test_wyoming_satellite_switches_a_light_with_assist_tools(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,  # noqa: F811 - the imported fixture
    wake_available: None,  # noqa: F811 - the imported fixture
) -> None:
    """A Wyoming satellite's conversation gets Assist's tools for its device.

    A real wyoming-satellite (the rig of ``test_wyoming_satellite``): the
    model's first request lists HassTurnOn and carries the API prompt naming the
    satellite's area; the scripted tool call switches the light on. The close
    drops what was prepared.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    await async_setup_demo_lights(hass, kitchen_area="Kitchen")
    entry = await async_load_entry(hass, openai_entry(hass, openai_peer))
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        result = await add_wyoming(
            hass,
            entry,
            {
                CONF_HOST: satellite.host,
                CONF_PORT: satellite.port,
                CONF_WAKE_WORD: "hey_jarvis",
            },
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        await hass.async_block_till_done()  # the entry reloads with the satellite
        entity_id = entity_of(hass, entry, "assist_satellite")
        place_satellite(hass, entity_id, "Kitchen")
        await light_off(hass)
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(turn_on_kitchen("call-1"))
        openai_peer.enqueue(Text("The kitchen lights are on."))
        await say(satellite, WAKE)
        await wait_for_state(hass, entity_id, {"listening"})
        await say(satellite, ASK_LIGHTS)

        first = await wait(openai_peer.wait_for_request(1), SAFETY)
        assert "HassTurnOn" in tool_names(first)
        assert API_PROMPT in system_prompt(first)
        assert "You are in area Kitchen" in system_prompt(first)
        after_call = await wait(openai_peer.wait_for_request(2), SAFETY)
        [result_message] = tool_results(after_call)
        assert "error" not in json.loads(result_message["content"])
        assert hass.states.get(KITCHEN).state == "on"  # type: ignore[union-attr]

        conversation = link.conversation
        assert conversation is not None
        prompts = entry.runtime_data.prompts
        section = api_prompt_section(conversation.child_id)
        assert section in {s.section for s in prompts.snapshot()}
        await hass.services.async_call(
            DOMAIN,
            "stop_conversation",
            {"conversation_id": conversation.child_id},
            blocking=True,
            return_response=True,
        )
        assert section not in {s.section for s in prompts.snapshot()}
