"""Tests of compat.py: both branches of every HA-version guard (DESIGN §8).

The 2025.4 branch runs against the real Home Assistant installed here. HA 2026.x
cannot be installed on Python 3.13, so its object shapes are faked with small
dataclasses/stubs that have exactly the attribute or signature the guard detects;
each such stub says so where it is defined.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
import datetime as dt
from decimal import Decimal
import enum
import importlib.abc
import json
import sys
import types
from typing import Any

import pytest
import voluptuous as vol
from voluptuous_openapi import UNSUPPORTED

from custom_components.rtvoice import compat
from custom_components.rtvoice.const import DOMAIN
from custom_components.rtvoice.turn import TurnContext
from homeassistant.components import conversation
from homeassistant.components.conversation import ConversationInput
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import intent, llm
from homeassistant.setup import async_setup_component


def _user_input(text: str = "turn on the kitchen lights", **extra: Any) -> Any:
    """Build a real 2025.4 ConversationInput."""
    return ConversationInput(
        text=text,
        context=Context(user_id="user-1"),
        conversation_id="conv-1",
        device_id="device-1",
        language="en",
        agent_id="conversation.rtvoice",
        **extra,
    )


# -- satellite_id ---------------------------------------------------------------


@dataclass
class _Input2026:
    """Stub of a 2026.x ConversationInput: it carries ``satellite_id``."""

    text: str
    context: Context
    language: str
    device_id: str | None
    satellite_id: str | None
    agent_id: str = "conversation.rtvoice"


def test_satellite_id_absent_on_2025_4() -> None:
    """HA 2025.4's ConversationInput has no satellite id."""
    assert not hasattr(_user_input(), "satellite_id")
    assert compat.satellite_id(_user_input()) is None


def test_satellite_id_read_when_present() -> None:
    """A 2026.x input gives its satellite entity id; an empty one counts as none."""
    stub = _Input2026("hi", Context(), "en", "dev", "assist_satellite.kitchen")
    assert compat.satellite_id(stub) == "assist_satellite.kitchen"
    stub.satellite_id = ""
    assert compat.satellite_id(stub) is None


# -- llm_context ---------------------------------------------------------------


def test_llm_context_built_from_2025_4_fields(hass: HomeAssistant) -> None:
    """Without ``as_llm_context`` the context is built from LLMContext's fields."""
    user_input = _user_input()
    context = compat.llm_context(hass, user_input)

    assert isinstance(context, llm.LLMContext)
    assert context.platform == DOMAIN
    assert context.context is user_input.context
    assert context.user_prompt == "turn on the kitchen lights"
    assert context.language == "en"
    # The exposure settings of the "conversation" assistant apply.
    assert context.assistant == conversation.DOMAIN
    assert context.device_id == "device-1"


def test_llm_context_from_turn_context(hass: HomeAssistant) -> None:
    """A TurnContext has no text; a missing language falls back to HA's."""
    hass.config.language = "de"
    turn = TurnContext(context=Context(), language="", device_id="dev-2")
    context = compat.llm_context(hass, turn, platform="other")

    assert context.platform == "other"
    assert context.user_prompt is None
    assert context.language == "de"
    assert context.device_id == "dev-2"


@dataclass(slots=True)
class _LLMContext2026:
    """Stub of 2026.x ``llm.LLMContext``: no user_prompt, agent_id added.

    Plus a required field compat does not know, and one with a default.
    """

    platform: str
    context: Context | None
    language: str | None
    assistant: str | None
    device_id: str | None
    agent_id: str | None
    unknown_required: str | None
    unknown_default: str = "kept"
    derived: str = field(init=False, default="x")


def test_llm_context_fills_only_existing_fields(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fields of the LLMContext at hand decide what is passed."""
    monkeypatch.setattr(llm, "LLMContext", _LLMContext2026)
    context = compat.llm_context(hass, _user_input())

    assert isinstance(context, _LLMContext2026)
    assert not hasattr(context, "user_prompt")
    assert context.agent_id == "conversation.rtvoice"
    assert context.unknown_required is None
    assert context.unknown_default == "kept"
    assert context.assistant == conversation.DOMAIN


def test_llm_context_prefers_as_llm_context(hass: HomeAssistant) -> None:
    """A 2026.x input that builds its own context is asked, with the platform."""
    built = object()
    calls: list[str] = []

    @dataclass
    class _InputWithBuilder:
        """Stub of a 2026.x ConversationInput with ``as_llm_context``."""

        text: str = "hello"

        def as_llm_context(self, conversing_domain: str) -> Any:
            calls.append(conversing_domain)
            return built

    assert compat.llm_context(hass, _InputWithBuilder()) is built
    assert calls == [DOMAIN]


# -- tool_result_to_text ----------------------------------------------------------


class _Color(enum.Enum):
    RED = "red"


@dataclass
class _ToolResult2026:
    """Stub of a 2026.x ``llm.ToolResult``-like dataclass result."""

    success: bool
    data: dict[str, Any]


class _SelfDescribing:
    """Stub of a result object that describes itself with ``as_dict``."""

    def as_dict(self) -> dict[str, Any]:
        return {"speech": "done"}


def test_tool_result_dict_and_dict_subclass() -> None:
    """2025.4 tools return dicts (IntentResponseDict-like subclasses too)."""

    class _IntentResponseDict(dict):  # a dict subclass as some HA versions return
        original = object()

    plain = {"response_type": "action_done", "success": ["Küche"]}
    assert json.loads(compat.tool_result_to_text(plain)) == plain
    assert "Küche" in compat.tool_result_to_text(plain)  # not ASCII-escaped
    assert json.loads(compat.tool_result_to_text(_IntentResponseDict(a=1))) == {"a": 1}


def test_tool_result_objects() -> None:
    """Objects are described: ToolResult-like dataclasses and as_dict()."""
    result = _ToolResult2026(True, {"when": dt.date(2025, 1, 2)})
    assert json.loads(compat.tool_result_to_text(result)) == {
        "success": True,
        "data": {"when": "2025-01-02"},
    }
    assert json.loads(compat.tool_result_to_text(_SelfDescribing())) == {
        "speech": "done"
    }


def test_tool_result_scalars_and_odd_values() -> None:
    """Strings pass through; other values become JSON without failing."""
    assert compat.tool_result_to_text("already text") == "already text"
    assert compat.tool_result_to_text(None) == "null"
    assert compat.tool_result_to_text([1, 2]) == "[1, 2]"
    odd = {
        "color": _Color.RED,
        "at": dt.datetime(2025, 1, 2, 3, 4, 5),
        "t": dt.time(1, 2),
        "n": Decimal("1.5"),
        "tags": {"a"},
        "pair": (1, 2),
        "obj": _SelfDescribing(),
        "other": ValueError("x"),
    }
    assert json.loads(compat.tool_result_to_text(odd)) == {
        "color": "red",
        "at": "2025-01-02T03:04:05",
        "t": "01:02:00",
        "n": 1.5,
        "tags": ["a"],
        "pair": [1, 2],
        "obj": {"speech": "done"},
        "other": "x",
    }
    assert json.loads(compat.tool_result_to_text(_Color.RED)) == "red"


# -- convert_schema ---------------------------------------------------------------


@pytest.fixture
def fresh_converter() -> Iterator[None]:
    """Let compat look the schema converter up again (it caches its choice)."""
    compat.schema_converter.cache_clear()
    yield
    compat.schema_converter.cache_clear()


class _ImportProbe(importlib.abc.MetaPathFinder):
    """Records every import of ``probatio`` that reaches the path finders."""

    def __init__(self) -> None:
        self.looked: list[str] = []

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name.partition(".")[0] == "probatio":
            self.looked.append(name)


def test_converter_is_looked_up_once(
    fresh_converter: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing probatio is searched for once, not at every tool of every turn."""
    probe = _ImportProbe()
    monkeypatch.setattr(sys, "meta_path", [probe, *sys.meta_path])
    schema = vol.Schema({vol.Required("name"): str})
    for _ in range(3):
        assert compat.convert_schema(schema)["type"] == "object"
    assert probe.looked == ["probatio"]


def test_convert_schema_with_voluptuous_openapi(fresh_converter: None) -> None:
    """2025.4 has no probatio: voluptuous_openapi converts, with the serializer."""
    assert "probatio" not in sys.modules
    seen: list[Any] = []

    marker = object()

    def serializer(value: Any) -> Any:
        if value is not marker:
            return UNSUPPORTED
        seen.append(value)
        return {"type": "string", "format": "custom"}

    schema = vol.Schema({vol.Required("name"): str, vol.Optional("x"): marker})
    converted = compat.convert_schema(schema, serializer)

    assert converted["type"] == "object"
    assert converted["properties"]["name"] == {"type": "string"}
    assert converted["properties"]["x"] == {"type": "string", "format": "custom"}
    assert converted["required"] == ["name"]
    assert marker in seen


def test_convert_schema_prefers_probatio(
    fresh_converter: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When probatio is importable its to_openapi is used (2026.x).

    probatio is not installed here; a stub module with ``to_openapi`` stands in.
    """
    calls: list[tuple[Any, dict[str, Any]]] = []

    def to_openapi(schema: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((schema, kwargs))
        return {"type": "object", "from": "probatio"}

    stub = types.ModuleType("probatio")
    stub.to_openapi = to_openapi  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "probatio", stub)

    schema = vol.Schema({})

    def serializer(value: Any) -> Any:
        return value

    assert compat.convert_schema(schema, serializer) == {
        "type": "object",
        "from": "probatio",
    }
    assert compat.convert_schema(schema) == {"type": "object", "from": "probatio"}
    assert calls == [(schema, {"custom_serializer": serializer}), (schema, {})]


# -- async_converse -----------------------------------------------------------------


async def test_async_converse_2025_4_drops_satellite_id(hass: HomeAssistant) -> None:
    """The real 2025.4 async_converse has no satellite_id: it is left out."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "conversation", {})
    assert await async_setup_component(hass, "intent", {})

    result = await compat.async_converse(
        hass,
        text="what is the time",
        conversation_id=None,
        context=Context(),
        language="en",
        satellite_id="assist_satellite.kitchen",
    )
    assert isinstance(result, conversation.ConversationResult)
    # The real built-in agent answered (a TypeError would have been raised had
    # satellite_id reached 2025.4's ConversationInput).
    assert result.response.response_type is intent.IntentResponseType.ACTION_DONE
    assert result.response.speech["plain"]["speech"]


async def test_async_converse_passes_satellite_id_when_supported(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2026.x-shaped async_converse (stub, keyword-only) gets satellite_id."""
    received: dict[str, Any] = {}
    sentinel = object()

    async def async_converse_2026(
        hass: HomeAssistant,
        *,
        text: str,
        conversation_id: str | None,
        context: Context,
        language: str | None = None,
        agent_id: str | None = None,
        device_id: str | None = None,
        satellite_id: str | None = None,
        extra_system_prompt: str | None = None,
    ) -> Any:
        received.update(locals())
        return sentinel

    monkeypatch.setattr(conversation, "async_converse", async_converse_2026)
    result = await compat.async_converse(
        hass,
        text="hi",
        conversation_id="c",
        context=Context(),
        satellite_id="assist_satellite.kitchen",
        extra_system_prompt="extra",
    )
    assert result is sentinel
    assert received["satellite_id"] == "assist_satellite.kitchen"
    assert received["extra_system_prompt"] == "extra"


async def test_async_converse_with_var_keywords(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A **kwargs signature (stub) receives every keyword."""
    received: dict[str, Any] = {}

    async def async_converse_kwargs(hass: HomeAssistant, **kwargs: Any) -> Any:
        received.update(kwargs)

    monkeypatch.setattr(conversation, "async_converse", async_converse_kwargs)
    await compat.async_converse(
        hass, text="hi", conversation_id=None, context=Context(), satellite_id="s"
    )
    assert received["satellite_id"] == "s"
    assert set(received) >= {"text", "conversation_id", "context", "agent_id"}


# ── intent recognition without running it (end of turn, issue 18) ────────────


async def test_intent_recogniser_asks_the_default_agent_without_running(
    hass: HomeAssistant,
) -> None:
    """HA 2025.4's own matcher recognises a whole command; a fragment is not one."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "conversation", {})
    handled: list[str] = []
    agent = conversation.async_get_agent(hass)
    original = agent.async_handle_intents

    async def handle(*args: Any, **kwargs: Any) -> Any:
        handled.append("ran")
        return await original(*args, **kwargs)

    agent.async_handle_intents = handle  # type: ignore[method-assign]
    recognise = compat.intent_recogniser(hass, lambda: "en")
    assert await recognise("what time is it")
    assert not await recognise("what time is")
    assert not await recognise("tell me a story about dragons")
    assert handled == []  # recognised, never executed


@dataclass
class _Recognised:
    intent: Any = "HassTurnOn"


class _NewAgent:
    """An agent whose recogniser lacks ``strict_intents_only`` (a future HA)."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def async_recognize_intent(self, user_input: Any) -> Any:
        self.inputs.append(user_input)
        return _Recognised() if user_input.text == "lights on" else None


async def test_intent_recogniser_feature_detects_the_agent(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``strict_intents_only``: not passed; no recogniser at all: not recognised."""
    agent = _NewAgent()
    monkeypatch.setattr(conversation, "async_get_agent", lambda hass: agent)
    recognise = compat.intent_recogniser(hass, lambda: None)
    assert await recognise("lights on")
    assert not await recognise("lights")
    assert agent.inputs[0].language == hass.config.language
    monkeypatch.setattr(conversation, "async_get_agent", lambda hass: object())
    assert not await recognise("lights on")


class _SlowAgent:
    """A recogniser that answers when the test lets it (a busy HA's matcher)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def async_recognize_intent(self, user_input: Any) -> Any:
        self.asked.append(user_input.text)
        self.called.set()
        await self.release.wait()
        return _Recognised()


async def test_intent_recogniser_runs_one_recognition_at_a_time(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the matcher works for one satellite, another's pause is not recognised.

    Nothing queues behind the running recognition (each would be an executor job);
    once it returned, or was cancelled, the next pause is asked again.
    """
    agent = _SlowAgent()
    monkeypatch.setattr(conversation, "async_get_agent", lambda hass: agent)
    kitchen = compat.intent_recogniser(hass, lambda: "en")
    office = compat.intent_recogniser(hass, lambda: "en")
    first = asyncio.ensure_future(kitchen("lights on"))
    await agent.called.wait()
    # Busy: answered at once (the timeout only fails a queued call, a safety net).
    assert not await asyncio.wait_for(office("fan on"), 10)
    assert agent.asked == ["lights on"]
    agent.release.set()
    assert await first
    assert await office("fan on")
    agent.release.clear()
    agent.called.clear()
    waiting = asyncio.ensure_future(office("heat on"))
    await agent.called.wait()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    agent.release.set()
    assert await kitchen("lights off")  # the cancelled one no longer counts
