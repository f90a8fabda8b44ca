"""What the model says before a slow tool is heard before the tool returns.

Issue 17 item 9: the built-in prompt tells the model to say what it is doing before a
slow tool, but the sentence splitter judges a sentence's end only once the next
character arrives. While a tool runs none arrives, so "Let me check the heating."
stayed silent until the tool returned (or forever, when a barge-in cut the round).
The kernel's ``on_text_pause`` tells the session, which speaks what it holds.

A real ``Kernel`` with the scripted provider and tool runner (tests/kernel/fakes.py),
fake STT/TTS/transport (tests/duplex/fakes.py) and the scripted VAD of
test_session.py. Every wait is on an event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from custom_components.rtvoice.duplex import DuplexOptions, UtteranceSegmenter
from custom_components.rtvoice.duplex_link import (
    DuplexBinding,
    DuplexConversation,
    RoundEnds,
)
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel
from tests.duplex.fakes import FakeStt, FakeTransport, FakeTts
from tests.duplex.test_session import quiet, scripted_vad, speech
from tests.kernel.fakes import (
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    call,
)

SAFETY = 10.0  # a safety net against hangs, never a synchronisation
PREAMBLE = "Let me check the heating."


@dataclass
class Rig:
    """A kernel whose only tool waits for ``gate``, and one open conversation."""

    kernel: Kernel
    tools: ScriptedToolRunner
    gate: asyncio.Event
    stt: FakeStt
    tts: FakeTts
    transport: FakeTransport
    conversation: DuplexConversation


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """Build the rig; afterwards no task is left."""
    before = asyncio.all_tasks()
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"heating": ToolBehaviour(result="21 C", gate=gate)})
    provider = ScriptedProvider()
    provider.on(
        "how warm is it",
        [Text("Let me check "), Text("the heating."), Tools.of(call("t1", "heating"))],
        [Text("It is 21 degrees.")],
    )
    round_ends = RoundEnds()
    kernel = Kernel(
        provider,
        ChannelRegistry(),
        tools=tools,
        on_round_end=round_ends,
        on_text_pause=round_ends.paused,
    )
    stt, tts, transport = FakeStt("how warm is it"), FakeTts(100), FakeTransport()
    binding = DuplexBinding(
        kernel=kernel,
        stt=stt,
        tts=tts,
        options=DuplexOptions(end_silence_ms=5000),
        round_ends=round_ends,
    )
    conversation = await DuplexConversation.open(
        binding,
        name="test",
        send=transport.send,
        segmenter=UtteranceSegmenter(scripted_vad, silence_ms=100, pre_roll_ms=50),
        on_end=lambda: None,
    )
    yield Rig(kernel, tools, gate, stt, tts, transport, conversation)
    gate.set()
    await conversation.aclose()
    await kernel.stop_all()
    leftover = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and t is not asyncio.current_task()
    ]
    assert leftover == []


async def test_the_preamble_plays_while_the_tool_runs(rig: Rig) -> None:
    """The sentence before a tool call is synthesised and played before it returns."""
    rig.conversation.session.feed_mic(speech(300) + quiet(150))
    record = await rig.tools.wait_calls(1)
    await asyncio.wait_for(rig.transport.sent(1), SAFETY)
    assert not record.finished.is_set()  # the tool still runs
    assert rig.tts.sentences == [PREAMBLE]
    rig.gate.set()
    await asyncio.wait_for(record.finished.wait(), SAFETY)


async def test_the_played_preamble_is_in_the_history(rig: Rig) -> None:
    """The tool group is committed with the preamble the user heard during the tool."""
    heard = asyncio.Event()
    acknowledge = rig.kernel.acknowledge

    def recorded(child_id: str, seq: int, chars: int, *, final: bool = False) -> None:
        if chars >= len(PREAMBLE):
            heard.set()
        acknowledge(child_id, seq, chars, final=final)

    rig.kernel.acknowledge = recorded  # type: ignore[method-assign]
    rig.conversation.session.feed_mic(speech(300) + quiet(150))
    record = await rig.tools.wait_calls(1)
    await asyncio.wait_for(heard.wait(), SAFETY)  # played to its end, tool running
    rig.gate.set()
    await asyncio.wait_for(record.finished.wait(), SAFETY)
    await rig.conversation.aclose()
    transcript = rig.kernel.transcript(rig.conversation.child_id) or []
    group = [m for m in transcript if m.role == "assistant" and m.tool_calls]
    assert [m.content for m in group] == [PREAMBLE]
