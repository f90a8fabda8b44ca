"""The ha_agent brain: every round is delegated to a Home Assistant agent.

The built-in (intent matching) agent acts on devices and answers fast, so its call
is made as one tool call (``ha_assist``) and thereby is one kernel critical
section: an interruption meanwhile is suppressed and the newest words run right
after it. Any other agent (an LLM agent) is called directly inside the provider's
stream, so the round stays interruptible; its own tools then run inside that agent
where the kernel cannot protect them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
import json
import logging
from typing import Any

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import ConfigEntryNotReady
from homeassistant.util.ulid import ulid_now

from . import compat
from .const import CONF_AGENT_ID, DEFAULT_AGENT_ID, DOMAIN
from .kernel import Delta, Message, ToolCall, ToolSpec, current_child_id
from .kernel.openai_provider import ProviderError
from .speech import split_speech
from .tools import error_text
from .turn import Turns

_LOGGER = logging.getLogger(__name__)

HA_ASSIST_TOOL = "ha_assist"
HA_ASSIST_SPEC = ToolSpec(
    name=HA_ASSIST_TOOL,
    description=(
        "Hand the user's words to the Home Assistant conversation agent, which"
        " controls devices and answers; returns what it says."
    ),
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The user's words."}},
        "required": ["text"],
    },
)
# Agent ids of HA's built-in (intent matching) conversation agent.
BUILTIN_AGENT_IDS = frozenset(
    {
        getattr(conversation, "HOME_ASSISTANT_AGENT", DEFAULT_AGENT_ID),
        getattr(conversation, "OLD_HOME_ASSISTANT_AGENT", "homeassistant"),
    }
)


def create_ha_agent_parts(
    hass: HomeAssistant, entry: ConfigEntry
) -> tuple[HaAgentProvider, HaAgentToolRunner | None, Turns]:
    """Create the provider, tool runner and turns of an ha_agent brain.

    Raises ConfigEntryNotReady when the agent is not loaded.
    """
    agent_id = entry.data.get(CONF_AGENT_ID) or DEFAULT_AGENT_ID
    if not _agent_exists(hass, agent_id):
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="agent_not_available",
            translation_placeholders={"agent_id": str(agent_id)},
        )
    turns = Turns(hass)
    builtin = agent_id in BUILTIN_AGENT_IDS
    tools = HaAgentToolRunner(hass, agent_id, turns) if builtin else None
    provider = HaAgentProvider(hass, agent_id, turns, via_tool=builtin)
    return provider, tools, turns


def _agent_exists(hass: HomeAssistant, agent_id: str) -> bool:
    """Tell whether the conversation agent is loaded (unknown: assume it is)."""
    get_agent = getattr(conversation, "async_get_agent", None)
    if get_agent is None:
        return True
    try:
        return get_agent(hass, agent_id) is not None
    except (KeyError, ValueError):  # conversation not set up / unknown agent
        return False


def delegated_conversation_id(child_id: str | None) -> str | None:
    """Return the conversation id the delegated agent keeps its history under.

    Stable per child, and not a ULID, so HA keeps it (HA replaces unknown ULIDs)
    and never confuses it with the session's own conversation (the child id).
    """
    return f"{DOMAIN}_{child_id}" if child_id else None


def _speech_of(result: conversation.ConversationResult) -> tuple[str, str]:
    """Return (speech, response type) of an agent's answer; errors are spoken too."""
    response = result.response
    speech = ""
    for kind in ("plain", "ssml"):
        if speech := (response.speech.get(kind) or {}).get("speech") or "":
            break
    response_type = getattr(response.response_type, "value", response.response_type)
    return speech, str(response_type)


class HaAgentToolRunner:
    """Runs ``ha_assist``: one call of the built-in conversation agent.

    The kernel runs it as a critical section, so switching a device is never cut
    half-way. The result is JSON ``{"speech", "response_type"}``.
    """

    def __init__(self, hass: HomeAssistant, agent_id: str, turns: Turns) -> None:
        """Create the runner for ``agent_id``."""
        self.hass = hass
        self.agent_id = agent_id
        self._turns = turns

    def specs(self) -> list[ToolSpec]:
        """Return the one tool: ``ha_assist``."""
        return [HA_ASSIST_SPEC]

    async def call(self, call: ToolCall) -> str:
        """Hand the text to the agent; return its speech as JSON."""
        return await self._call(current_child_id(), call)

    async def _call(self, child_id: str | None, call: ToolCall) -> str:
        if call.name != HA_ASSIST_TOOL:
            return error_text(f"unknown tool {call.name!r}")
        text = call.arguments.get("text")
        if not isinstance(text, str) or not text.strip():
            return error_text("ha_assist needs a non-empty 'text' string")
        try:
            result = await _async_ask_agent(
                self.hass, self.agent_id, self._turns, child_id, text
            )
        except Exception as err:  # noqa: BLE001 - becomes an error result
            _LOGGER.warning(
                "Conversation agent %s failed: %s", self.agent_id, type(err).__name__
            )
            return error_text(err)
        speech, response_type = _speech_of(result)
        return json.dumps(
            {"speech": speech, "response_type": response_type}, ensure_ascii=False
        )


class HaAgentProvider:
    """A chat provider that delegates to an HA conversation agent.

    ``via_tool`` (the built-in agent): a new user message is answered with one
    complete ``ha_assist`` call, run by ``HaAgentToolRunner`` as a critical
    section; after its result the agent's speech is streamed as the answer.
    Otherwise (an LLM agent) the agent is called right here, inside the stream, so
    an interruption cancels it; the kernel's system message is handed to it as
    extra instructions.
    """

    def __init__(
        self,
        hass: HomeAssistant,
        agent_id: str,
        turns: Turns,
        *,
        via_tool: bool,
    ) -> None:
        """Create the provider for ``agent_id``."""
        self.hass = hass
        self.agent_id = agent_id
        self.via_tool = via_tool
        self._turns = turns

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Answer the newest user message (or speak the agent's tool result)."""
        if not messages:
            return
        last = messages[-1]
        if self.via_tool and any(spec.name == HA_ASSIST_TOOL for spec in tools):
            if last.role == "user":
                yield Delta(
                    tool_calls=[
                        ToolCall(
                            id=f"call_{ulid_now()}",
                            name=HA_ASSIST_TOOL,
                            arguments={"text": last.content},
                        )
                    ]
                )
            elif last.role == "tool" and _called(messages, last.tool_call_id):
                for piece in split_speech(_tool_speech(last.content)):
                    yield Delta(content=piece)
            return
        if last.role != "user":
            return
        speech = await self._async_converse(messages, last.content)
        for piece in split_speech(speech):
            yield Delta(content=piece)

    async def _async_converse(self, messages: list[Message], text: str) -> str:
        child_id = current_child_id()
        system = messages[0].content if messages[0].role == "system" else None
        try:
            result = await _async_ask_agent(
                self.hass,
                self.agent_id,
                self._turns,
                child_id,
                text,
                extra_system_prompt=system or None,
            )
        except Exception as err:
            raise ProviderError(
                f"conversation agent {self.agent_id} failed ({type(err).__name__}: {err})"
            ) from err
        return _speech_of(result)[0]


async def _async_ask_agent(
    hass: HomeAssistant,
    agent_id: str,
    turns: Turns,
    child_id: str | None,
    text: str,
    *,
    extra_system_prompt: str | None = None,
) -> conversation.ConversationResult:
    """Hand one turn of a child to the delegated agent (its own conversation id).

    The agent's answer is remembered for the child, so the session can report an
    error answer as an error (not only speak it).
    """
    turn = turns.get(child_id)
    result = await compat.async_converse(
        hass,
        text=text,
        conversation_id=delegated_conversation_id(child_id),
        context=turn.context,
        language=turn.language,
        agent_id=agent_id,
        device_id=turn.device_id,
        satellite_id=turn.satellite_id,
        extra_system_prompt=extra_system_prompt,
    )
    if child_id is not None:
        turns.replies[child_id] = result.response
    return result


def _called(messages: list[Message], tool_call_id: str | None) -> bool:
    """Tell whether the tool result answers an ``ha_assist`` call."""
    for message in reversed(messages):
        for call in message.tool_calls or ():
            if call.id == tool_call_id:
                return call.name == HA_ASSIST_TOOL
    return False


def _tool_speech(content: str) -> str:
    """Return the speech of an ``ha_assist`` result; raise ProviderError if it failed."""
    try:
        payload: Any = json.loads(content)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        raise ProviderError("the conversation agent gave no readable answer")
    speech = payload.get("speech")
    if isinstance(speech, str):
        return speech
    detail = payload.get("error_text") or payload.get("error") or "no answer"
    raise ProviderError(f"the conversation agent failed: {detail}")
