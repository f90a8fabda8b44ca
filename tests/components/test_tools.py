"""Tests of tools.py: HaToolRunner over HA's real Assist API and demo lights.

Home Assistant's real ``homeassistant``, ``intent`` and ``conversation`` components
and the demo integration's lights run here; the kernel is the real one. Only the
model is scripted (``ScriptedModel``): no LLM can run here, and the runner under
test does not care who asks for a tool call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
import json
from typing import Any

import pytest
import voluptuous as vol

from custom_components.rtvoice import compat
from custom_components.rtvoice.const import PROMPT_OWNER_HASS
from custom_components.rtvoice.kernel import (
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    Message,
    Outcome,
    PromptRegistry,
    ToolCall,
    ToolSpec,
)
from custom_components.rtvoice.tools import (
    API_PROMPT_ORDER,
    HaToolRunner,
    api_prompt_section,
)
from custom_components.rtvoice.turn import TurnContext
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er, llm
from homeassistant.util.json import JsonObjectType
from tests.components.common import (
    BED,
    KITCHEN,
    SAFETY_TIMEOUT,
    async_setup_demo_lights,
)

CHILD = "01JCHILD0000000000000000AA"


def tool_named(specs: list[ToolSpec], suffix: str) -> ToolSpec:
    """Return the spec whose name ends with ``suffix`` (newer HA prefixes names)."""
    matches = [spec for spec in specs if spec.name.endswith(suffix)]
    assert len(matches) == 1, [spec.name for spec in specs]
    return matches[0]


class ScriptedModel:
    """A chat provider that asks for queued tool calls, then says "ok"."""

    def __init__(self) -> None:
        """Start with nothing queued."""
        self.queue: deque[list[ToolCall]] = deque()
        self.offered: list[list[ToolSpec]] = []
        self.requests: list[list[Message]] = []
        self.before_calls: Callable[[], None] | None = None

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Yield the next queued calls, or a final text."""
        self.offered.append(list(tools))
        self.requests.append(list(messages))
        if self.queue:
            if self.before_calls is not None:
                self.before_calls()
            yield Delta(tool_calls=self.queue.popleft())
            return
        yield Delta(content="ok")


class Rig:
    """A real kernel with one child whose tools come from an HaToolRunner."""

    def __init__(self, hass: HomeAssistant, api_id: str = llm.LLM_API_ASSIST) -> None:
        """Wire the kernel, the runner and a scripted model."""
        self.hass = hass
        self.prompts = PromptRegistry()
        self.channels = ChannelRegistry()
        self.model = ScriptedModel()
        self.runner = HaToolRunner(hass, self.prompts, api_id)
        self.results: list[tuple[str, ToolCall, str]] = []
        self.kernel = Kernel(
            self.model,
            self.channels,
            tools=self.runner,
            prompts=self.prompts,
            on_tool_result=lambda *args: self.results.append(args),
        )

    async def spawn(self, child_id: str = CHILD) -> None:
        """Spawn a child on an RT channel pair."""
        self.channels.register_input(f"{child_id}:in", ChannelDef(realtime=True))
        self.channels.register_output(
            f"{child_id}:out", lambda _: None, definition=ChannelDef(realtime=True)
        )
        await self.kernel.spawn(
            ChildOptions(
                id=child_id,
                input=f"{child_id}:in",
                output=f"{child_id}:out",
                prompt_scope=child_id,
            )
        )

    async def prepare(self, child_id: str = CHILD, **turn: Any) -> None:
        """Prepare the runner for a turn of ``child_id``."""
        turn.setdefault("context", Context())
        turn.setdefault("language", "en")
        await self.runner.async_prepare(child_id, TurnContext(**turn))

    async def run(self, *calls: ToolCall, child_id: str = CHILD) -> Outcome:
        """Run one round in which the model makes ``calls``."""
        if calls:
            self.model.queue.append(list(calls))
        ticket = self.kernel.push(child_id, "do it")
        return await asyncio.wait_for(asyncio.shield(ticket.outcome), SAFETY_TIMEOUT)

    def tool_results(self, child_id: str = CHILD) -> dict[str, Any]:
        """Tool results of the child's history by call id (parsed JSON)."""
        history = self.kernel.transcript(child_id) or []
        return {
            m.tool_call_id: json.loads(m.content) for m in history if m.role == "tool"
        }


@pytest.fixture
async def rig(hass: HomeAssistant) -> AsyncIterator[Rig]:
    """Demo lights, Assist, and a prepared rig with one child."""
    await async_setup_demo_lights(hass)
    rig = Rig(hass)
    await rig.spawn()
    await rig.prepare()
    yield rig
    await rig.kernel.stop_all()


async def test_specs_come_from_the_assist_api(rig: Rig) -> None:
    """The model is offered HA's intent tools with JSON schemas."""
    await rig.run()
    (offered,) = rig.model.offered
    turn_on = tool_named(offered, "HassTurnOn")
    assert turn_on.description
    assert turn_on.parameters["type"] == "object"
    assert "name" in turn_on.parameters["properties"]
    tool_named(offered, "HassTurnOff")
    # specs() outside a round (no current child) offers nothing.
    assert rig.runner.specs() == []


async def test_api_prompt_is_a_section_of_the_conversation(rig: Rig) -> None:
    """HA's API prompt is declared per conversation, in its prompt scope only."""
    (section,) = [
        s for s in rig.prompts.snapshot() if s.section == api_prompt_section(CHILD)
    ]
    assert section.owner == PROMPT_OWNER_HASS
    assert section.order == API_PROMPT_ORDER
    assert section.scope == CHILD
    assert rig.prompts.render("another.scope") == ""
    assert "Kitchen Lights" in section.content
    assert "Bed Light" not in section.content  # not exposed

    await rig.run()
    system = rig.model.requests[0][0]
    assert system.role == "system"
    assert section.content in system.content


async def test_api_prompt_is_never_templated(rig: Rig, hass: HomeAssistant) -> None:
    """Template syntax in an entity name reaches the model verbatim."""
    er.async_get(hass).async_update_entity(KITCHEN, name="Kitchen {{ 1 + 1 }}")
    await rig.prepare()
    await rig.run()
    assert "Kitchen {{ 1 + 1 }}" in rig.model.requests[0][0].content


async def test_call_switches_an_exposed_light(rig: Rig, hass: HomeAssistant) -> None:
    """A tool call really switches the light and its result is recorded."""
    assert hass.states.get(KITCHEN).state == "on"
    await rig.run()  # learn the tool names HA offers
    turn_off = tool_named(rig.model.offered[0], "HassTurnOff")
    call = ToolCall("call-1", turn_off.name, {"name": "Kitchen Lights"})

    outcome = await rig.run(call)

    assert outcome.status == "completed"
    assert hass.states.get(KITCHEN).state == "off"
    result = rig.tool_results()["call-1"]
    assert result["response_type"] == "action_done"
    assert [t["id"] for t in result["data"]["success"]] == [KITCHEN]
    ((child, recorded_call, text),) = rig.results
    assert child == CHILD
    assert recorded_call is call
    assert json.loads(text) == result


async def test_unexposed_light_cannot_be_switched(
    rig: Rig, hass: HomeAssistant
) -> None:
    """Assist only reaches exposed entities: the model gets an error result."""
    await rig.run()
    turn_on = tool_named(rig.model.offered[0], "HassTurnOn")
    assert hass.states.get(BED).state == "off"

    outcome = await rig.run(ToolCall("call-bed", turn_on.name, {"name": "Bed Light"}))

    assert outcome.status == "completed"
    assert hass.states.get(BED).state == "off"
    result = rig.tool_results()["call-bed"]
    assert result["error"] == "MatchFailedError"
    assert len(rig.results) == 1


async def test_bad_arguments_and_unknown_tools_are_error_results(
    rig: Rig, hass: HomeAssistant
) -> None:
    """Invalid slots and unknown tools become readable errors; the round goes on."""
    await rig.run()
    turn_on = tool_named(rig.model.offered[0], "HassTurnOn")

    outcome = await rig.run(
        ToolCall("bad-args", turn_on.name, {"domain": {"not": "a string"}}),
        ToolCall("no-tool", "NoSuchTool", {}),
    )

    assert outcome.status == "completed"
    results = rig.tool_results()
    assert results["bad-args"]["error"] == "InvalidSlotInfo"
    assert results["no-tool"]["error"] == "HomeAssistantError"
    assert "NoSuchTool" in results["no-tool"]["error_text"]
    assert [call.id for _, call, _ in rig.results] == ["bad-args", "no-tool"]
    assert hass.states.get(KITCHEN).state == "on"


async def test_unprepared_child_gets_no_tools(rig: Rig) -> None:
    """A child without a prepared instance is offered nothing."""
    other = "01JOTHER000000000000000000"
    await rig.spawn(other)
    await rig.run(child_id=other)
    assert rig.model.offered[-1] == []


async def test_call_after_forget_is_an_error_result(
    rig: Rig, hass: HomeAssistant
) -> None:
    """A call whose conversation was forgotten mid-round gets an error result."""
    await rig.run()
    turn_off = tool_named(rig.model.offered[0], "HassTurnOff")
    rig.model.before_calls = lambda: rig.runner.forget(CHILD)

    outcome = await rig.run(ToolCall("c", turn_off.name, {"name": "Kitchen Lights"}))

    assert outcome.status == "completed"
    assert "no Home Assistant tools" in rig.tool_results()["c"]["error"]
    assert hass.states.get(KITCHEN).state == "on"


async def test_forget_drops_the_prepared_instance(rig: Rig) -> None:
    """After forget the child has no tools and its API prompt is gone."""
    rig.runner.forget(CHILD)
    await rig.run()
    assert rig.model.offered[-1] == []
    assert rig.prompts.render(CHILD) == ""


async def test_schemas_are_converted_once_per_language(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every turn gets a new API instance; unchanged tools are not converted again.

    The converter is wrapped only to count its calls (it still converts).
    """
    converted: list[Any] = []
    real = compat.convert_schema

    def counting(schema: Any, serializer: Any = None) -> dict[str, Any]:
        converted.append(schema)
        return real(schema, serializer)

    monkeypatch.setattr(compat, "convert_schema", counting)
    await rig.prepare()
    await rig.prepare(child_id="01JCHILD0000000000000000BB")
    assert converted == []  # the fixture's prepare converted them already
    await rig.run()
    assert tool_named(rig.model.offered[-1], "HassTurnOn").parameters["type"] == (
        "object"
    )
    await rig.prepare(language="de")
    assert converted  # another language: converted (and cached) again
    count = len(converted)
    await rig.prepare(language="de")
    assert len(converted) == count


async def test_turn_device_reaches_the_api(rig: Rig, hass: HomeAssistant) -> None:
    """The LLM context of a turn carries its device, language and user context."""
    context = Context(user_id="user-9")
    await rig.prepare(context=context, language="de", device_id="device-7")
    instance = rig.runner._prepared[CHILD].instance  # noqa: SLF001
    assert instance.llm_context.device_id == "device-7"
    assert instance.llm_context.language == "de"
    assert instance.llm_context.context is context


async def test_unknown_api_means_no_tools(
    hass: HomeAssistant, caplog: pytest.LogCaptureFixture
) -> None:
    """A missing LLM API is logged and the conversation runs without tools."""
    await async_setup_demo_lights(hass)
    rig = Rig(hass, api_id="no_such_api")
    await rig.spawn()
    await rig.prepare()
    try:
        outcome = await rig.run()
    finally:
        await rig.kernel.stop_all()
    assert outcome.status == "completed"
    assert rig.model.offered == [[]]
    assert "no_such_api" in caplog.text
    assert rig.prompts.snapshot() == []


class _BrokenTool(llm.Tool):
    """A tool that fails in an unexpected way."""

    name = "broken"
    description = "Always fails."

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: Any
    ) -> JsonObjectType:
        raise RuntimeError("tool exploded")


class _OddSchemaTool(llm.Tool):
    """A tool whose parameter schema cannot be converted to JSON schema."""

    name = "odd_schema"
    description = "Cannot be described."
    parameters = vol.Schema({vol.Required("x"): object()})

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: Any
    ) -> JsonObjectType:
        return {}


class _EchoTool(llm.Tool):
    """A tool that echoes its input and rejects one value like HA tools do."""

    name = "echo"
    description = "Echo."
    parameters = vol.Schema({vol.Required("text"): str})

    async def async_call(
        self, hass: HomeAssistant, tool_input: llm.ToolInput, llm_context: Any
    ) -> JsonObjectType:
        if tool_input.tool_args.get("text") == "invalid":
            raise vol.Invalid("text may not be 'invalid'")
        if tool_input.tool_args.get("text") == "ha":
            raise HomeAssistantError
        return {"echo": tool_input.tool_args, "id": tool_input.id}


class _TestAPI(llm.API):
    """A real HA LLM API (registered in HA's registry) with odd tools."""

    async def async_get_api_instance(
        self, llm_context: llm.LLMContext
    ) -> llm.APIInstance:
        return llm.APIInstance(
            api=self,
            api_prompt="Test API prompt.",
            llm_context=llm_context,
            tools=[_BrokenTool(), _OddSchemaTool(), _EchoTool()],
        )


@pytest.fixture
async def test_api_rig(hass: HomeAssistant) -> AsyncIterator[Rig]:
    """A rig on a registered test LLM API."""
    unregister = llm.async_register_api(
        hass, _TestAPI(hass=hass, id="rtvoice_test_api", name="Test")
    )
    rig = Rig(hass, api_id="rtvoice_test_api")
    await rig.spawn()
    await rig.prepare()
    yield rig
    await rig.kernel.stop_all()
    unregister()


async def test_failing_tools_never_crash_the_round(
    test_api_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """Unexpected exceptions, vol.Invalid and bare HA errors are error results."""
    rig = test_api_rig
    outcome = await rig.run(
        ToolCall("b", "broken", {}),
        ToolCall("i", "echo", {"text": "invalid"}),
        ToolCall("h", "echo", {"text": "ha"}),
        ToolCall("e", "echo", {"text": "hello"}),
    )
    assert outcome.status == "completed"
    results = rig.tool_results()
    assert results["b"] == {"error": "RuntimeError", "error_text": "tool exploded"}
    assert results["i"]["error"] == "Invalid"
    assert results["h"] == {"error": "HomeAssistantError"}
    assert results["e"] == {"echo": {"text": "hello"}, "id": "e"}
    assert "broken raised RuntimeError" in caplog.text


async def test_unconvertible_schema_is_not_offered(
    test_api_rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool with an unconvertible schema is left out; the others stay."""
    await test_api_rig.prepare()
    await test_api_rig.run()
    assert [spec.name for spec in test_api_rig.model.offered[0]] == ["broken", "echo"]
    assert "odd_schema" in caplog.text
