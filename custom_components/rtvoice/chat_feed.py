"""One turn's answer, written into Home Assistant's chat log, and its result.

DESIGN §5.3. Deltas of the round are streamed into the chat log as content only
(``async_add_delta_content_stream``, so HA never runs a tool); a tool call the
kernel finished is appended as an assistant message with that call, followed by its
result. The writing runs in one task per turn, fed through a queue, so nothing on
the per-delta path awaits: ``delta`` and ``tool`` are plain calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
import json
from typing import Any, Final

from homeassistant.components.conversation import (
    AssistantContent,
    AssistantContentDeltaDict,
    ChatLog,
    ConversationResult,
    ToolResultContent,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant
from homeassistant.helpers import intent, llm

from .const import DOMAIN
from .kernel import Outcome, ToolCall

APOLOGY: Final = "Sorry, I couldn't reach the language model."
# What HA's own agent says when it cannot make sense of the words (its English
# "no intent" answer).
NOT_UNDERSTOOD: Final = "Sorry, I couldn't understand that"
# The answer of a turn cut before it said anything and whose tools said nothing.
INTERRUPTED: Final = "I was interrupted."


@dataclass(frozen=True)
class _ToolRecord:
    """A finished tool call, to be written into the chat log."""

    call: ToolCall
    result: str


class _End:
    """Sentinel that ends a turn's feed."""


_END: Final = _End()

type _FeedItem = str | _ToolRecord | _End


class ChatLogFeed:
    """Writes one turn's deltas and finished tool calls into HA's chat log, in order."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        chat_log: ChatLog,
        agent_id: str,
        name: str,
    ) -> None:
        """Start the writing task (a background task of the entry)."""
        self._queue: asyncio.Queue[_FeedItem] = asyncio.Queue()
        self._last_text = ""
        self._task = entry.async_create_background_task(
            hass,
            self._async_write(chat_log, agent_id),
            f"{DOMAIN} chat log feed {name}",
        )

    def delta(self, text: str) -> None:
        """Queue a text delta of the answer."""
        if text:
            self._last_text = text
        self._queue.put_nowait(text)

    def pause(self) -> None:
        """End what was said with a space: the answer's text waits for tool calls.

        A streaming TTS engine releases a sentence once the character after its
        period arrives; a space is that character (HA adds one itself between two
        assistant messages), so the preamble before a tool is spoken at once.
        """
        if self._last_text and not self._last_text[-1].isspace():
            self.delta(" ")

    def tool(self, call: ToolCall, result: str) -> None:
        """Queue a finished tool call and its result."""
        self._queue.put_nowait(_ToolRecord(call, result))

    async def async_finish(self, *, cancel: bool) -> BaseException | None:
        """Let the feed write what it has (or cut it); the error it hit, if any.

        The feed never outlives its turn: with ``cancel`` it stops at once.
        """
        self._queue.put_nowait(_END)
        if cancel:
            self._task.cancel()
        await asyncio.wait((self._task,))
        return None if self._task.cancelled() else self._task.exception()

    async def _async_write(self, chat_log: ChatLog, agent_id: str) -> None:
        queue = self._queue
        item: _FeedItem = await queue.get()
        while not isinstance(item, _End):
            if isinstance(item, _ToolRecord):
                _record_tool(chat_log, agent_id, item)
                item = await queue.get()
                continue
            rest: list[_FeedItem] = []
            async for _content in chat_log.async_add_delta_content_stream(
                agent_id, _text_segment(queue, item, rest)
            ):
                pass
            item = rest[0]


async def _text_segment(
    queue: asyncio.Queue[_FeedItem], first: str, rest: list[_FeedItem]
) -> AsyncIterator[AssistantContentDeltaDict]:
    """Yield one assistant message's deltas; the item that ended it goes to ``rest``."""
    yield {"role": "assistant"}
    yield {"content": first}
    while isinstance(item := await queue.get(), str):
        yield {"content": item}
    rest.append(item)


def tool_result_object(result: str) -> dict[str, Any]:
    """Return a tool result as the JSON object HA's chat log stores."""
    try:
        value = json.loads(result)
    except ValueError:
        return {"result": result}
    return value if isinstance(value, dict) else {"result": value}


def _record_tool(chat_log: ChatLog, agent_id: str, record: _ToolRecord) -> None:
    """Append a finished call and its result (HA must not run it: append directly)."""
    call = record.call
    chat_log.content.append(
        AssistantContent(
            agent_id=agent_id,
            tool_calls=[
                llm.ToolInput(id=call.id, tool_name=call.name, tool_args=call.arguments)
            ],
        )
    )
    chat_log.content.append(
        ToolResultContent(
            agent_id=agent_id,
            tool_call_id=call.id,
            tool_name=call.name,
            tool_result=tool_result_object(record.result),
        )
    )


def interrupted_speech(tool_results: Iterable[str]) -> str:
    """Return what to answer for a turn cut before it said anything: never blank.

    What its finished tools said they did (an Assist tool's speech, the delegated
    agent's speech, else the names of the entities it acted on), else that it was
    interrupted.
    """
    said = [text for result in tool_results if (text := _tool_said(result))]
    return " ".join(said) if said else INTERRUPTED


def _tool_said(result: str) -> str:
    """Return what a tool result says was done ("" when it says nothing usable)."""
    value = tool_result_object(result)
    speech = value.get("speech")
    if isinstance(speech, dict):  # HA's intent response: {"plain": {"speech": …}}
        plain = speech.get("plain")
        speech = plain.get("speech") if isinstance(plain, dict) else None
    if isinstance(speech, str) and speech.strip():
        return speech.strip()
    data = value.get("data")
    success = data.get("success") if isinstance(data, dict) else None
    names = [
        str(target["name"])
        for target in success or ()
        if isinstance(target, dict) and target.get("name")
    ]
    return f"Done: {', '.join(names)}." if names else ""


def _pass_on_results(
    response: intent.IntentResponse, agent_reply: intent.IntentResponse
) -> None:
    """Copy what the delegated agent did (targets, results, states) into ``response``.

    So a pipeline, the Assist dialog or an automation sees the entities switched,
    as with HA's own agent (``data.success`` / ``data.failed``).
    """
    response.response_type = agent_reply.response_type
    response.async_set_targets(list(agent_reply.intent_targets))
    response.async_set_results(
        list(agent_reply.success_results), list(agent_reply.failed_results)
    )
    response.async_set_states(
        list(agent_reply.matched_states), list(agent_reply.unmatched_states)
    )


def not_understood_result(*, language: str, conversation_id: str) -> ConversationResult:
    """Return HA's default agent's answer to words it cannot understand.

    Used for blank input: the same error code (``no_intent_match``) and speech, so
    a pipeline or the Assist dialog treats it as HA's own agent's answer.
    """
    response = intent.IntentResponse(language=language)
    response.async_set_error(
        intent.IntentResponseErrorCode.NO_INTENT_MATCH, NOT_UNDERSTOOD
    )
    return ConversationResult(response=response, conversation_id=conversation_id)


def conversation_result(
    outcome: Outcome,
    *,
    language: str,
    conversation_id: str,
    speech: str,
    agent_reply: intent.IntentResponse | None,
    chat_log: ChatLog,
    agent_id: str,
) -> ConversationResult:
    """Return what HA gets for a turn: the speech, an error, or the apology.

    ``agent_reply`` is the delegated agent's answer (ha_agent brain): when it was
    an error, the turn is an error too, as HA's own agent would answer.
    """
    response = intent.IntentResponse(language=language)
    if outcome.status == "failed":
        chat_log.async_add_assistant_content_without_tools(
            AssistantContent(agent_id=agent_id, content=APOLOGY)
        )
        response.async_set_error(intent.IntentResponseErrorCode.UNKNOWN, APOLOGY)
        return ConversationResult(response=response, conversation_id=conversation_id)
    if (
        outcome.status == "completed"
        and agent_reply is not None
        and agent_reply.response_type is intent.IntentResponseType.ERROR
    ):
        response.async_set_error(
            agent_reply.error_code or intent.IntentResponseErrorCode.UNKNOWN, speech
        )
        return ConversationResult(response=response, conversation_id=conversation_id)
    response.async_set_speech(speech)
    if outcome.status == "completed" and agent_reply is not None:
        _pass_on_results(response, agent_reply)
    return ConversationResult(
        response=response,
        conversation_id=conversation_id,
        continue_conversation=speech.strip().endswith(("?", ";")),
    )
