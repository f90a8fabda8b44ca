"""The conversation entity, driven through HA's real conversation component.

The model is the loopback OpenAI peer; tools are HA's real Assist LLM API acting on
the demo lights; the satellites are real ``assist_satellite`` entities (test-made,
see tests/components/pipeline/helpers.py).
"""

from __future__ import annotations

import json
from typing import Any

from custom_components.rtvoice.chat_feed import APOLOGY
from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BRAIN,
    CONF_PROMPT,
    DOMAIN,
)
from custom_components.rtvoice.entity import MANUFACTURER
from custom_components.rtvoice.kernel import DEFAULT_SYSTEM_PROMPT
from homeassistant.components import conversation
from homeassistant.const import MATCH_ALL, STATE_OFF, STATE_ON
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import chat_session, device_registry as dr, intent
from tests.components.common import PEER_MODEL
from tests.components.pipeline.helpers import (
    AGENT,
    BED_LIGHT,
    SATELLITE,
    Home,
    async_setup_rtvoice,
    tool_named,
)
from tests.peers.openai_server import Fail, OpenAIPeer, Text, ToolCall


async def converse_logged(
    hass: HomeAssistant,
    text: str,
    conversation_id: str | None = None,
    device_id: str | None = None,
    extra_system_prompt: str | None = None,
) -> tuple[conversation.ConversationResult, conversation.ChatLog, list[dict[str, Any]]]:
    """Converse the way HA's pipeline does: with an open chat log and a delta listener."""
    deltas: list[dict[str, Any]] = []

    def listener(_chat_log: conversation.ChatLog, delta: dict[str, Any]) -> None:
        deltas.append(delta)

    with (
        chat_session.async_get_chat_session(hass, conversation_id) as session,
        conversation.async_get_chat_log(
            hass,
            session,
            conversation.ConversationInput(
                text=text,
                context=Context(),
                conversation_id=session.conversation_id,
                device_id=device_id,
                language="en",
                agent_id=AGENT,
            ),
            chat_log_delta_listener=listener,
        ) as chat_log,
    ):
        result = await conversation.async_converse(
            hass,
            text,
            session.conversation_id,
            Context(),
            language="en",
            agent_id=AGENT,
            device_id=device_id,
            extra_system_prompt=extra_system_prompt,
        )
    return result, chat_log, deltas


def speech(result: conversation.ConversationResult) -> str:
    """Return the plain speech of a result."""
    return str(result.response.speech["plain"]["speech"])


async def test_entity(home: Home, openai_peer: OpenAIPeer) -> None:
    """One agent entity per entry, on a service device, able to control HA."""
    hass = home.hass
    entry = await async_setup_rtvoice(home, openai_peer)
    state = hass.states.get(AGENT)
    assert state is not None
    assert (
        state.attributes["supported_features"]
        == conversation.ConversationEntityFeature.CONTROL
    )
    agent = conversation.async_get_agent(hass, AGENT)
    assert agent is not None
    assert agent.supported_languages == MATCH_ALL
    info = conversation.async_get_agent_info(hass, AGENT)
    assert info is not None and info.id == AGENT
    device = dr.async_get(hass).async_get_device(identifiers={(DOMAIN, entry.entry_id)})
    assert device is not None
    assert device.manufacturer == MANUFACTURER
    assert device.model == PEER_MODEL
    assert device.entry_type is dr.DeviceEntryType.SERVICE
    assert device.name == entry.title


async def test_entity_without_tools(home: Home, openai_peer: OpenAIPeer) -> None:
    """Without an LLM API the agent does not claim it can control HA."""
    await async_setup_rtvoice(home, openai_peer, llm_hass_api="none")
    state = home.hass.states.get(AGENT)
    assert state is not None
    assert not state.attributes.get("supported_features")


async def test_entity_of_a_delegating_entry(home: Home) -> None:
    """With the ha_agent brain the device names the agent the answers come from."""
    hass = home.hass
    entry = await async_setup_rtvoice(
        home,
        None,
        data={CONF_BRAIN: BRAIN_HA_AGENT, CONF_AGENT_ID: "conversation.home_assistant"},
    )
    device = dr.async_get(hass).async_get_device(identifiers={(DOMAIN, entry.entry_id)})
    assert device is not None
    assert device.model == "Home Assistant agent"  # its name, not its entity id


async def test_streaming_answer_on_satellite_device(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Deltas stream into the chat log; the speech is their join; routed by device."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Text("Hello"), Text(" from the"), Text(" kitchen."))
    result, chat_log, deltas = await converse_logged(
        hass, "hi there", device_id=home.device_of(SATELLITE)
    )
    assert speech(result) == "Hello from the kitchen."
    assert result.continue_conversation is False
    # HA's chat log got the answer as content deltas: a new assistant message, then
    # the pieces in order (never tool calls).
    assert deltas[0] == {"role": "assistant"}
    assert [d["content"] for d in deltas[1:]] == ["Hello", " from the", " kitchen."]
    assert chat_log.content[-1] == conversation.AssistantContent(
        agent_id=AGENT, content="Hello from the kitchen."
    )
    # The session belongs to the satellite of that device; its id is HA's.
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.id == result.conversation_id == chat_log.conversation_id
    assert snapshot.completed_rounds == 1
    (listed,) = home.control.list_conversations()
    assert listed["satellite"] == SATELLITE
    assert listed["device_id"] == home.device_of(SATELLITE)
    # The request carried the satellite's prompt sections (scope = its entity id).
    system = openai_peer.requests[0].messages[0]
    assert system["role"] == "system"
    assert system["content"].startswith(DEFAULT_SYSTEM_PROMPT)
    assert "Kitchen satellite" in system["content"]


async def test_tool_call_switches_a_light_and_history_is_kept(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A real Assist tool switches a demo light; turns build one history."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    device_id = home.device_of(SATELLITE)
    openai_peer.enqueue(Text("Hi! What can I do?"))
    first, _, _ = await converse_logged(hass, "hello", device_id=device_id)
    assert speech(first) == "Hi! What can I do?"
    assert first.continue_conversation is True  # a question keeps the mic open

    turn_on = tool_named(openai_peer.requests[0].tools, "HassTurnOn")
    assert hass.states.get(BED_LIGHT).state == STATE_OFF
    openai_peer.enqueue(
        Text("Switching it on."),
        ToolCall("call_1", turn_on, json.dumps({"name": "Bed Light"})),
    )
    openai_peer.enqueue(Text("The bed light is on."))
    second, chat_log, deltas = await converse_logged(
        hass, "turn on the bed light", first.conversation_id, device_id
    )
    assert second.conversation_id == first.conversation_id
    # The answers before and after the tool are two sentences, not glued.
    assert speech(second) == "Switching it on. The bed light is on."
    assert hass.states.get(BED_LIGHT).state == STATE_ON

    # History across turns: the second request holds the whole first exchange.
    messages = openai_peer.requests[1].messages
    assert [(m["role"], m.get("content")) for m in messages[1:]] == [
        ("user", "hello"),
        ("assistant", "Hi! What can I do?"),
        ("user", "turn on the bed light"),
    ]
    # The third request answers the tool result.
    tool_message = openai_peer.requests[2].messages[-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_1"
    assert json.loads(tool_message["content"])["response_type"] == "action_done"

    # HA's chat log: text, the finished call with its result, then the answer.
    # HA never ran the tool itself: no streamed delta carried tool calls.
    assert all("tool_calls" not in d for d in deltas)
    tail = chat_log.content[-4:]
    assert tail[0] == conversation.AssistantContent(
        agent_id=AGENT, content="Switching it on."
    )
    assert isinstance(tail[1], conversation.AssistantContent)
    assert tail[1].tool_calls is not None
    (tool_input,) = tail[1].tool_calls
    assert (tool_input.id, tool_input.tool_name, tool_input.tool_args) == (
        "call_1",
        turn_on,
        {"name": "Bed Light"},
    )
    assert isinstance(tail[2], conversation.ToolResultContent)
    assert tail[2].tool_call_id == "call_1"
    assert tail[2].tool_result["response_type"] == "action_done"
    assert tail[3] == conversation.AssistantContent(
        agent_id=AGENT, content="The bed light is on."
    )


async def test_failed_upstream_apologises_and_recovers(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """An HTTP 500 ends the round with a spoken apology; the next turn works."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Fail(500, "upstream exploded"))
    failed, chat_log, _ = await converse_logged(hass, "hello")
    assert speech(failed) == APOLOGY
    assert failed.response.error_code is intent.IntentResponseErrorCode.UNKNOWN
    assert chat_log.content[-1] == conversation.AssistantContent(
        agent_id=AGENT, content=APOLOGY
    )

    openai_peer.enqueue(Text("I am back."))
    recovered, _, _ = await converse_logged(hass, "hello again", failed.conversation_id)
    assert recovered.conversation_id == failed.conversation_id
    assert speech(recovered) == "I am back."
    assert recovered.response.error_code is None
    # History holds what the user was told: the input and the apology.
    assert [m["content"] for m in openai_peer.requests[1].messages[1:]] == [
        "hello",
        APOLOGY,
        "hello again",
    ]


async def test_prompt_template_and_extra_prompt(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """The prompt option is a template rendered once per session; HA's extra prompt follows."""
    hass = home.hass
    await async_setup_rtvoice(
        home, openai_peer, **{CONF_PROMPT: "You serve {{ 'the ' ~ 'house' }}."}
    )
    result, _, _ = await converse_logged(
        hass, "hello", extra_system_prompt="The user just came home."
    )
    system = openai_peer.requests[0].messages[0]["content"]
    assert system.startswith("You serve the house.\n\nThe user just came home.")
    assert DEFAULT_SYSTEM_PROMPT not in system
    assert speech(result) == "ok"  # the peer's default answer


async def test_bad_prompt_template_is_used_verbatim(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A prompt that does not render is sent as written (and the turn still works)."""
    await async_setup_rtvoice(home, openai_peer, **{CONF_PROMPT: "Hi {{ broken"})
    result, _, _ = await converse_logged(home.hass, "hello")
    assert speech(result) == "ok"
    assert openai_peer.requests[0].messages[0]["content"].startswith("Hi {{ broken")


async def test_process_through_the_entity(home: Home, openai_peer: OpenAIPeer) -> None:
    """``conversation.process`` (the service HA's UI uses) reaches the agent too."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Text("Service answer."))
    response = await hass.services.async_call(
        "conversation",
        "process",
        {"text": "hello", "agent_id": AGENT},
        blocking=True,
        return_response=True,
    )
    assert response is not None
    assert response["response"]["speech"]["plain"]["speech"] == "Service answer."
    assert response["conversation_id"] in home.sessions.known_ids()
