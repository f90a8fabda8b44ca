"""End of turn by what was said, in the duplex session (issue 18 §1-2), with fakes.

The scripted VAD ends an utterance after a 600 ms hangover (as pymicro-vad's tail
plus the segmenter's silence does); the short silence is 220 ms of quiet frames.
The kernel is a fake here; tests/kernel/test_speculation.py covers its side.
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.rtvoice.duplex import (
    DuplexOptions,
    DuplexSession,
    UtteranceSegmenter,
    VirtualClock,
)
from custom_components.rtvoice.duplex.turn import Eagerness
from tests.duplex.fakes import FakeChild, FakeStt, FakeTransport, FakeTts
from tests.duplex.test_session import quiet, scripted_vad, speech, whisper

HANGOVER_MS = 600
SAFETY_S = 10.0


class TurnRig:
    """A session with end of turn by words, wired to fakes."""

    def __init__(
        self,
        *answers: str | Exception,
        eagerness: Eagerness | None = Eagerness.AUTO,
        recognised: bool | None = None,
    ) -> None:
        """STT answers ``answers``; ``recognised``: what the intent matcher says."""
        self.child = FakeChild()
        self.stt = FakeStt(*answers)
        self.tts = FakeTts(300)
        self.transport = FakeTransport()
        self.recognised: list[str] = []
        self._recognises = recognised
        self.session = DuplexSession(
            self.child,
            stt=self.stt,
            tts=self.tts,
            send=self.transport.send,
            options=DuplexOptions(eagerness=eagerness, end_silence_ms=0),
            segmenter=UtteranceSegmenter(
                scripted_vad, silence_ms=HANGOVER_MS, pre_roll_ms=50
            ),
            clock=VirtualClock(),
            recognise=self.recognise if recognised is not None else None,
        )
        self.session.feed_mic(quiet(500))  # the gate learns the room

    async def recognise(self, text: str) -> bool:
        """Answer as HA's intent matching would."""
        self.recognised.append(text)
        return bool(self._recognises)

    async def answer(self, seq: int, text: str, *, end: bool = True) -> None:
        """Stream ``text`` as the kernel would for round ``seq``."""
        for word in text.split(" "):
            self.session.output_delta(seq, word + " ")
        if end:
            self.session.output_end(seq)


async def wait(event: asyncio.Event) -> None:
    """Await ``event``, with a safety net against a hang (never a synchronisation)."""
    async with asyncio.timeout(SAFETY_S):
        await event.wait()


async def settle(n: int = 30) -> None:
    """Let the session's tasks run (scheduling steps, not time)."""
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
async def rigs():
    """Make rigs; close them and check that no task is left."""
    made: list[TurnRig] = []

    def make(*answers, **kwargs) -> TurnRig:
        rig = TurnRig(*answers, **kwargs)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.session.aclose()
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []


async def test_a_complete_sentence_ends_the_turn_at_the_short_silence(rigs) -> None:
    """'turn off the kitchen lights' + 250 ms: pushed long before the hangover."""
    rig = rigs("turn off the kitchen lights")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.child.speculative == []  # ended, not speculated
    assert rig.session.stats.early_ends == 1
    rig.session.feed_mic(quiet(HANGOVER_MS + 100))  # the VAD's tail is no utterance
    await settle()
    assert len(rig.stt.heard) == 1
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.session.stats.utterances == 1


async def test_the_vad_tail_after_an_early_end_is_no_utterance(rigs) -> None:
    """The VAD goes on saying speech over silence after the turn ended: dropped."""
    rig = rigs("turn off the kitchen lights")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    rig.session.feed_mic(whisper(300) + quiet(HANGOVER_MS + 100))  # no energy
    await settle()
    assert len(rig.stt.heard) == 1  # not transcribed (an STT may hallucinate)
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.session.stats.vad_tails == 1


async def test_without_eagerness_the_short_silence_changes_nothing(rigs) -> None:
    """Without eagerness the turn ends by the hangover alone (today's behaviour)."""
    rig = rigs("turn off the kitchen lights", eagerness=None)
    rig.session.feed_mic(speech(400) + quiet(250))
    await settle()
    assert rig.stt.heard == []
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    assert rig.child.pushes == ["turn off the kitchen lights"]


async def test_unfinished_words_wait_for_the_hangover(rigs) -> None:
    """'turn on the' waits; the hangover pushes those words, transcribed once."""
    rig = rigs("turn on the")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.stt.started)
    await settle()
    assert rig.child.pushes == []
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    assert rig.child.pushes == ["turn on the"]
    assert len(rig.stt.heard) == 1  # the early transcript served the utterance
    assert rig.child.speculative == []


async def test_unfinished_words_then_more_words_end_at_the_next_silence(rigs) -> None:
    """A mid-sentence pause: the rest of the words and a second short silence."""
    rig = rigs("turn on the", "turn on the kitchen lights")
    rig.session.feed_mic(speech(300) + quiet(400))  # a 400 ms hesitation
    await wait(rig.stt.started)
    await settle()
    assert rig.child.pushes == []
    rig.session.feed_mic(speech(300) + quiet(250))
    await wait(rig.child.pushed)
    assert rig.child.pushes == ["turn on the kitchen lights"]
    assert len(rig.stt.heard[1]) > len(rig.stt.heard[0])  # the whole utterance


async def test_a_recognised_command_ends_the_turn_even_at_low_eagerness(rigs) -> None:
    """HA's intent matching recognises the words: the turn ends now."""
    rig = rigs("kitchen lights on", eagerness=Eagerness.LOW, recognised=True)
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    assert rig.recognised == ["kitchen lights on"]
    assert rig.child.speculative == []
    assert rig.session.stats.early_ends == 1


async def test_speculation_confirmed_by_the_hangover_plays(rigs) -> None:
    """HOLD: answered at once, synthesised, played only once the hangover confirms."""
    rig = rigs("turn off the kitchen lights", eagerness=Eagerness.LOW, recognised=False)
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    assert rig.child.speculative == [1]
    await rig.answer(1, "Done. The lights are off.")
    await settle()
    assert rig.tts.sentences == ["Done."]  # the first sentence is ready ...
    assert rig.transport.frames == []  # ... and not played
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.acked_final)
    assert rig.child.confirms == [1]
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)
    assert rig.child.pushes == ["turn off the kitchen lights"]  # no second push
    assert len(rig.stt.heard) == 1  # no second transcription
    stats = rig.session.stats
    assert (stats.speculations, stats.confirmed_speculations, stats.preempted) == (
        1,
        1,
        0,
    )


async def test_speculation_superseded_when_the_user_goes_on(rigs) -> None:
    """Speech after the short silence withdraws the held answer; nothing plays."""
    rig = rigs(
        "turn off the kitchen lights",
        "turn off the kitchen lights and the fan",
        eagerness=Eagerness.LOW,
        recognised=False,
    )
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer(1, "Done. The lights are off.", end=False)
    await settle()
    rig.session.feed_mic(speech(300))  # the user goes on
    assert rig.child.withdrawn == [1]
    assert rig.child.finals() == [(1, 0)]  # nothing of it was heard
    rig.child.pushed.clear()
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    assert rig.child.pushes[-1] == "turn off the kitchen lights and the fan"
    assert rig.child.speculative == [1]  # one speculative round per utterance
    assert rig.transport.frames == []
    assert rig.session.stats.preempted == 1
    assert rig.session.stats.confirmed_speculations == 0


async def test_one_speculative_round_per_utterance(rigs) -> None:
    """A second short silence in the same utterance does not speculate again."""
    rig = rigs(
        "turn off the lights",
        "turn off the lights in the hall",
        "turn off the lights in the hall",
        eagerness=Eagerness.LOW,
        recognised=False,
    )
    rig.session.feed_mic(speech(300) + quiet(300))
    await wait(rig.child.pushed)
    rig.session.feed_mic(speech(300) + quiet(300))  # resumes, pauses again
    await settle()
    assert rig.child.speculative == [1]
    assert len(rig.child.pushes) == 1
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.pushes[-1] == "turn off the lights in the hall"
    assert rig.child.speculative == [1]


async def test_a_wake_word_during_speculation_cuts_the_held_answer(rigs) -> None:
    """A barge-in by wake word while the answer is held: nothing plays."""
    rig = rigs("turn off the kitchen lights", eagerness=Eagerness.LOW, recognised=False)
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    await rig.answer(1, "Done. The lights are off.", end=False)
    await settle()
    rig.session.wake_word_detected()
    assert rig.child.interrupts == 1
    assert rig.child.finals() == [(1, 0)]
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.confirms == []
    assert rig.transport.frames == []


async def test_a_failed_speculation_is_asked_again_at_the_hangover(rigs) -> None:
    """confirm() too late (the round failed): the words are pushed as usual."""
    rig = rigs("turn off the kitchen lights", eagerness=Eagerness.LOW, recognised=False)
    rig.child.confirm_fails = True
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.pushes == ["turn off the kitchen lights"] * 2
    assert rig.child.speculative == [1]
