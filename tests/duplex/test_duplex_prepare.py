"""The binding's prepare/forget hooks: every session's turn is prepared, once closed forgotten.

The rig of ``test_duplex_link`` (a real ``Kernel``, the scripted provider, fake
STT/TTS/transport). The hooks are recorders the test holds on events; HA's real
preparation (the brain's tools) is tested in tests/components/test_duplex_tools.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from custom_components.rtvoice.duplex_link import DuplexConversation
from tests.duplex.test_duplex_link import SAFETY, Rig, hold_close, rig, with_binding  # noqa: F401 - rig: a fixture
from tests.duplex.test_session import quiet, speech

SCOPE = "assist_satellite.kitchen"


@dataclass
class Hooks:
    """Record prepare/forget calls; ``gate`` holds a prepare, ``fail`` makes it raise."""

    log: list[str] = field(default_factory=list)
    calls: list[tuple[str, str | None]] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event | None = None
    fail: Exception | None = None
    cancelled: int = 0

    async def prepare(self, child_id: str, scope: str | None) -> None:
        """Prepare a turn (held on ``gate``)."""
        self.calls.append((child_id, scope))
        self.reached.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        self.log.append("prepared")

    def forget(self, child_id: str) -> None:
        """Forget a closed child."""
        self.log.append("forgot")
        self.forgotten.append(child_id)


@pytest.fixture
def hooked(rig: Rig) -> tuple[Rig, Hooks]:  # noqa: F811 - the imported fixture
    """Give the rig's binding recording hooks and a prompt scope; STT is logged."""
    hooks = Hooks()
    stt = rig.stt

    async def logged_stt(pcm: bytes) -> str:
        hooks.log.append("stt")
        return await stt(pcm)

    with_binding(
        rig,
        prepare=hooks.prepare,
        forget=hooks.forget,
        prompt_scope=SCOPE,
        stt=logged_stt,
    )
    return rig, hooks


async def drained(conversation: DuplexConversation) -> None:
    """Return once the DSP worker has run every mic job fed so far."""
    done = asyncio.Event()
    assert conversation.dsp.submit(lambda: None, done=lambda _: done.set())
    await asyncio.wait_for(done.wait(), SAFETY)
    for _ in range(5):  # let the transcription task take the utterance
        await asyncio.sleep(0)


async def test_every_session_is_prepared_and_the_closed_child_forgotten(
    hooked: tuple[Rig, Hooks],
) -> None:
    """Open awaits the prepare; a resume's first transcription waits for its own."""
    r, hooks = hooked
    conversation = await r.open()
    assert hooks.calls == [(conversation.child_id, SCOPE)]
    assert hooks.log == ["prepared"]  # before open returned
    await r.turn(conversation, "hello")
    assert hooks.log == ["prepared", "stt"]

    hooks.gate = asyncio.Event()
    hooks.reached.clear()
    assert conversation.resume()  # synchronous; the prepare runs as a task
    await asyncio.wait_for(hooks.reached.wait(), SAFETY)
    r.stt.answers.append("again")
    r.stt.started.clear()
    conversation.session.feed_mic(speech(300) + quiet(150))
    await drained(conversation)
    assert not r.stt.started.is_set()  # held behind the prepare
    hooks.gate.set()
    await asyncio.wait_for(r.stt.started.wait(), SAFETY)
    assert hooks.log == ["prepared", "stt", "prepared", "stt"]
    assert hooks.calls == [(conversation.child_id, SCOPE)] * 2

    await conversation.aclose()
    assert hooks.forgotten == [conversation.child_id]
    assert r.closed == [conversation.child_id]


async def test_a_close_cancels_a_running_prepare_before_forgetting(
    hooked: tuple[Rig, Hooks],
) -> None:
    """Idle close while a resume's prepare is held: cancelled, then forgotten; no task."""
    r, hooks = hooked
    conversation = await r.open()
    await r.turn(conversation, "hello")
    hooks.gate = asyncio.Event()  # never set
    hooks.reached.clear()
    assert conversation.resume()
    await asyncio.wait_for(hooks.reached.wait(), SAFETY)
    reached, release = hold_close(r.kernel)
    closer = asyncio.create_task(conversation.aclose())
    await asyncio.wait_for(reached.wait(), SAFETY)
    assert hooks.cancelled == 1  # cancelled before the child closes
    assert hooks.forgotten == []
    release.set()
    await closer
    assert hooks.log == ["prepared", "stt", "forgot"]
    assert hooks.forgotten == [conversation.child_id]


async def test_a_failed_prepare_is_logged_and_the_conversation_goes_on(
    hooked: tuple[Rig, Hooks], caplog: pytest.LogCaptureFixture
) -> None:
    """A prepare that raises: logged, the session still hears and answers."""
    r, hooks = hooked
    hooks.fail = RuntimeError("no LLM API")
    conversation = await r.open()
    assert "Preparing duplex conversation" in caplog.text
    await r.turn(conversation, "hello")
    assert [m.content for m in r.provider.calls[0].messages][-1] == "hello"
    assert conversation.resume()
    await r.turn(conversation, "again")
    assert [m.content for m in r.provider.calls[1].messages][-1] == "again"
    assert len(hooks.calls) == 2
    await conversation.aclose()
    assert hooks.forgotten == [conversation.child_id]


async def test_a_cancelled_open_closes_the_child_and_forgets_it(
    hooked: tuple[Rig, Hooks],
) -> None:
    """The opener is cancelled during the open's prepare: nothing is left behind."""
    r, hooks = hooked
    hooks.gate = asyncio.Event()  # never set
    opening = asyncio.create_task(r.open())
    await asyncio.wait_for(hooks.reached.wait(), SAFETY)
    [(child_id, _scope)] = hooks.calls
    assert child_id in r.kernel.children()
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert hooks.cancelled == 1
    assert hooks.forgotten == [child_id]
    assert child_id not in r.kernel.children()
