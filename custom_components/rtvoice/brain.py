"""The two brains of Realtime Voice, as kernel chat providers and tool runners.

* ``openai``: an OpenAI-compatible chat endpoint (``OpenAIChatProvider`` on Home
  Assistant's shared httpx client) with the tools of an HA LLM API
  (``HaToolRunner``).
* ``ha_agent``: every round is delegated to an existing HA conversation agent
  through ``conversation.async_converse``. The built-in agent acts on devices and
  answers fast, so its call is made as one tool call (``ha_assist``) and thereby is
  one kernel critical section: an interruption meanwhile is suppressed and the
  newest words run right after it. Any other agent (an LLM agent) is called
  directly inside the provider's stream, so the round stays interruptible; its own
  tools then run inside that agent where the kernel cannot protect them — tool
  protection needs Realtime Voice's own endpoint (the ``openai`` brain).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
import json
import logging
from typing import TYPE_CHECKING, Any

import openai

from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import (
    ConfigEntryAuthFailed,
    ConfigEntryError,
    ConfigEntryNotReady,
)
from homeassistant.helpers import intent, issue_registry as ir
from homeassistant.helpers.httpx_client import get_async_client
from homeassistant.util.ulid import ulid_now

from . import compat
from .const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_LLM_HASS_API,
    CONF_MODEL,
    CONF_TEMPERATURE,
    DEFAULT_AGENT_ID,
    DEFAULT_BASE_URL,
    DEFAULT_LLM_HASS_API,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    DOMAIN,
    LLM_API_NONE,
)
from .kernel import (
    ChatProvider,
    Delta,
    Message,
    PromptRegistry,
    ToolCall,
    ToolRunner,
    ToolSpec,
    current_child_id,
)
from .kernel.openai_provider import (
    PLACEHOLDER_API_KEY,
    OpenAIChatProvider,
    ProviderAuthError,
    ProviderError,
    ProviderModelNotFoundError,
)
from .speech import split_speech
from .tools import HaToolRunner, ToolResultHook, error_text, report_tool_result
from .turn import TurnContext

if TYPE_CHECKING:
    from .runtime import RtVoiceConfigEntry

_LOGGER = logging.getLogger(__name__)

ISSUE_MODEL_NOT_FOUND = "model_not_found"

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


class _Turns:
    """The latest ``TurnContext`` per child, shared by a brain's parts."""

    def __init__(self, hass: HomeAssistant) -> None:
        self._hass = hass
        self._turns: dict[str, TurnContext] = {}
        # The delegated agent's last answer per child (its response type, error code).
        self.replies: dict[str, intent.IntentResponse] = {}

    def get(self, child_id: str | None) -> TurnContext:
        """Return the child's turn, or a neutral one (no user, HA's language)."""
        turn = self._turns.get(child_id) if child_id is not None else None
        if turn is None:
            turn = TurnContext(
                context=Context(),
                language=self._hass.config.language,
                conversation_id=child_id,
            )
        return turn

    def set(self, child_id: str, turn: TurnContext) -> None:
        self._turns[child_id] = turn
        self.replies.pop(child_id, None)  # a new turn: no answer of the agent yet

    def pop(self, child_id: str) -> None:
        self._turns.pop(child_id, None)
        self.replies.pop(child_id, None)


class Brain:
    """A chat provider and a tool runner for the kernel, plus per-turn context."""

    def __init__(
        self,
        kind: str,
        provider: ChatProvider,
        tools: ToolRunner | None,
        turns: _Turns,
    ) -> None:
        """Bundle the parts of a brain (use ``async_create_brain``)."""
        self.kind = kind
        self.provider = provider
        self.tools = tools
        self._turns = turns
        self._on_tool_result: ToolResultHook | None = None

    @property
    def on_tool_result(self) -> ToolResultHook | None:
        """Called as (child_id, call, result) after each tool call finished."""
        return self._on_tool_result

    @on_tool_result.setter
    def on_tool_result(self, hook: ToolResultHook | None) -> None:
        self._on_tool_result = hook
        if isinstance(self.tools, (HaToolRunner, HaAgentToolRunner)):
            self.tools.on_tool_result = hook

    def turn(self, child_id: str) -> TurnContext:
        """Return the current turn of a child (a neutral one if none was set)."""
        return self._turns.get(child_id)

    def agent_reply(self, child_id: str) -> intent.IntentResponse | None:
        """Return the delegated agent's answer in the child's current turn, if any."""
        return self._turns.replies.get(child_id)

    def set_turn(self, child_id: str, turn: TurnContext) -> None:
        """Remember what HA told us about the child's current turn."""
        self._turns.set(child_id, turn)

    async def async_prepare(self, child_id: str) -> None:
        """Before each push: fetch the LLM API instance for the child's turn."""
        if isinstance(self.tools, HaToolRunner):
            await self.tools.async_prepare(child_id, self._turns.get(child_id))

    def forget(self, child_id: str) -> None:
        """Drop the turn and prepared tools of a closed session."""
        self._turns.pop(child_id)
        if isinstance(self.tools, HaToolRunner):
            self.tools.forget(child_id)


async def async_create_brain(
    hass: HomeAssistant, entry: RtVoiceConfigEntry, prompts: PromptRegistry
) -> Brain:
    """Create the brain an entry is configured for.

    Raises ConfigEntryAuthFailed when the endpoint rejects the key,
    ConfigEntryNotReady when it (or the agent) cannot be reached now.
    """
    kind = entry.data.get(CONF_BRAIN, BRAIN_OPENAI)
    if kind == BRAIN_OPENAI:
        return await _async_create_openai_brain(hass, entry, prompts)
    if kind == BRAIN_HA_AGENT:
        return _create_ha_agent_brain(hass, entry)
    raise ConfigEntryError(
        translation_domain=DOMAIN,
        translation_key="unknown_brain",
        translation_placeholders={"brain": str(kind)},
    )


def _model_issue_id(entry: RtVoiceConfigEntry) -> str:
    return f"{ISSUE_MODEL_NOT_FOUND}_{entry.entry_id}"


async def async_prime_openai(hass: HomeAssistant) -> None:
    """Build the openai SDK's platform headers in the executor.

    The SDK builds them on a client's first request (it runs ``uname`` and reads
    ``/etc/os-release``) and caches them for the process. Done here first, the
    first request never blocks the event loop; HA's own ``openai_conversation``
    primes its client the same way.
    """
    client = openai.AsyncOpenAI(
        api_key=PLACEHOLDER_API_KEY, http_client=get_async_client(hass)
    )
    await hass.async_add_executor_job(client.platform_headers)


async def _async_create_openai_brain(
    hass: HomeAssistant, entry: RtVoiceConfigEntry, prompts: PromptRegistry
) -> Brain:
    model = entry.data.get(CONF_MODEL, DEFAULT_MODEL)
    await async_prime_openai(hass)
    provider = OpenAIChatProvider(
        base_url=entry.data.get(CONF_BASE_URL, DEFAULT_BASE_URL),
        api_key=entry.data.get(CONF_API_KEY),
        model=model,
        http_client=get_async_client(hass),
        temperature=entry.options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE),
    )
    # Provider error messages are short and never contain the API key.
    try:
        await provider.validate()
    except ProviderAuthError as err:
        raise ConfigEntryAuthFailed(
            translation_domain=DOMAIN,
            translation_key="auth_failed",
            translation_placeholders={"error": str(err)},
        ) from err
    except ProviderModelNotFoundError as err:
        ir.async_create_issue(
            hass,
            DOMAIN,
            _model_issue_id(entry),
            is_fixable=False,
            is_persistent=False,
            severity=ir.IssueSeverity.ERROR,
            translation_key=ISSUE_MODEL_NOT_FOUND,
            translation_placeholders={"model": model, "name": entry.title},
        )
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="model_not_found",
            translation_placeholders={"model": str(model), "error": str(err)},
        ) from err
    except ProviderError as err:  # connection errors, 5xx, rate limits …
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="cannot_connect",
            translation_placeholders={"error": str(err)},
        ) from err
    ir.async_delete_issue(hass, DOMAIN, _model_issue_id(entry))

    api_id = entry.options.get(CONF_LLM_HASS_API, DEFAULT_LLM_HASS_API)
    tools = (
        HaToolRunner(hass, prompts, api_id)
        if api_id and api_id != LLM_API_NONE
        else None
    )
    return Brain(BRAIN_OPENAI, provider, tools, _Turns(hass))


def _create_ha_agent_brain(hass: HomeAssistant, entry: RtVoiceConfigEntry) -> Brain:
    agent_id = entry.data.get(CONF_AGENT_ID) or DEFAULT_AGENT_ID
    if not _agent_exists(hass, agent_id):
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="agent_not_available",
            translation_placeholders={"agent_id": str(agent_id)},
        )
    turns = _Turns(hass)
    builtin = agent_id in BUILTIN_AGENT_IDS
    tools = HaAgentToolRunner(hass, agent_id, turns) if builtin else None
    provider = HaAgentProvider(hass, agent_id, turns, via_tool=builtin)
    return Brain(BRAIN_HA_AGENT, provider, tools, turns)


def _agent_exists(hass: HomeAssistant, agent_id: str) -> bool:
    """Tell whether the conversation agent is loaded (unknown: assume it is)."""
    get_agent = getattr(conversation, "async_get_agent", None)
    if get_agent is None:
        return True
    try:
        return get_agent(hass, agent_id) is not None
    except (KeyError, ValueError):  # conversation not set up / unknown agent
        return False


# ── the ha_agent brain ─────────────────────────────────────────────────────


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

    def __init__(self, hass: HomeAssistant, agent_id: str, turns: _Turns) -> None:
        """Create the runner for ``agent_id``."""
        self.hass = hass
        self.agent_id = agent_id
        self.on_tool_result: ToolResultHook | None = None
        self._turns = turns

    def specs(self) -> list[ToolSpec]:
        """Return the one tool: ``ha_assist``."""
        return [HA_ASSIST_SPEC]

    async def call(self, call: ToolCall) -> str:
        """Hand the text to the agent; return its speech as JSON."""
        child_id = current_child_id()
        result = await self._call(child_id, call)
        report_tool_result(self.on_tool_result, child_id, call, result)
        return result

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
        turns: _Turns,
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
    turns: _Turns,
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
