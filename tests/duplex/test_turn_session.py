"""End of turn by what was said, in the duplex session (issue 18 §1-2), with fakes.

The scripted VAD ends an utterance after a 600 ms hangover (as pymicro-vad's tail
plus the segmenter's silence does); the short silence is 220 ms of quiet frames.
The kernel is a fake in most tests (tests/kernel/test_speculation.py covers its
side); the last ones run a real ``Kernel`` with a scripted model and device tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from custom_components.rtvoice.duplex import (
    BargeIn,
    DuplexOptions,
    DuplexSession,
    SessionState,
    UtteranceSegmenter,
    VirtualClock,
)
from custom_components.rtvoice.duplex.turn import Eagerness
from custom_components.rtvoice.duplex_link import (
    DuplexBinding,
    DuplexConversation,
    RoundEnds,
)
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel
from tests.duplex.fakes import FakeChild, FakeStt, FakeTransport, FakeTts
from tests.duplex.test_session import cough, quiet, scripted_vad, speech, whisper
from tests.kernel.fakes import (
    Notifier,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    call,
    yield_many,
)

HANGOVER_MS = 600
SAFETY_S = 10.0


class TurnRig:
    """A session with end of turn by words, wired to fakes."""

    def __init__(
        self,
        *answers: str | Exception,
        eagerness: Eagerness | None = Eagerness.AUTO,
        recognised: bool | None = None,
        tts: FakeTts | None = None,
        barge_in: BargeIn = BargeIn.VAD,
    ) -> None:
        """STT answers ``answers``; ``recognised``: what the intent matcher says."""
        self.child = FakeChild()
        self.stt = FakeStt(*answers)
        self.tts = tts if tts is not None else FakeTts(300)
        self.transport = FakeTransport()
        self.recognised: list[str] = []
        self._recognises = recognised
        self.session = DuplexSession(
            self.child,
            stt=self.stt,
            tts=self.tts,
            send=self.transport.send,
            options=DuplexOptions(
                eagerness=eagerness, end_silence_ms=0, barge_in=barge_in
            ),
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

    async def answer_held(self, seq: int, text: str) -> None:
        """Stream ``text``, then wait for the confirmation (as the kernel does)."""
        await self.answer(seq, text, end=False)
        self.session.output_pause(seq)  # Kernel(on_text_pause=...)


class GatedTts(FakeTts):
    """A TTS that takes each sentence, then waits for ``gate`` before its audio."""

    def __init__(self) -> None:
        """Audio as FakeTts(300); nothing comes until ``gate`` is set."""
        super().__init__(300)
        self.gate = asyncio.Event()
        self.took = asyncio.Event()  # a sentence is being synthesised

    async def __call__(self, text: str):
        """Take the sentence, wait for the gate, then yield its audio."""
        self.took.set()
        await self.gate.wait()
        async for chunk in super().__call__(text):
            yield chunk


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
    """'turn off the kitchen lights' + 250 ms: pushed long before the hangover.

    Pushed revocably (speculative), and the hangover confirms it: no second STT.
    """
    rig = rigs("turn off the kitchen lights")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.child.speculative == [1]  # revocable until its answer is heard
    assert rig.child.confirms == []
    assert rig.session.stats.early_ends == 1
    assert rig.session.stats.speculations == 0
    rig.session.feed_mic(quiet(HANGOVER_MS + 100))  # the VAD's tail: same utterance
    await settle()
    assert rig.child.confirms == [1]
    assert len(rig.stt.heard) == 1
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.session.stats.utterances == 1
    assert rig.session.stats.confirmed_speculations == 1


async def test_the_vad_tail_after_an_early_end_is_no_new_utterance(rigs) -> None:
    """The VAD goes on saying speech over silence after the turn ended: no new words.

    Without energy the gate hears no onset, so nothing is withdrawn; the tail is
    the end of the same utterance, whose hangover confirms the early end.
    """
    rig = rigs("turn off the kitchen lights")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    rig.session.feed_mic(whisper(300) + quiet(HANGOVER_MS + 100))  # no energy
    await settle()
    assert len(rig.stt.heard) == 1  # not transcribed (an STT may hallucinate)
    assert rig.child.pushes == ["turn off the kitchen lights"]
    assert rig.child.withdrawn == []
    assert rig.child.confirms == [1]


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
    assert rig.session.stats.early_ends == 1
    assert rig.session.stats.speculations == 0


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


# ----------------------------------------------- an early end, revocable until heard


async def test_an_early_end_plays_its_answer_before_the_hangover(rigs) -> None:
    """END: the answer plays as soon as it comes; the hangover confirms it later."""
    rig = rigs("turn off the kitchen lights")
    rig.session.feed_mic(speech(400) + quiet(250))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Done.")
    async with asyncio.timeout(SAFETY_S):
        await rig.transport.sent(1)
    assert rig.child.confirms == []  # played before the turn is confirmed
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.confirms == [1]
    assert rig.child.withdrawn == []
    assert len(rig.stt.heard) == 1


async def test_speech_before_the_answer_goes_out_withdraws_the_early_end(rigs) -> None:
    """The user goes on while the answer is at the TTS: the whole utterance is one turn."""
    tts = GatedTts()
    rig = rigs("turn off the lights", "turn off the lights in the hall", tts=tts)
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    await wait(tts.took)  # the answer's first sentence is being synthesised
    rig.session.feed_mic(speech(300))  # "... in the hall"
    assert rig.child.withdrawn == [1]
    assert rig.child.finals() == [(1, 0)]  # nothing of it was heard
    tts.gate.set()
    rig.child.pushed.clear()
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    assert rig.child.pushes == [
        "turn off the lights",
        "turn off the lights in the hall",
    ]
    assert rig.child.speculative == [1]  # one early push per utterance
    assert rig.child.confirms == []
    await settle()
    assert rig.transport.frames == []
    stats = rig.session.stats
    assert (stats.early_ends, stats.preempted, stats.spoken_over_ends) == (1, 1, 0)


async def test_speech_while_the_answer_waits_to_go_out_withdraws_it(rigs) -> None:
    """The answer's audio is queued but no frame has gone out: still revocable."""
    rig = rigs("turn off the lights", "turn off the lights in the hall")
    rig.session.player.hold()  # the satellite is not ready for audio yet
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay.")
    for _ in range(200):  # scheduling steps, not time
        if rig.session.player.queued_bytes:
            break
        await asyncio.sleep(0)
    assert rig.session.player.queued_bytes > 0
    rig.session.feed_mic(speech(300))
    assert rig.child.withdrawn == [1]
    rig.session.player.release()
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    await settle()
    assert rig.transport.frames == []
    assert rig.child.pushes[-1] == "turn off the lights in the hall"


async def test_speech_racing_the_first_frame_is_a_barge_in(rigs) -> None:
    """The first frame is on its way when the user goes on: heard, not withdrawn.

    The answer pauses (vad), and the words of the whole utterance cut it.
    """
    rig = rigs("turn off the lights", "turn off the lights in the hall")
    rig.transport.hold_at(1)
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    await wait(rig.transport.holding)  # the first frame is being sent
    rig.session.feed_mic(speech(300))
    assert rig.child.withdrawn == []
    assert rig.session.state is SessionState.PAUSED
    rig.transport.release()
    rig.child.pushed.clear()
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await wait(rig.child.pushed)
    assert rig.child.pushes[-1] == "turn off the lights in the hall"
    assert rig.child.confirms == []  # never confirmed: its tool calls never ran
    assert [seq for seq, _ in rig.child.finals()] == [1]  # cut at what was heard
    stats = rig.session.stats
    assert (stats.preempted, stats.spoken_over_ends, stats.barge_ins) == (0, 1, 1)


async def test_the_same_words_after_a_heard_early_end_confirm_it(rigs) -> None:
    """A cough over the answer: the utterance's words are unchanged, it resumes."""
    rig = rigs("turn off the lights", "Turn off the lights.")
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    async with asyncio.timeout(SAFETY_S):
        await rig.transport.sent(1)
    rig.session.feed_mic(cough(100))  # loud, not speech: pauses the answer
    assert rig.session.state is SessionState.PAUSED
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.confirms == [1]
    assert rig.child.pushes == ["turn off the lights"]
    assert rig.session.state in (SessionState.SPEAKING, SessionState.RESUMING)
    assert rig.session.stats.false_barge_ins == 1


async def test_without_voice_barge_in_the_turn_is_over_once_heard(rigs) -> None:
    """wake_word mode: the mic hears the answer, so its first frame ends the turn."""
    rig = rigs("turn off the lights", barge_in=BargeIn.WAKE_WORD)
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    async with asyncio.timeout(SAFETY_S):
        await rig.transport.sent(1)
    assert rig.child.confirms == [1]  # confirmed when it went out
    rig.session.feed_mic(speech(300) + quiet(HANGOVER_MS))  # the answer's echo
    await settle()
    assert rig.child.withdrawn == []
    assert rig.child.pushes == ["turn off the lights"]
    assert len(rig.stt.heard) == 1
    assert rig.session.stats.utterances == 1


async def test_a_wake_word_in_the_revocable_window_cuts_the_early_end(rigs) -> None:
    """A barge-in by wake word while the answer is at the TTS: nothing plays."""
    tts = GatedTts()
    rig = rigs("turn off the lights", tts=tts)
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    await wait(tts.took)
    rig.session.wake_word_detected()
    assert rig.child.interrupts == 1
    assert rig.child.finals() == [(1, 0)]
    tts.gate.set()
    rig.session.feed_mic(quiet(HANGOVER_MS))
    await settle()
    assert rig.child.confirms == []
    assert rig.transport.frames == []


async def test_closing_in_the_revocable_window_leaves_no_task(rigs) -> None:
    """The session ends while the answer waits for the TTS: every task ends."""
    tts = GatedTts()
    rig = rigs("turn off the lights", tts=tts)
    rig.session.feed_mic(speech(400) + quiet(300))
    await wait(rig.child.pushed)
    await rig.answer_held(1, "Okay, they are off.")
    await wait(tts.took)
    rig.session.end()
    assert rig.child.interrupts == 1
    await rig.session.aclose()  # the fixture checks that no task is left
    assert rig.transport.frames == []


# ------------------------------------------------ the same, with a real kernel


@dataclass
class KernelRig:
    """A real Kernel (scripted model, one device tool) and one conversation."""

    kernel: Kernel
    tools: ScriptedToolRunner
    stt: FakeStt
    tts: FakeTts
    transport: FakeTransport
    conversation: DuplexConversation
    heard: asyncio.Event  # the session acknowledged some of round 1's answer
    ended: Notifier  # a round ended

    async def history(self, n: int) -> list[tuple[str, str, bool]]:
        """Wait until the child's history holds ``n`` messages; return it."""
        await self.ended.wait_until(lambda: len(self.transcript()) >= n, SAFETY_S)
        return self.transcript()

    @property
    def session(self) -> DuplexSession:
        """The conversation's session."""
        return self.conversation.session

    def transcript(self) -> list[tuple[str, str, bool]]:
        """Return the child's history as (role, content, interrupted)."""
        messages = self.kernel.transcript(self.conversation.child_id) or []
        return [(m.role, m.content, m.interrupted) for m in messages]


@pytest.fixture
async def krig(request) -> AsyncIterator[KernelRig]:
    """Build the rig (param: the TTS class); afterwards no task is left."""
    before = asyncio.all_tasks()
    tools = ScriptedToolRunner({"lights": ToolBehaviour(result="off")})
    provider = ScriptedProvider()
    provider.on(
        "turn off the lights",
        [Tools.of(call("t1", "lights"), content="Turning them off. ")],
        [Text("Done.")],
    )
    provider.on("turn off the lights in the hall", [Text("The hall is dark.")])
    round_ends = RoundEnds()
    ended = Notifier()

    def round_ended(child_id: str, seq: int) -> None:
        round_ends(child_id, seq)
        ended.notify()

    kernel = Kernel(
        provider,
        ChannelRegistry(),
        tools=tools,
        on_round_end=round_ended,
        on_text_pause=round_ends.paused,
    )
    heard = asyncio.Event()
    acknowledge = kernel.acknowledge

    def acknowledged(child_id: str, seq: int, chars: int, *, final: bool = False):
        if seq == 1 and chars > 0:
            heard.set()
        acknowledge(child_id, seq, chars, final=final)

    kernel.acknowledge = acknowledged  # type: ignore[method-assign]
    stt = FakeStt("turn off the lights", "turn off the lights in the hall")
    tts = getattr(request, "param", FakeTts)()
    transport = FakeTransport()
    binding = DuplexBinding(
        kernel=kernel,
        stt=stt,
        tts=tts,
        options=DuplexOptions(eagerness=Eagerness.AUTO, end_silence_ms=0),
        round_ends=round_ends,
        idle_timeout_s=0,
    )
    conversation = await DuplexConversation.open(
        binding,
        name="test",
        send=transport.send,
        segmenter=UtteranceSegmenter(
            scripted_vad, silence_ms=HANGOVER_MS, pre_roll_ms=50
        ),
    )
    conversation.session.feed_mic(quiet(500))  # the gate learns the room
    yield KernelRig(kernel, tools, stt, tts, transport, conversation, heard, ended)
    await conversation.aclose()
    await kernel.stop_all()
    leftover = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and t is not asyncio.current_task()
    ]
    assert leftover == []


async def test_the_preamble_plays_at_once_and_the_tool_waits_for_the_hangover(
    krig: KernelRig,
) -> None:
    """An early end: its answer is heard at once, the device acts at the hangover."""
    krig.session.feed_mic(speech(400) + quiet(300))
    await wait(krig.heard)  # "Turning them off." is heard before the hangover
    await yield_many(50)
    assert krig.tools.calls == []  # the tool call waits for the confirmation
    krig.session.feed_mic(quiet(HANGOVER_MS))
    record = await krig.tools.wait_calls(1)
    async with asyncio.timeout(SAFETY_S):
        await record.finished.wait()
    await krig.conversation.aclose()
    roles = [role for role, _, _ in krig.transcript()]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert krig.transcript()[0][1] == "turn off the lights"


async def test_going_on_after_the_answer_was_heard_cuts_it_before_its_tool(
    krig: KernelRig,
) -> None:
    """Heard, then "... in the hall": the tool never runs, what was heard stays."""
    krig.session.feed_mic(speech(400) + quiet(300))
    await wait(krig.heard)
    krig.session.feed_mic(speech(300) + quiet(HANGOVER_MS))
    transcript = await krig.history(4)
    assert krig.tools.calls == []
    assert transcript[0] == ("user", "turn off the lights", False)
    assert transcript[1][0] == "assistant"
    assert transcript[1][2]  # interrupted, at what was heard
    assert transcript[2:] == [
        ("user", "turn off the lights in the hall", False),
        ("assistant", "The hall is dark.", False),
    ]
    stats = krig.kernel.stats(krig.conversation.child_id)
    assert stats is not None
    assert (stats.preempted_rounds, stats.interrupted_rounds) == (0, 1)


@pytest.mark.parametrize("krig", [GatedTts], indirect=True)
async def test_going_on_before_the_answer_was_heard_leaves_no_trace(
    krig: KernelRig,
) -> None:
    """Withdrawn before its first frame: preempted, the whole utterance answered."""
    krig.session.feed_mic(speech(400) + quiet(300))
    assert isinstance(krig.tts, GatedTts)
    await wait(krig.tts.took)  # the preamble is at the TTS
    krig.session.feed_mic(speech(300) + quiet(HANGOVER_MS))

    def preempted() -> bool:  # the mic's DSP worker applied the onset
        stats = krig.kernel.stats(krig.conversation.child_id)
        return stats is not None and stats.preempted_rounds == 1

    await krig.ended.wait_until(preempted, SAFETY_S)
    krig.tts.gate.set()
    transcript = await krig.history(2)
    assert krig.tools.calls == []
    assert transcript == [
        ("user", "turn off the lights in the hall", False),
        ("assistant", "The hall is dark.", False),
    ]
    stats = krig.kernel.stats(krig.conversation.child_id)
    assert stats is not None
    assert (stats.preempted_rounds, stats.preempted_requests) == (1, 1)
    assert krig.session.stats.preempted == 1


@pytest.mark.parametrize("krig", [GatedTts], indirect=True)
async def test_a_wake_word_in_the_revocable_window_keeps_the_words(
    krig: KernelRig,
) -> None:
    """A barge-in by wake word before the answer is heard: no audio, no tool.

    The wake word is no sign the words were unfinished: they stand (the model
    sees what was asked, unanswered), and nothing is counted as preempted.
    """
    krig.session.feed_mic(speech(400) + quiet(300))
    assert isinstance(krig.tts, GatedTts)
    await wait(krig.tts.took)
    krig.session.wake_word_detected()
    krig.tts.gate.set()
    transcript = await krig.history(1)
    assert transcript == [("user", "turn off the lights", False)]
    assert krig.tools.calls == []
    assert krig.transport.frames == []
    stats = krig.kernel.stats(krig.conversation.child_id)
    assert stats is not None
    assert (stats.preempted_rounds, stats.interrupted_rounds) == (0, 1)
