"""The entry's bounds on a model's answer reach its conversations (issue 16 §3)."""

from __future__ import annotations

from custom_components.rtvoice.const import CONF_MAX_ANSWER_CHARS
from homeassistant.core import Context
from tests.components.pipeline.helpers import Home, async_setup_rtvoice
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall


async def test_answer_length_and_tool_turns_apply(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A 150-character bound cuts a long answer; 8 tool turns end a tool loop."""
    await async_setup_rtvoice(home, openai_peer, **{CONF_MAX_ANSWER_CHARS: 150})
    control = home.control
    conversation_id = await control.async_start(None)
    openai_peer.enqueue(Text("word " * 100))
    answered = home.wait_snapshot(
        lambda s: s.id == conversation_id and s.completed_rounds == 1
    )
    await control.async_send(conversation_id, "talk", Context())
    await answered
    transcript = control.transcript(conversation_id, 0, 40, "raw")["transcript"]
    assert transcript[-1]["role"] == "assistant"
    assert 140 <= len(transcript[-1]["content"]) <= 150

    for i in range(20):  # a model that would call tools twenty times
        openai_peer.enqueue(ToolCall(f"call_{i}", "nope", "{}"))
    answered = home.wait_snapshot(
        lambda s: s.id == conversation_id and s.completed_rounds == 2
    )
    await control.async_send(conversation_id, "loop", Context())
    await answered
    # 8 requests with tools, then one without (default max_tool_turns = 8).
    with_tools = [r for r in openai_peer.requests[1:] if r.tools]
    assert len(with_tools) == 8
    assert openai_peer.requests[-1].tools is None
