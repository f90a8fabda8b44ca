"""Mic audio faster than real time (issue 16 §2): bounded queues, bounded work per message.

A device that floods its mic stream (10×, 40× real time) must not grow the session's
STT queue or the DSP worker's job queue without end, and one huge message must not
block the loop. Before: 76 utterances / 11.6 MB waited for the STT, 2,580 DSP jobs
were pending, one 32 MB ``VoiceAssistantAudio`` blocked the loop 2.75 s, and one
odd-sized message shifted every later sample by a byte. Here: the session with the
scripted VAD of test_session.py (a gated STT that answers nothing meanwhile), the
real ``DspWorker`` held by a blocking job, and the ESPHome link's message handler.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest

from custom_components.rtvoice.duplex import DspWorker
from custom_components.rtvoice.duplex.session import MAX_PENDING_UTTERANCES
from custom_components.rtvoice.duplex.worker import MAX_QUEUED
from custom_components.rtvoice.duplex_link import DuplexBinding, DuplexConversation
from custom_components.rtvoice.esphome_link import (
    MAX_MIC_MESSAGE,
    EsphomeLink,
    LinkConfig,
)
from tests.duplex.test_session import Rig, quiet, speech

SAFETY = 30.0


async def test_stt_queue_is_bounded_when_utterances_come_faster_than_the_stt() -> None:
    """Forty utterances at once, the STT busy: the newest few wait, the rest are counted."""
    rig = Rig(*(f"words {n}" for n in range(40)))
    rig.stt.gate = asyncio.Event()  # the STT takes its time
    try:
        for _ in range(40):
            rig.session.feed_mic(speech(300) + quiet(150))  # 40x real time: at once
        queued = rig.session._utterances.qsize()  # noqa: SLF001 - the bound under test
        assert queued <= MAX_PENDING_UTTERANCES
        stats = rig.session.stats
        assert stats.utterances == 40
        assert stats.stt_dropped == 40 - MAX_PENDING_UTTERANCES
        async with asyncio.timeout(SAFETY):
            await rig.stt.started.wait()
        rig.stt.gate.set()
        async with asyncio.timeout(SAFETY):
            while len(rig.child.pushes) < MAX_PENDING_UTTERANCES:
                rig.child.pushed.clear()
                await rig.child.pushed.wait()
        assert len(rig.stt.heard) == MAX_PENDING_UTTERANCES  # the others never ran
    finally:
        await rig.session.aclose()


async def test_dsp_queue_drops_the_oldest_mic_jobs_never_control_jobs() -> None:
    """A thousand mic jobs behind a slow one: at most MAX_QUEUED wait, drops counted."""
    worker = DspWorker("flood")
    running = threading.Event()
    release = threading.Event()
    done: list[Any] = []
    loop = asyncio.get_running_loop()
    all_done = asyncio.Event()

    def slow() -> str:
        running.set()
        release.wait(SAFETY)
        return "slow"

    def finished(result: Any) -> None:
        done.append(result)
        if result == "last":
            all_done.set()

    try:
        worker.submit(slow, done=finished)
        await loop.run_in_executor(None, running.wait, SAFETY)
        worker.submit(lambda: "control", done=finished)  # not droppable
        for number in range(1000):
            worker.submit(lambda n=number: n, done=finished, droppable=True)
            assert worker.queued <= MAX_QUEUED
        worker.submit(lambda: "last", done=finished)
        assert worker.dropped == 1000 - (MAX_QUEUED - 2)
        release.set()
        async with asyncio.timeout(SAFETY):
            await all_done.wait()
    finally:
        release.set()
        await worker.aclose()
    assert done[:2] == ["slow", "control"]
    kept = done[2:-1]
    assert kept == list(range(1000 - len(kept), 1000))  # the newest kept, in order
    assert done[-1] == "last"


class _FedSession:
    """Records what the link feeds to the session."""

    def __init__(self) -> None:
        self.fed: list[bytes] = []

    def feed_mic(self, pcm: bytes) -> None:
        self.fed.append(pcm)


class _Conversation:
    def __init__(self) -> None:
        self.session = _FedSession()


@pytest.fixture
async def link() -> Any:
    """Yield an ESPHome link (not connected) whose conversation records mic audio."""
    link = EsphomeLink(LinkConfig("127.0.0.1"), cast(DuplexBinding, None))
    link.conversation = cast(DuplexConversation, _Conversation())
    yield link
    link.conversation = None
    await link.aclose()


async def test_one_huge_mic_message_is_dropped(link: EsphomeLink) -> None:
    """A 32 MB message never reaches the session; the next one does."""
    session = cast(_FedSession, cast(Any, link.conversation).session)
    await link._handle_audio(b"\0" * (32 * 1024 * 1024))  # noqa: SLF001
    await link._handle_audio(b"\1" * MAX_MIC_MESSAGE)  # noqa: SLF001
    assert [len(pcm) for pcm in session.fed] == [MAX_MIC_MESSAGE]
    assert link.mic_stats.oversized == 1


async def test_an_odd_sized_mic_message_does_not_shift_later_samples(
    link: EsphomeLink,
) -> None:
    """Each message is framed on whole samples: the odd byte goes, later ones stay."""
    session = cast(_FedSession, cast(Any, link.conversation).session)
    sample = (1000).to_bytes(2, "little", signed=True)
    await link._handle_audio(sample * 10 + b"\x7f")  # noqa: SLF001 - one byte too many
    await link._handle_audio(sample * 10)  # noqa: SLF001
    assert session.fed == [sample * 10, sample * 10]
    assert link.mic_stats.odd == 1


def test_link_config_repr_holds_no_key() -> None:
    """The noise key is not in the repr (logs, tracebacks)."""
    key = "c2VjcmV0LWtleS0zMi1ieXRlcy1sb25nLWZvci10ZXN0"
    config = LinkConfig("127.0.0.1", noise_psk=key)
    assert key not in repr(config)
    assert config.noise_psk == key
