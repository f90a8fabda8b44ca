"""Tests of brain.py: both brains, created by async_create_brain.

Real peers: the openai brain talks to ``OpenAIPeer`` (a loopback OpenAI-compatible
server) through the real ``openai`` SDK on HA's shared httpx client; tools run on
HA's real Assist API with the demo lights; the ha_agent brain delegates to HA's real
built-in conversation agent; the kernel is the real one. Stand-ins are named where
they are defined (a gate around ``conversation.async_converse``, a small LLM-like
conversation agent).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
import json
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.rtvoice.agent_brain import (
    HA_ASSIST_TOOL,
    HaAgentProvider,
    HaAgentToolRunner,
    delegated_conversation_id,
)
from custom_components.rtvoice.brain import (
    ISSUE_MODEL_NOT_FOUND,
    Brain,
    EndpointProvider,
    async_create_brain,
)
from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_BRAIN,
    CONF_LLM_HASS_API,
    CONF_TEMPERATURE,
    DOMAIN,
    LLM_API_NONE,
)
from custom_components.rtvoice.kernel import (
    DEFAULT_SYSTEM_PROMPT,
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Kernel,
    Message,
    Outcome,
    PromptRegistry,
    ToolCall,
    ToolSpec,
)
from custom_components.rtvoice.kernel.openai_provider import (
    OpenAIChatProvider,
    ProviderError,
)
from custom_components.rtvoice.tools import HaToolRunner, api_prompt_section
from custom_components.rtvoice.turn import TurnContext, Turns
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import (
    ConfigEntryAuthFailed,
    ConfigEntryError,
    ConfigEntryNotReady,
    HomeAssistantError,
)
from homeassistant.helpers import chat_session, intent, issue_registry as ir
from homeassistant.setup import async_setup_component
from tests.components.common import (
    BED,
    KITCHEN,
    PEER_MODEL,
    SAFETY_TIMEOUT,
    agent_entry,
    async_setup_demo_lights,
    openai_entry,
)
from tests.peers.openai_server import Fail, OpenAIPeer, Text, ToolCall as PeerToolCall

CHILD = "01JQ8Z3K9ZP4V0C5W6X7Y8Z9AB"  # a ULID, like real session ids


@dataclass
class Rig:
    """A real kernel driven by a brain, with one child and its recorded output."""

    brain: Brain
    prompts: PromptRegistry
    kernel: Kernel
    deltas: list[str] = field(default_factory=list)
    tool_results: list[tuple[str, ToolCall, str]] = field(default_factory=list)

    async def push(self, text: str) -> Outcome:
        """Push and wait for the round's outcome."""
        ticket = self.kernel.push(CHILD, text)
        return await asyncio.wait_for(asyncio.shield(ticket.outcome), SAFETY_TIMEOUT)


async def make_rig(brain: Brain, prompts: PromptRegistry, **turn: Any) -> Rig:
    """Spawn one child on an RT pair; set and prepare its turn."""
    channels = ChannelRegistry()
    tool_results: list[tuple[str, ToolCall, str]] = []
    kernel = Kernel(
        brain.provider,
        channels,
        tools=brain.tools,
        prompts=prompts,
        on_tool_result=lambda *args: tool_results.append(args),
    )
    rig = Rig(brain, prompts, kernel)
    rig.tool_results = tool_results
    channels.register_input(f"{CHILD}:in", ChannelDef(realtime=True))
    channels.register_output(
        f"{CHILD}:out", rig.deltas.append, definition=ChannelDef(realtime=True)
    )
    await kernel.spawn(
        ChildOptions(
            id=CHILD, input=f"{CHILD}:in", output=f"{CHILD}:out", prompt_scope=CHILD
        )
    )
    turn.setdefault("context", Context())
    turn.setdefault("language", "en")
    brain.set_turn(CHILD, TurnContext(conversation_id=CHILD, **turn))
    await brain.async_prepare(CHILD)
    return rig


@pytest.fixture
async def rigs() -> AsyncIterator[list[Rig]]:
    """Rigs registered here are stopped after the test."""
    created: list[Rig] = []
    yield created
    for rig in created:
        await rig.kernel.stop_all()


# ── openai brain ───────────────────────────────────────────────────────────────


async def test_openai_brain_runs_a_round_with_assist_tools(
    hass: HomeAssistant, openai_peer: OpenAIPeer, rigs: list[Rig]
) -> None:
    """Validated at creation; the model switches a light through Assist."""
    await async_setup_demo_lights(hass, kitchen_area="Kitchen")
    entry = openai_entry(hass, openai_peer, options={CONF_TEMPERATURE: 0.3})
    prompts = PromptRegistry()

    brain = await async_create_brain(hass, entry, prompts)

    assert brain.kind == BRAIN_OPENAI
    assert isinstance(brain.provider, EndpointProvider)
    assert isinstance(brain.provider.endpoint, OpenAIChatProvider)
    assert isinstance(brain.tools, HaToolRunner)
    assert brain.tools.api_id == "assist"
    rig = await make_rig(brain, prompts)
    rigs.append(rig)
    assert rig.brain.tools is not None

    # First round: learn the tool names the model is offered.
    openai_peer.enqueue(Text("Hello."))
    assert (await rig.push("hi")).text == "Hello."
    first = await openai_peer.wait_for_request(1)
    names = [tool["function"]["name"] for tool in first.tools or []]
    (turn_off,) = [name for name in names if name.endswith("HassTurnOff")]
    assert first.body["temperature"] == 0.3
    assert prompts.snapshot()[0].section == api_prompt_section(CHILD)
    assert prompts.snapshot()[0].content in first.messages[0]["content"]

    openai_peer.enqueue(
        PeerToolCall("call_1", turn_off, json.dumps({"name": "Kitchen Lights"}))
    )
    openai_peer.enqueue(Text("The kitchen lights are off."))
    outcome = await rig.push("turn off the kitchen lights")

    assert outcome.status == "completed"
    assert outcome.text == "The kitchen lights are off."
    assert hass.states.get(KITCHEN).state == "off"
    ((child, call, result),) = rig.tool_results
    assert (child, call.id, call.name) == (CHILD, "call_1", turn_off)
    assert json.loads(result)["response_type"] == "action_done"
    third = await openai_peer.wait_for_request(3)
    assert third.messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": result,
    }


async def test_openai_brain_without_tools(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """With "No tools" there is no tool runner; prepare and forget still work."""
    entry = openai_entry(hass, openai_peer, options={CONF_LLM_HASS_API: LLM_API_NONE})
    prompts = PromptRegistry()
    brain = await async_create_brain(hass, entry, prompts)

    assert brain.tools is None
    brain.set_turn(CHILD, TurnContext(Context(), "en"))
    await brain.async_prepare(CHILD)
    assert prompts.snapshot() == []
    brain.forget(CHILD)


async def test_openai_auth_failure(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A rejected key is ConfigEntryAuthFailed; the key never appears."""
    entry = openai_entry(hass, openai_peer, api_key="sk-wrong-key-5555")
    with pytest.raises(ConfigEntryAuthFailed) as caught:
        await async_create_brain(hass, entry, PromptRegistry())
    assert caught.value.translation_domain == DOMAIN
    assert caught.value.translation_key == "auth_failed"
    assert caught.value.translation_placeholders is not None
    assert caught.value.translation_placeholders == {
        "base_url": openai_peer.base_url,
        "status": "HTTP 401",
    }


async def test_openai_model_not_found_raises_a_repair_issue(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """An unknown model: not ready plus a repair issue, gone once it exists."""
    entry = openai_entry(hass, openai_peer, model="llama-missing")
    issue_id = f"{ISSUE_MODEL_NOT_FOUND}_{entry.entry_id}"
    issues = ir.async_get(hass)

    with pytest.raises(ConfigEntryNotReady) as caught:
        await async_create_brain(hass, entry, PromptRegistry())
    assert caught.value.translation_domain == DOMAIN
    assert caught.value.translation_key == "model_not_found"
    assert caught.value.translation_placeholders is not None
    assert caught.value.translation_placeholders["model"] == "llama-missing"
    assert "404" in caught.value.translation_placeholders["error"]

    issue = issues.async_get_issue(DOMAIN, issue_id)
    assert issue is not None
    assert issue.translation_key == "model_not_found"
    assert issue.is_fixable is False
    assert issue.severity == ir.IssueSeverity.ERROR
    assert issue.translation_placeholders == {
        "model": "llama-missing",
        "name": "Realtime Voice",
    }

    openai_peer.models.add("llama-missing")
    brain = await async_create_brain(hass, entry, PromptRegistry())
    assert brain.kind == BRAIN_OPENAI
    assert issues.async_get_issue(DOMAIN, issue_id) is None


async def test_openai_unreachable_is_not_ready(
    hass: HomeAssistant, openai_peer: OpenAIPeer
) -> None:
    """A server that is down: ConfigEntryNotReady (HA retries), no issue."""
    entry = openai_entry(hass, openai_peer)
    await openai_peer.stop()  # the port is closed now: connection refused
    with pytest.raises(ConfigEntryNotReady) as caught:
        await async_create_brain(hass, entry, PromptRegistry())
    assert caught.value.translation_key == "cannot_connect"
    assert caught.value.translation_placeholders is not None
    assert "cannot connect" in caught.value.translation_placeholders["error"]
    assert not ir.async_get(hass).issues


async def test_openai_other_refusal_is_not_ready(
    hass: HomeAssistant, socket_enabled: None
) -> None:
    """Any other refusal (here HTTP 429 on the last validation step) retries."""
    async with OpenAIPeer(models=[PEER_MODEL], serve_models=False) as peer:
        peer.enqueue(Fail(429, "slow down"))
        entry = openai_entry(hass, peer)
        with pytest.raises(ConfigEntryNotReady) as caught:
            await async_create_brain(hass, entry, PromptRegistry())
        assert caught.value.translation_key == "cannot_connect"
        assert caught.value.translation_placeholders is not None
        assert "429" in caught.value.translation_placeholders["error"]


async def test_unknown_brain_is_a_config_error(hass: HomeAssistant) -> None:
    """An entry naming an unknown brain cannot be set up (no retry)."""
    entry = MockConfigEntry(domain=DOMAIN, data={CONF_BRAIN: "telepathy"})
    with pytest.raises(ConfigEntryError) as caught:
        await async_create_brain(hass, entry, PromptRegistry())
    assert caught.value.translation_domain == DOMAIN
    assert caught.value.translation_key == "unknown_brain"
    assert caught.value.translation_placeholders == {"brain": "telepathy"}


# ── ha_agent brain: the built-in agent, one critical section per round ─────────


@dataclass
class Gate:
    """Wraps ``conversation.async_converse`` to hold its first call open.

    HA's built-in agent answers within a few loop iterations; a test cannot push
    "during" it without holding it, so the first call waits for ``release`` (and
    signals ``started``), then runs the real agent. The wrapper's signature is
    HA 2025.4's, so it also proves compat leaves ``satellite_id`` out.
    """

    real: Callable[..., Any]
    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(
        self,
        hass: HomeAssistant,
        *,
        text: str,
        conversation_id: str | None,
        context: Context,
        language: str | None = None,
        agent_id: str | None = None,
        device_id: str | None = None,
        extra_system_prompt: str | None = None,
    ) -> conversation.ConversationResult:
        """Record, hold the first call, then run the real agent."""
        self.calls.append(
            {
                "text": text,
                "conversation_id": conversation_id,
                "context": context,
                "language": language,
                "agent_id": agent_id,
                "device_id": device_id,
            }
        )
        if len(self.calls) == 1:
            self.started.set()
            await self.release.wait()
        result: conversation.ConversationResult = await self.real(
            hass,
            text=text,
            conversation_id=conversation_id,
            context=context,
            language=language,
            agent_id=agent_id,
            device_id=device_id,
            extra_system_prompt=extra_system_prompt,
        )
        return result


async def test_builtin_agent_call_is_a_critical_section(
    hass: HomeAssistant,
    hass_admin_user: MockUser,
    monkeypatch: pytest.MonkeyPatch,
    rigs: list[Rig],
) -> None:
    """A push during the built-in agent's call is suppressed; the light switches."""
    await async_setup_demo_lights(hass, kitchen_area="Kitchen")
    await hass.services.async_call(
        "light", "turn_off", {"entity_id": KITCHEN}, blocking=True
    )
    gate = Gate(conversation.async_converse)
    monkeypatch.setattr(conversation, "async_converse", gate)
    prompts = PromptRegistry()
    brain = await async_create_brain(hass, agent_entry(hass), prompts)
    assert brain.kind == BRAIN_HA_AGENT
    assert isinstance(brain.tools, HaAgentToolRunner)
    assert isinstance(brain.provider, HaAgentProvider)
    context = Context(user_id=hass_admin_user.id)
    rig = await make_rig(
        brain,
        prompts,
        context=context,
        device_id="device-1",
        satellite_id="assist_satellite.kitchen",
    )
    rigs.append(rig)

    first = rig.kernel.push(CHILD, "turn on the kitchen light")
    await asyncio.wait_for(gate.started.wait(), SAFETY_TIMEOUT)
    second = rig.kernel.push(CHILD, "turn on the bed light")
    stats = rig.kernel.stats(CHILD)
    assert stats is not None
    assert stats.suppressed_cancels == 1
    assert hass.states.get(KITCHEN).state == "off"
    gate.release.set()

    outcome = await asyncio.wait_for(asyncio.shield(first.outcome), SAFETY_TIMEOUT)
    # The tool completed; the newer input then ended the round before speaking.
    assert outcome.status == "interrupted"
    assert hass.states.get(KITCHEN).state == "on"

    outcome = await asyncio.wait_for(asyncio.shield(second.outcome), SAFETY_TIMEOUT)
    # The agent's error answer is spoken like any other, and it streams in pieces.
    assert outcome.status == "completed"
    assert outcome.text == "Sorry, Bed Light is not exposed"
    assert "".join(rig.deltas) == outcome.text
    assert len(rig.deltas) > 1
    assert hass.states.get(BED).state == "off"

    delegated = delegated_conversation_id(CHILD)
    assert [c["text"] for c in gate.calls] == [
        "turn on the kitchen light",
        "turn on the bed light",
    ]
    for call in gate.calls:
        assert call["conversation_id"] == delegated != CHILD
        assert call["context"] is context
        assert (call["language"], call["device_id"]) == ("en", "device-1")
        assert call["agent_id"] == conversation.HOME_ASSISTANT_AGENT

    history = rig.kernel.transcript(CHILD)
    assert history is not None
    assert [m.role for m in history] == [
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert history[1].tool_calls is not None
    assert history[1].tool_calls[0].name == HA_ASSIST_TOOL
    assert json.loads(history[2].content)["response_type"] == "action_done"
    assert json.loads(history[5].content) == {
        "speech": "Sorry, Bed Light is not exposed",
        "response_type": "error",
    }
    assert [r[1].arguments["text"] for r in rig.tool_results] == [
        "turn on the kitchen light",
        "turn on the bed light",
    ]


async def test_builtin_agent_failure_fails_the_round(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch, rigs: list[Rig]
) -> None:
    """An agent call that raises becomes a tool error; the round fails cleanly."""
    assert await async_setup_component(hass, "conversation", {})

    async def broken(hass: HomeAssistant, **kwargs: Any) -> Any:
        """Stand-in for async_converse raising (as for a vanished agent)."""
        raise ValueError("Agent conversation.home_assistant not found")

    monkeypatch.setattr(conversation, "async_converse", broken)
    prompts = PromptRegistry()
    rig = await make_rig(
        await async_create_brain(hass, agent_entry(hass), prompts), prompts
    )
    rigs.append(rig)

    outcome = await rig.push("hello")

    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "not found" in outcome.error
    ((_, _, result),) = rig.tool_results
    assert json.loads(result)["error"] == "ValueError"


# ── ha_agent brain: any other agent, interruptible ──────────────────────────────


class LlmLikeAgent(conversation.AbstractConversationAgent):
    """Stand-in for an LLM conversation agent (no LLM can run here).

    Registered in HA's real agent manager; records every input, can be held open
    with ``gate`` and notes when a call is cancelled.
    """

    def __init__(self) -> None:
        """Start with no inputs, answering at once."""
        self.inputs: list[conversation.ConversationInput] = []
        self.started = asyncio.Event()
        self.gate: asyncio.Event | None = None
        self.cancelled = 0
        self.raise_error: Exception | None = None

    @property
    def supported_languages(self) -> str:
        """Any language."""
        return "*"

    async def async_process(
        self, user_input: conversation.ConversationInput
    ) -> conversation.ConversationResult:
        """Answer with a speech echoing the text."""
        self.inputs.append(user_input)
        self.started.set()
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.raise_error is not None:
            raise self.raise_error
        response = intent.IntentResponse(language=user_input.language)
        response.async_set_speech(f"You said {user_input.text}. Anything else?")
        return conversation.ConversationResult(
            response=response, conversation_id=user_input.conversation_id
        )


@pytest.fixture
async def llm_agent(hass: HomeAssistant) -> tuple[LlmLikeAgent, str]:
    """Register the LLM-like agent in HA; return it and its agent id."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "conversation", {})
    agent = LlmLikeAgent()
    agent_owner = MockConfigEntry(domain="test_llm_agent")
    agent_owner.add_to_hass(hass)
    conversation.async_set_agent(hass, agent_owner, agent)
    return agent, agent_owner.entry_id


async def test_llm_agent_is_called_directly(
    hass: HomeAssistant, llm_agent: tuple[LlmLikeAgent, str], rigs: list[Rig]
) -> None:
    """No tool: the agent answers inside the stream, with its own conversation."""
    agent, agent_id = llm_agent
    prompts = PromptRegistry()
    brain = await async_create_brain(hass, agent_entry(hass, agent_id), prompts)
    assert brain.tools is None
    assert isinstance(brain.provider, HaAgentProvider)
    assert brain.provider.via_tool is False
    rig = await make_rig(brain, prompts, device_id="device-3", language="de")
    rigs.append(rig)

    first = await rig.push("hello there")
    second = await rig.push("and now")

    assert first.status == second.status == "completed"
    assert first.text == "You said hello there. Anything else?"
    assert "".join(rig.deltas) == first.text + second.text
    assert [i.text for i in agent.inputs] == ["hello there", "and now"]
    # One stable conversation for the agent, distinct from the session's own id,
    # and one HA keeps (HA swaps unknown ULIDs for new ones: history would be lost).
    (delegated,) = {i.conversation_id for i in agent.inputs}
    assert delegated is not None
    assert delegated != CHILD
    with chat_session.async_get_chat_session(hass, delegated) as session:
        assert session.conversation_id == delegated
    assert agent.inputs[0].device_id == "device-3"
    assert agent.inputs[0].language == "de"
    # The kernel's system message (realtime instructions) is the extra prompt.
    extra = agent.inputs[0].extra_system_prompt
    assert extra is not None
    assert extra.startswith(DEFAULT_SYSTEM_PROMPT)
    stats = rig.kernel.stats(CHILD)
    assert stats is not None
    assert stats.tool_calls == 0


async def test_llm_agent_round_is_interruptible(
    hass: HomeAssistant, llm_agent: tuple[LlmLikeAgent, str], rigs: list[Rig]
) -> None:
    """A push during an LLM agent's call cancels it at once (nothing suppressed)."""
    agent, agent_id = llm_agent
    agent.gate = asyncio.Event()
    prompts = PromptRegistry()
    rig = await make_rig(
        await async_create_brain(hass, agent_entry(hass, agent_id), prompts), prompts
    )
    rigs.append(rig)

    first = rig.kernel.push(CHILD, "tell me a long story")
    await asyncio.wait_for(agent.started.wait(), SAFETY_TIMEOUT)
    agent.gate = None  # the next call answers at once
    second = rig.kernel.push(CHILD, "stop")

    outcome = await asyncio.wait_for(asyncio.shield(first.outcome), SAFETY_TIMEOUT)
    assert outcome.status == "interrupted"
    assert agent.cancelled == 1
    outcome = await asyncio.wait_for(asyncio.shield(second.outcome), SAFETY_TIMEOUT)
    assert outcome.text == "You said stop. Anything else?"
    stats = rig.kernel.stats(CHILD)
    assert stats is not None
    assert stats.suppressed_cancels == 0
    assert stats.interrupted_rounds == 1


async def test_llm_agent_errors(
    hass: HomeAssistant, llm_agent: tuple[LlmLikeAgent, str], rigs: list[Rig]
) -> None:
    """An HA error is spoken as the agent's error answer; a crash fails the round."""
    agent, agent_id = llm_agent
    prompts = PromptRegistry()
    rig = await make_rig(
        await async_create_brain(hass, agent_entry(hass, agent_id), prompts), prompts
    )
    rigs.append(rig)

    agent.raise_error = HomeAssistantError("The model is overloaded")
    outcome = await rig.push("hi")
    assert outcome.status == "completed"
    assert outcome.text == "The model is overloaded"

    agent.raise_error = RuntimeError("boom")
    outcome = await rig.push("hi again")
    assert outcome.status == "failed"
    assert outcome.error is not None
    assert "RuntimeError: boom" in outcome.error


async def test_missing_agent_is_not_ready(hass: HomeAssistant) -> None:
    """An agent that is not loaded (yet): ConfigEntryNotReady."""
    assert await async_setup_component(hass, "conversation", {})
    with pytest.raises(ConfigEntryNotReady) as caught:
        await async_create_brain(
            hass, agent_entry(hass, "conversation.nobody"), PromptRegistry()
        )
    assert caught.value.translation_domain == DOMAIN
    assert caught.value.translation_key == "agent_not_available"
    assert caught.value.translation_placeholders == {"agent_id": "conversation.nobody"}
    with pytest.raises(ConfigEntryNotReady):
        await async_create_brain(
            hass, agent_entry(hass, "01NOSUCHENTRY"), PromptRegistry()
        )


async def test_agent_check_without_conversation(hass: HomeAssistant) -> None:
    """Without the conversation component no agent exists."""
    with pytest.raises(ConfigEntryNotReady):
        await async_create_brain(hass, agent_entry(hass), PromptRegistry())


async def test_agent_check_skipped_without_lookup(
    hass: HomeAssistant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An HA without ``conversation.async_get_agent`` (stub: removed) skips it."""
    monkeypatch.delattr(conversation, "async_get_agent")
    brain = await async_create_brain(
        hass, agent_entry(hass, "conversation.later"), PromptRegistry()
    )
    assert brain.tools is None


# ── the parts on their own ─────────────────────────────────────────────────────────


async def _collect(
    provider: HaAgentProvider, messages: list[Message], tools: list[ToolSpec]
) -> list[Any]:
    return [delta async for delta in provider.stream(messages, tools)]


async def test_builtin_provider_edges(hass: HomeAssistant) -> None:
    """What the tool-mode provider answers to each shape of conversation."""
    assert await async_setup_component(hass, "homeassistant", {})
    assert await async_setup_component(hass, "conversation", {})
    assert await async_setup_component(hass, "intent", {})
    brain = await async_create_brain(hass, agent_entry(hass), PromptRegistry())
    provider = brain.provider
    assert isinstance(provider, HaAgentProvider)
    assert isinstance(brain.tools, HaAgentToolRunner)
    specs = brain.tools.specs()
    system = Message("system", "sys")
    user = Message("user", "what time is it")

    (delta,) = await _collect(provider, [system, user], specs)
    assert delta.tool_calls is not None
    (call,) = delta.tool_calls
    assert (call.name, call.arguments) == (HA_ASSIST_TOOL, {"text": "what time is it"})
    (again,) = await _collect(provider, [system, user], specs)
    assert again.tool_calls is not None
    assert again.tool_calls[0].id != call.id

    asked = Message("assistant", "", tool_calls=[call])
    spoken = Message(
        "tool", json.dumps({"speech": "It is noon."}), tool_call_id=call.id
    )
    deltas = await _collect(provider, [system, user, asked, spoken], specs)
    assert "".join(d.content for d in deltas) == "It is noon."

    other = ToolCall("other", "ask_parent", {"text": "x"})
    foreign = Message("tool", '{"delivered": true}', tool_call_id="other")
    asked_other = Message("assistant", "", tool_calls=[other])
    assert await _collect(provider, [system, user, asked_other, foreign], specs) == []
    orphan = Message("tool", "{}", tool_call_id="unknown")
    assert await _collect(provider, [system, user, orphan], specs) == []
    assert await _collect(provider, [], specs) == []
    assert (
        await _collect(provider, [system, user, Message("assistant", "hi")], specs)
        == []
    )

    for content, message in (
        ("not json", "no readable answer"),
        ("[1]", "no readable answer"),
        (json.dumps({"error": "ValueError", "error_text": "gone"}), "gone"),
        (json.dumps({"error": "tool turn limit reached; not run"}), "limit"),
    ):
        bad = Message("tool", content, tool_call_id=call.id)
        with pytest.raises(ProviderError, match=message):
            await _collect(provider, [system, user, asked, bad], specs)

    # Without ha_assist on offer (tool limit reached) the agent is asked directly.
    deltas = await _collect(provider, [system, user], [])
    assert "".join(d.content for d in deltas)
    assert await _collect(provider, [system, user, asked, spoken], []) == []


async def test_agent_tool_runner_rejects_bad_calls(hass: HomeAssistant) -> None:
    """Unknown tools and missing text are error results, no agent call."""
    assert await async_setup_component(hass, "conversation", {})
    brain = await async_create_brain(hass, agent_entry(hass), PromptRegistry())
    runner = brain.tools
    assert isinstance(runner, HaAgentToolRunner)

    assert (
        "unknown tool"
        in json.loads(await runner.call(ToolCall("a", "nope", {})))["error"]
    )
    for arguments in ({}, {"text": "  "}, {"text": 3}):
        result = json.loads(await runner.call(ToolCall("b", HA_ASSIST_TOOL, arguments)))
        assert "non-empty" in result["error"]


async def test_turns(hass: HomeAssistant) -> None:
    """set/get/pop; a child without a turn gets a neutral one."""
    hass.config.language = "fr"
    turns = Turns(hass)
    neutral = turns.get("unknown")
    assert neutral.language == "fr"
    assert neutral.context.user_id is None
    assert neutral.conversation_id == "unknown"

    turn = TurnContext(Context(user_id="u"), "en", device_id="d")
    turns.set(CHILD, turn)
    assert turns.get(CHILD) is turn
    turns.pop(CHILD)
    assert turns.get(CHILD) is not turn
