"""Assist turns: the preamble before a slow tool reaches a streaming TTS at once.

Issue 17 item 9, pipeline side. Where HA streams the chat log's deltas into TTS
(2026.x), a sentence is released once the character after its period arrives; while
a tool runs none arrives. The feed ends the text so far with a space when the model's
call ends in tool calls, so "Let me check." is spoken during the tool. On HA 2025.4
(finished answers only) nothing changes.

A real Home Assistant with the loopback OpenAI peer; the chat log's delta listener is
the one HA's pipeline installs (``async_get_chat_log(..., chat_log_delta_listener=)``).
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.rtvoice import compat
from homeassistant.components import conversation
from homeassistant.core import Context
from homeassistant.helpers import chat_session, intent
from tests.components.pipeline.helpers import (
    AGENT,
    SATELLITE,
    GatedBedLightOn,
    Home,
    async_setup_rtvoice,
    tool_named,
    wait,
)
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall


class Deltas:
    """The chat log's content deltas, and an event when they read ``expected``."""

    def __init__(self, expected: str) -> None:
        """Wait for ``expected``."""
        self.parts: list[str] = []
        self.expected = expected
        self.reached = asyncio.Event()

    def __call__(self, chat_log: conversation.ChatLog, delta: dict) -> None:
        """Record a delta (the listener HA's pipeline installs)."""
        if content := delta.get("content"):
            self.parts.append(content)
            if self.text == self.expected:
                self.reached.set()

    @property
    def text(self) -> str:
        """Everything written so far."""
        return "".join(self.parts)


async def _turn_with_a_slow_tool(
    home: Home, openai_peer: OpenAIPeer
) -> tuple[Deltas, GatedBedLightOn, asyncio.Task[object]]:
    """Start "bed light on" whose answer says a preamble, then waits in its tool."""
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    await async_setup_rtvoice(home, openai_peer)
    device = home.device_of(SATELLITE)
    await conversation.async_converse(
        hass, "hello", None, Context(), language="en", agent_id=AGENT, device_id=device
    )
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)
    openai_peer.enqueue(Text("Let me check."), ToolCall("call_slow", slow_tool, "{}"))
    openai_peer.enqueue(Text("It is on."))
    deltas = Deltas("Let me check. ")

    async def converse() -> object:
        with (
            chat_session.async_get_chat_session(hass) as session,
            conversation.async_get_chat_log(
                hass, session, chat_log_delta_listener=deltas
            ),
        ):
            return await conversation.async_converse(
                hass,
                "bed light on",
                session.conversation_id,
                Context(),
                language="en",
                agent_id=AGENT,
                device_id=device,
            )

    turn = hass.async_create_task(converse())
    await wait(slow.started.wait())
    return deltas, slow, turn


async def test_streaming_tts_gets_the_preamble_ended_during_the_tool(
    home: Home, openai_peer: OpenAIPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HA streams TTS: "Let me check." is followed by a space before the tool ends."""
    monkeypatch.setattr(compat, "tts_streams_answers", lambda: True)
    deltas, slow, turn = await _turn_with_a_slow_tool(home, openai_peer)
    try:
        await wait(deltas.reached.wait())
    finally:
        slow.gate.set()
    await wait(turn)
    assert deltas.text == "Let me check. It is on."


async def test_finished_answers_only_leave_the_chat_log_as_it_was(
    home: Home, openai_peer: OpenAIPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HA 2025.4 speaks only the finished answer: no extra space is written."""
    monkeypatch.setattr(compat, "tts_streams_answers", lambda: False)
    deltas, slow, turn = await _turn_with_a_slow_tool(home, openai_peer)
    slow.gate.set()
    await wait(turn)
    assert deltas.text == "Let me check.It is on."
