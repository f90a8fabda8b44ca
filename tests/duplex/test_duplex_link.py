"""The duplex conversation's life: sessions come and go, the kernel child stays.

A real ``Kernel`` with the scripted provider (tests/kernel/fakes.py) and fake STT,
TTS and transport (tests/duplex/fakes.py); the VAD is the scripted scorer of
test_session.py. The mic DSP runs on the conversation's real worker thread, so every
wait is on an event (STT called, session ended, conversation closed). One thing is
patched: ``Kernel.close`` of the test's kernel instance, held on an event, to stop
the idle close at its await (there is no other way to hold a close part-way).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
import contextlib
from dataclasses import dataclass, field
import threading
from typing import Any

import pytest

from custom_components.rtvoice.duplex import (
    DspWorker,
    DuplexOptions,
    SessionState,
    UtteranceSegmenter,
)
from custom_components.rtvoice.duplex_link import (
    DuplexBinding,
    DuplexConversation,
    RoundEnds,
)
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel
from tests.duplex.fakes import FakeStt, FakeTransport, FakeTts
from tests.duplex.test_session import quiet, scripted_vad, speech
from tests.kernel.fakes import ScriptedProvider, Text

SAFETY = 10.0  # a safety net against hangs, never a synchronisation


def dsp_threads() -> list[threading.Thread]:
    """Live DSP worker threads."""
    return [t for t in threading.enumerate() if t.name.startswith("rtvoice dsp")]


@dataclass
class Rig:
    """A kernel, a binding and the conversations opened on it."""

    kernel: Kernel
    provider: ScriptedProvider
    stt: FakeStt
    transport: FakeTransport
    binding: DuplexBinding
    segmenter: UtteranceSegmenter
    closed: list[str] = field(default_factory=list)  # hand-offs (kernel on_closed)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # silence: on_end
    idle_closed: list[DuplexConversation] = field(default_factory=list)
    idle_close: asyncio.Event = field(default_factory=asyncio.Event)
    conversations: list[DuplexConversation] = field(default_factory=list)

    async def open(self, dsp: DspWorker | None = None) -> DuplexConversation:
        """Open a conversation as a link does."""

        def on_close(conversation: DuplexConversation) -> None:
            self.idle_closed.append(conversation)
            self.idle_close.set()

        conversation = await DuplexConversation.open(
            self.binding,
            name="test",
            send=self.transport.send,
            segmenter=self.segmenter,
            on_end=self.ended.set,
            dsp=dsp,
            on_close=on_close,
        )
        self.conversations.append(conversation)
        return conversation

    async def turn(self, conversation: DuplexConversation, words: str) -> None:
        """Say something, let the answer play out and the session end by silence."""
        self.ended.clear()
        self.stt.answers.append(words)
        self.stt.started.clear()
        conversation.session.feed_mic(speech(300) + quiet(150))
        await asyncio.wait_for(self.stt.started.wait(), SAFETY)
        # Silence in mic time until the session ends (each chunk is 100 ms).
        while not self.ended.is_set():
            conversation.session.feed_mic(quiet(100))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.05):  # paces the feed, not a sync
                    await self.ended.wait()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """Build the rig; afterwards no conversation, task or DSP thread is left."""
    before = asyncio.all_tasks()
    round_ends = RoundEnds()
    closed: list[str] = []
    provider = ScriptedProvider(default=[Text("Okay.")])
    kernel = Kernel(
        provider,
        ChannelRegistry(),
        on_round_end=round_ends,
        on_closed=lambda child_id, *_: closed.append(child_id),
    )
    stt = FakeStt()
    transport = FakeTransport()
    binding = DuplexBinding(
        kernel=kernel,
        stt=stt,
        tts=FakeTts(100),
        options=DuplexOptions(end_silence_ms=300),
        round_ends=round_ends,
    )
    segmenter = UtteranceSegmenter(scripted_vad, silence_ms=100, pre_roll_ms=50)
    r = Rig(kernel, provider, stt, transport, binding, segmenter, closed)
    yield r
    for conversation in r.conversations:
        await conversation.aclose()
    await kernel.stop_all()
    leftover = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and t is not asyncio.current_task()
    ]
    assert leftover == []
    assert dsp_threads() == []


def with_binding(rig: Rig, **changes: Any) -> None:
    """Replace fields of the rig's binding."""
    fields = {
        name: getattr(rig.binding, name) for name in DuplexBinding.__dataclass_fields__
    }
    rig.binding = DuplexBinding(**{**fields, **changes})


def hold_close(kernel: Kernel) -> tuple[asyncio.Event, asyncio.Event]:
    """Hold ``kernel.close`` at its start: (reached, release)."""
    reached, release = asyncio.Event(), asyncio.Event()
    original: Callable[[str], Awaitable[int]] = kernel.close

    async def held(child_id: str) -> int:
        reached.set()
        await release.wait()
        return await original(child_id)

    kernel.close = held  # type: ignore[method-assign]
    return reached, release


async def test_a_wake_word_after_the_silence_resumes_the_same_child(rig: Rig) -> None:
    """Session ends by silence; resume: same child, the model sees the earlier turn."""
    conversation = await rig.open()
    await rig.turn(conversation, "hello")
    assert conversation.idle and conversation.ended
    assert conversation.child_id in rig.kernel.children()
    first = conversation.session
    assert conversation.resume()
    assert conversation.session is not first and not conversation.ended
    await rig.turn(conversation, "again")
    contents = [m.content for m in rig.provider.calls[1].messages]
    assert contents[-3:] == ["hello", "Okay.", "again"]
    assert rig.closed == []
    await conversation.aclose()
    assert rig.closed == [conversation.child_id]  # handed off once, at the end
    assert not conversation.resume()


async def test_every_session_judges_over_the_satellites_room(rig: Rig) -> None:
    """The room's own loudness (a TV) is the satellite's: each session's gate uses it.

    It is learnt while answers play and must outlive the session and the
    conversation, or every new conversation would start deaf to the TV's level.
    """
    conversation = await rig.open()
    assert conversation.session.gate.room is rig.binding.room
    await rig.turn(conversation, "hello")
    assert conversation.resume()
    assert conversation.session.gate.room is rig.binding.room
    with_binding(rig, system_prompt="another")  # the adapter replaces the binding
    assert rig.binding.room is conversation.binding.room


async def test_the_idle_timeout_closes_the_child_once(rig: Rig) -> None:
    """No wake word within idle_timeout_s: on_close, hand-off once, resume refused."""
    with_binding(rig, idle_timeout_s=0.01)
    conversation = await rig.open()
    await rig.turn(conversation, "hello")
    await asyncio.wait_for(rig.idle_close.wait(), SAFETY)
    assert rig.idle_closed == [conversation] and conversation.closing
    assert not conversation.resume()
    await conversation.aclose()
    await conversation.aclose()
    assert rig.closed == [conversation.child_id]
    assert conversation.child_id not in rig.kernel.children()


async def test_a_wake_word_while_the_idle_close_runs_opens_a_new_child(
    rig: Rig,
) -> None:
    """The close has begun (held at the kernel): resume refuses; a new one opens."""
    with_binding(rig, idle_timeout_s=0.01)
    dsp = DspWorker()  # the link's: one per stream, shared by both conversations
    old = await rig.open(dsp)
    await rig.turn(old, "hello")
    reached, release = hold_close(rig.kernel)
    await asyncio.wait_for(reached.wait(), SAFETY)
    assert not old.resume()
    new = await rig.open(dsp)
    assert new.child_id != old.child_id
    release.set()
    await old.aclose()
    assert rig.closed == [old.child_id]
    assert new.child_id in rig.kernel.children() and not new.ended
    await rig.turn(new, "again")
    assert [m.content for m in rig.provider.calls[-1].messages][-1] == "again"
    await new.aclose()
    await dsp.aclose()


async def test_aclose_right_after_a_resume(rig: Rig) -> None:
    """Close in the same tick as the resume: one close, no task, no thread left."""
    conversation = await rig.open()
    await rig.turn(conversation, "hello")
    assert conversation.resume()
    conversation.session.feed_mic(speech(100))  # audio on its way to the worker
    await conversation.aclose()
    assert rig.closed == [conversation.child_id]
    assert conversation.session.state is SessionState.ENDED


async def test_a_cancelled_aclose_still_closes_once(rig: Rig) -> None:
    """The caller is cancelled while the close is held: it completes, exactly once."""
    conversation = await rig.open()
    await rig.turn(conversation, "hello")
    reached, release = hold_close(rig.kernel)
    closer = asyncio.create_task(conversation.aclose())
    await asyncio.wait_for(reached.wait(), SAFETY)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert not conversation.resume()  # closing: a wake word opens a new one
    release.set()
    await conversation.aclose()  # awaits the same close
    assert rig.closed == [conversation.child_id]


async def test_a_lost_device_ends_the_session_and_keeps_the_child(rig: Rig) -> None:
    """end_session mid-answer: cut as heard, idle; the next session continues."""
    rig.provider.add([Text("This is a long answer. It has two sentences.")])
    conversation = await rig.open()
    rig.transport.hold_at(20)
    rig.stt.answers.append("hello")
    conversation.session.feed_mic(speech(300) + quiet(150))
    await asyncio.wait_for(rig.transport.holding.wait(), SAFETY)
    conversation.end_session()  # the connection is gone
    rig.transport.release()
    assert conversation.idle and conversation.child_id in rig.kernel.children()
    assert not rig.ended.is_set()  # not a silence: no RUN_END from the link
    assert conversation.resume()
    await rig.turn(conversation, "again")
    history = rig.kernel.transcript(conversation.child_id)
    assert history is not None
    # What was heard depends on the loop clock; that it was cut, and where, does not.
    assert [(m.role, m.interrupted) for m in history] == [
        ("user", False),
        ("assistant", True),
        ("user", False),
        ("assistant", False),
    ]
    answer = "This is a long answer. It has two sentences."
    assert answer.startswith(history[1].content) and history[1].content != answer
    assert history[2].content == "again"
    await conversation.aclose()
    assert rig.closed == [conversation.child_id]


async def test_the_worker_runs_jobs_in_order_and_its_thread_ends() -> None:
    """FIFO results on the loop; a failing job is logged and skipped; closed: refused."""
    worker = DspWorker()
    results: list[int] = []
    done = asyncio.Event()

    def fail() -> None:
        raise ValueError("bad chunk")

    for i in range(50):
        worker.submit(lambda i=i: i, done=results.append)
        if i == 10:
            worker.submit(fail)
    worker.submit(lambda: None, done=lambda _: done.set())
    await asyncio.wait_for(done.wait(), SAFETY)
    assert results == list(range(50))
    assert len(dsp_threads()) == 1
    await worker.aclose()
    assert dsp_threads() == []
    assert not worker.submit(lambda: 1)
    await worker.aclose()  # again: nothing to wait for
