"""The duplex session state machine with fakes (no hass, virtual clock, no sleeps).

The kernel child, STT, TTS and transport are fakes: the kernel's acknowledged
delivery is built concurrently elsewhere, STT/TTS are HA entities in production.
The VAD is a scripted scorer here (frames marked as speech); the real pymicro-vad
runs in test_segmenter_and_gate.py and in the clip test at the end.
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.rtvoice.duplex import (
    BargeIn,
    DspWorker,
    DuplexOptions,
    DuplexSession,
    SessionState,
    UtteranceSegmenter,
    VirtualClock,
)
from tests.duplex.fakes import FakeChild, FakeStt, FakeTransport, FakeTts

SPEECH = (8000).to_bytes(2, "little", signed=True) + (-8000).to_bytes(
    2, "little", signed=True
)
COUGH = (7000).to_bytes(2, "little", signed=True) + (-7000).to_bytes(
    2, "little", signed=True
)


WHISPER = (40).to_bytes(2, "little", signed=True) + (-40).to_bytes(
    2, "little", signed=True
)


def whisper(ms: int) -> bytes:
    """Frames the scripted VAD calls speech, far below the gate (like residual echo)."""
    return WHISPER * (ms * 8)


def speech(ms: int) -> bytes:
    """Loud frames the scripted VAD calls speech."""
    return SPEECH * (ms * 8)


def cough(ms: int) -> bytes:
    """Loud frames the scripted VAD does not call speech."""
    return COUGH * (ms * 8)


def quiet(ms: int) -> bytes:
    """Room noise far below the gate's margin."""
    return (3).to_bytes(2, "little", signed=True) * (ms * 16)


def scripted_vad(frame: bytes) -> float:
    """Speech where the frame starts with the speech marker."""
    return 1.0 if frame[:4] in (SPEECH, WHISPER) else 0.0


class Rig:
    """A session wired to fakes."""

    def __init__(
        self, *answers: str | Exception, mode: BargeIn = BargeIn.VAD, **options
    ):
        """Build the session; STT answers with ``answers``."""
        self.child = FakeChild()
        self.stt = FakeStt(*answers)
        self.tts = FakeTts(
            options.pop("ms_per_sentence", 300), fail_on=options.pop("fail_on", None)
        )
        self.transport = FakeTransport()
        self.clock = VirtualClock()
        self.ended = asyncio.Event()
        self.states: list[SessionState] = []
        self.session = DuplexSession(
            self.child,
            stt=self.stt,
            tts=self.tts,
            send=self.transport.send,
            options=DuplexOptions(barge_in=mode, **options),
            segmenter=UtteranceSegmenter(scripted_vad, silence_ms=100, pre_roll_ms=50),
            clock=self.clock,
            on_end=self.ended.set,
            on_state=self.states.append,
        )
        self.session.feed_mic(quiet(500))  # the gate learns the room

    async def say(self, ms: int = 300) -> None:
        """Speak an utterance and let it end."""
        self.session.feed_mic(speech(ms) + quiet(150))

    async def answer(self, seq: int, text: str) -> None:
        """Stream ``text`` as the kernel would for round ``seq``, then end it."""
        for word in text.split(" "):
            self.session.output_delta(seq, word + " ")
        self.session.output_end(seq)


@pytest.fixture
async def rig_factory():
    """Make rigs and close their sessions, checking no task is left."""
    rigs: list[Rig] = []

    def make(*answers, **options) -> Rig:
        rig = Rig(*answers, **options)
        rigs.append(rig)
        return rig

    yield make
    for rig in rigs:
        await rig.session.aclose()
        current = asyncio.current_task()
        assert [t for t in asyncio.all_tasks() if t is not current] == []


async def test_utterance_is_pushed(rig_factory) -> None:
    """Speech while listening → STT → the words are pushed."""
    rig = rig_factory("turn on the light")
    await rig.say()
    await rig.child.pushed.wait()
    assert rig.child.pushes == ["turn on the light"]
    assert len(rig.stt.heard[0]) >= 300 * 32  # the whole utterance with its onset
    assert rig.session.state is SessionState.LISTENING


async def test_answer_is_played_and_acknowledged(rig_factory) -> None:
    """Deltas → sentences → TTS → paced frames; all heard → final ack of the whole text."""
    rig = rig_factory()
    text = "The light is on. Anything else?"
    await rig.answer(1, text)
    await rig.child.acked_final.wait()
    assert rig.tts.sentences == ["The light is on.", "Anything else?"]
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)
    assert rig.child.finals() == [(1, len(text) + 1)]
    assert rig.states == [SessionState.SPEAKING, SessionState.LISTENING]


async def start_answer(rig: Rig, text: str, hold_at: int) -> None:
    """Start playing an answer and hold the transport at frame ``hold_at``."""
    rig.transport.hold_at(hold_at)
    await rig.answer(1, text)
    await rig.transport.holding.wait()
    assert rig.session.state is SessionState.SPEAKING


async def test_barge_in_cuts_acknowledges_and_pushes(rig_factory) -> None:
    """Speech during playback pauses at once; its words cut the answer at what was heard."""
    rig = rig_factory("no, the kitchen")
    text = "I turned on the hall light. It is bright now."
    await start_answer(rig, text, hold_at=25)
    rig.session.feed_mic(speech(30))  # three loud frames: the gate opens
    assert rig.session.state is SessionState.PAUSED
    assert rig.session.stats.last_onset_mic_ms == 500
    rig.transport.release()
    rig.session.feed_mic(speech(300) + quiet(150))
    await rig.child.pushed.wait()
    assert len(rig.transport.frames) == 25  # nothing after the pause
    assert rig.child.pushes == ["no, the kitchen"]
    ((seq, chars),) = rig.child.finals()
    assert seq == 1
    # 25 frames sent, 100 ms of them still queued on the device: 150 ms of the
    # first sentence's 300 ms were heard, cut at the word being played.
    assert text[:chars] == "I turned on the"
    assert rig.session.state is SessionState.LISTENING
    assert rig.session.stats.barge_ins == 1


async def test_cough_resumes_from_the_same_byte(rig_factory) -> None:
    """A noise the VAD takes for speech, transcribed as nothing: playback resumes."""
    rig = rig_factory("")
    text = "The light is on. Anything else?"
    rig.stt.gate = asyncio.Event()
    await start_answer(rig, text, hold_at=12)
    rig.session.feed_mic(speech(200) + quiet(150))  # a cough the VAD calls speech
    assert rig.session.state is SessionState.PAUSED
    rig.transport.release()
    await rig.stt.started.wait()
    assert len(rig.transport.frames) == 12
    rig.stt.gate.set()
    await rig.child.acked_final.wait()
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)  # byte-exact
    assert rig.child.pushes == []
    assert rig.child.finals() == [(1, len(text) + 1)]
    assert rig.session.stats.false_barge_ins == 1
    assert SessionState.PAUSED in rig.states


async def test_noise_the_vad_ignores_resumes_after_the_confirm_window(
    rig_factory,
) -> None:
    """A burst that opens the gate but is no speech at all resumes after confirm_ms."""
    rig = rig_factory(confirm_ms=300)
    await start_answer(rig, "The light is on. Anything else?", hold_at=8)
    rig.session.feed_mic(cough(100))
    assert rig.session.state is SessionState.PAUSED
    rig.transport.release()
    paused_for = rig.session.mic_ms - rig.session.stats.last_pause_mic_ms
    rig.session.feed_mic(quiet(300 - paused_for - 10))
    assert rig.session.state is SessionState.PAUSED
    rig.session.feed_mic(quiet(10))
    assert rig.session.state in (SessionState.RESUMING, SessionState.SPEAKING)
    await rig.child.acked_final.wait()
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)
    assert rig.stt.heard == []


async def test_long_noise_resumes_at_the_cap_and_does_not_pause_again(
    rig_factory,
) -> None:
    """A noise that goes on resumes after max_pause_ms; the same noise pauses no more."""
    rig = rig_factory(confirm_ms=100, max_pause_ms=200)
    await start_answer(rig, "The light is on. Anything else?", hold_at=8)
    rig.session.feed_mic(cough(100))
    assert rig.session.state is SessionState.PAUSED  # the gate is still open
    paused_for = rig.session.mic_ms - rig.session.stats.last_pause_mic_ms
    rig.session.feed_mic(cough(200 - paused_for))
    assert rig.session.state is SessionState.RESUMING
    rig.session.feed_mic(cough(300))
    assert rig.session.state is SessionState.RESUMING
    rig.session.feed_mic(quiet(200))
    assert rig.session.state is SessionState.SPEAKING
    assert rig.session.stats.pauses == 1
    assert rig.session.stats.pause_gaps_ms == [200]
    rig.transport.release()


async def test_a_short_noise_resumes_once_the_gate_closes(rig_factory) -> None:
    """After confirm_ms a burst that has ended resumes when the gate closes."""
    rig = rig_factory(confirm_ms=100, max_pause_ms=2000)
    await start_answer(rig, "The light is on. Anything else?", hold_at=8)
    rig.session.feed_mic(cough(60))
    assert rig.session.state is SessionState.PAUSED
    closes_after = rig.session.gate.release_frames * 10
    rig.session.feed_mic(quiet(closes_after - 10))
    assert rig.session.state is SessionState.PAUSED
    rig.session.feed_mic(quiet(10))
    assert rig.session.state is SessionState.SPEAKING
    rig.transport.release()


async def test_wake_word_mode_ignores_speech_and_interrupts_on_wake(
    rig_factory,
) -> None:
    """Speech alone never pauses; the wake word cuts, interrupts, and the next words are pushed."""
    rig = rig_factory("what time is it", mode=BargeIn.WAKE_WORD)
    text = "The light is on. Anything else?"
    await start_answer(rig, text, hold_at=20)
    await rig.say(300)
    assert rig.session.state is SessionState.SPEAKING
    assert rig.session.stats.dropped_utterances == 1
    rig.session.wake_word_detected()
    rig.transport.release()
    assert rig.child.interrupts == 1
    ((seq, chars),) = rig.child.finals()
    assert seq == 1 and 0 < chars < len(text)
    await rig.say(300)
    await rig.child.pushed.wait()
    assert rig.child.pushes == ["what time is it"]
    assert rig.stt.heard and len(rig.transport.frames) == 20


async def end_answer_in_an_utterance(rig: Rig) -> None:
    """Play a short answer with its echo in the mic: the VAD is in it as it ends."""
    await start_answer(rig, "The light is on.", hold_at=3)
    rig.session.feed_mic(speech(200))  # the answer's echo, over the answer
    assert rig.session.segmenter.in_utterance
    rig.transport.release()
    await rig.child.acked_final.wait()
    assert rig.session.state is SessionState.LISTENING


async def test_words_after_the_echo_tail_are_kept_in_wake_word_mode(
    rig_factory,
) -> None:
    """The VAD runs the echo tail into the user's next words: the words are answered.

    Without this the whole utterance counted as speech over the answer and was
    dropped (row 16 of docs/benchmarks.md: asks said 0.5 s after an answer lost).
    """
    rig = rig_factory("lights on", mode=BargeIn.WAKE_WORD)
    await end_answer_in_an_utterance(rig)
    tail, gap, words = speech(300), whisper(200), speech(400)  # one VAD utterance
    rig.session.feed_mic(tail + gap + words + quiet(150))
    assert not rig.session.segmenter.in_utterance
    assert rig.session.stats.dropped_utterances == 0
    assert rig.session.stats.tail_utterances == 1
    await rig.child.pushed.wait()
    assert rig.child.pushes == ["lights on"]
    # From the quietest frame of the tail on: the gap, the words, the VAD's end.
    assert rig.stt.heard == [gap + words + quiet(100)]


async def test_an_echo_tail_alone_is_dropped_in_wake_word_mode(rig_factory) -> None:
    """Echo that dies down within ECHO_TAIL_MS of the answer's end is never transcribed."""
    rig = rig_factory("should not be heard", mode=BargeIn.WAKE_WORD)
    await end_answer_in_an_utterance(rig)
    rig.session.feed_mic(speech(300) + whisper(250) + quiet(150))
    assert not rig.session.segmenter.in_utterance
    assert rig.stt.heard == []
    assert rig.session.stats.dropped_utterances == 1


async def test_off_mode_nothing_interrupts(rig_factory) -> None:
    """In off mode speech during an answer is dropped and the answer plays out."""
    rig = rig_factory(mode=BargeIn.OFF)
    text = "The light is on. Anything else?"
    await start_answer(rig, text, hold_at=5)
    await rig.say(300)
    rig.transport.release()
    await rig.child.acked_final.wait()
    assert rig.child.finals() == [(1, len(text) + 1)]
    assert rig.stt.heard == [] and rig.session.stats.pauses == 0


async def test_stt_failure_ends_the_utterance_not_the_session(
    rig_factory, caplog
) -> None:
    """A failing STT loses one utterance (logged, no transcript); the next one works."""
    rig = rig_factory(RuntimeError("stt down"), "hello")
    await rig.say()
    await rig.say()
    await rig.child.pushed.wait()
    assert rig.child.pushes == ["hello"]
    assert rig.session.stats.stt_errors == 1
    assert "Speech-to-text failed" in caplog.text


async def test_stt_failure_during_a_pause_resumes(rig_factory) -> None:
    """An STT error on a barge-in candidate is 'no words': the answer resumes."""
    rig = rig_factory(RuntimeError("stt down"))
    await start_answer(rig, "The light is on. Anything else?", hold_at=5)
    rig.session.feed_mic(speech(200) + quiet(150))
    rig.transport.release()
    await rig.child.acked_final.wait()
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)


async def test_tts_failure_skips_one_sentence(rig_factory, caplog) -> None:
    """A sentence whose TTS fails is skipped (logged); the rest plays and is acknowledged."""
    rig = rig_factory(fail_on="It broke.")
    text = "First part. It broke. Last part."
    await rig.answer(1, text)
    await rig.child.acked_final.wait()
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(2)
    assert rig.child.finals() == [(1, len(text) + 1)]
    assert rig.session.stats.tts_errors == 1
    assert "Text-to-speech failed" in caplog.text


async def test_session_ends_after_silence_following_the_answer(rig_factory) -> None:
    """end_silence_ms of mic silence after the last answer ends the session (callback)."""
    rig = rig_factory(end_silence_ms=1000)
    await rig.answer(1, "Done.")
    await rig.child.acked_final.wait()
    rig.session.feed_mic(quiet(990))
    assert not rig.ended.is_set()
    rig.session.feed_mic(quiet(10))
    assert rig.ended.is_set()
    assert rig.session.state is SessionState.ENDED


async def test_a_newer_round_supersedes_the_playing_answer(rig_factory) -> None:
    """Deltas of a newer round cut the old answer at what was heard and play the new one."""
    rig = rig_factory()
    await start_answer(rig, "The light is on. Anything else?", hold_at=5)
    rig.session.output_delta(2, "Also, ")
    rig.transport.release()
    assert rig.child.finals()[0][0] == 1
    rig.session.output_delta(1, "late delta ignored")
    await rig.answer(2, "the door is locked.")
    await rig.child.final_acks(2)
    assert [seq for seq, _ in rig.child.finals()] == [1, 2]


async def test_a_round_without_text_is_acknowledged_empty(rig_factory) -> None:
    """A round that ends with no delta is acknowledged final with nothing heard."""
    rig = rig_factory("hi")
    await rig.say()
    await rig.child.pushed.wait()
    rig.child.tickets[0].outcome.set_result("done")
    await rig.child.acked_final.wait()
    assert rig.child.finals() == [(1, 0)]


async def test_aclose_mid_answer_and_mid_stt_leaves_no_task(rig_factory) -> None:
    """Closing while TTS, playback and STT are running cancels them all."""
    rig = rig_factory("never")
    rig.stt.gate = asyncio.Event()
    await start_answer(rig, "The light is on. Anything else?", hold_at=3)
    rig.session.output_delta(1, "More to come")
    rig.session.feed_mic(speech(200) + quiet(150))
    await rig.stt.started.wait()
    await rig.session.aclose()
    assert rig.session.state is SessionState.ENDED
    rig.session.feed_mic(speech(200))  # ignored after close
    rig.session.output_delta(3, "ignored")
    # the fixture checks that no task is left


async def test_real_vad_on_a_spoken_clip(clip) -> None:
    """With the real pymicro-vad: an espeak utterance reaches the STT and is pushed."""
    child = FakeChild()
    stt = FakeStt("turn on the kitchen light")
    transport = FakeTransport()
    session = DuplexSession(
        child, stt=stt, tts=FakeTts(), send=transport.send, clock=VirtualClock()
    )
    pcm = clip("turn on the kitchen light", lead_ms=1000, tail_ms=1200)
    for i in range(0, len(pcm), 1024):  # ESPHome sends 32 ms chunks
        session.feed_mic(pcm[i : i + 1024])
    await child.pushed.wait()
    assert child.pushes == ["turn on the kitchen light"]
    assert len(stt.heard[0]) > len(pcm) - (1000 + 1200) * 32  # the onset is kept
    await session.aclose()


async def test_vad_alone_over_an_answer_is_echo(rig_factory) -> None:
    """An utterance the VAD finds over the answer with no energy above the floor is dropped."""
    rig = rig_factory("never asked")
    text = "The light is on. Anything else?"
    await start_answer(rig, text, hold_at=5)
    rig.session.feed_mic(whisper(300) + quiet(150))
    assert rig.session.state is SessionState.SPEAKING  # never paused
    rig.transport.release()
    await rig.child.acked_final.wait()
    assert rig.session.stats.echo_utterances == 1
    assert rig.stt.heard == [] and rig.child.pushes == []


async def test_quiet_speech_while_listening_is_still_heard(rig_factory) -> None:
    """The energy guard applies over an answer only: quiet speech while listening counts."""
    rig = rig_factory("psst")
    rig.session.feed_mic(whisper(300) + quiet(150))
    await rig.child.pushed.wait()
    assert rig.child.pushes == ["psst"]


async def test_a_hung_stt_times_out_and_the_answer_resumes(rig_factory) -> None:
    """An STT that never answers is a failure after stt_timeout_s, not a stuck pause."""
    rig = rig_factory("never", stt_timeout_s=0.01)
    rig.stt.gate = asyncio.Event()  # never set: the STT hangs
    await start_answer(rig, "The light is on. Anything else?", hold_at=5)
    rig.session.feed_mic(speech(200) + quiet(150))
    assert rig.session.state is SessionState.PAUSED
    rig.transport.release()
    await rig.child.acked_final.wait()
    assert rig.session.stats.stt_errors == 1
    assert rig.transport.audio == rig.tts.audio(0) + rig.tts.audio(1)


async def test_a_stalled_tts_stream_skips_its_sentence(rig_factory) -> None:
    """A TTS stream that stalls is a failed sentence after tts_chunk_timeout_s."""
    rig = rig_factory(tts_chunk_timeout_s=0.01)
    stalled = asyncio.Event()

    async def tts(text: str):
        if text == "Stuck here.":
            stalled.set()
            await asyncio.Event().wait()
        yield b"\x05\x00" * 800

    rig.session._tts = tts  # noqa: SLF001 - swap in a stalling peer
    await rig.answer(1, "First. Stuck here. Last.")
    await rig.child.acked_final.wait()
    assert stalled.is_set()
    assert rig.transport.audio == b"\x05\x00" * 1600
    assert rig.session.stats.tts_errors == 1


async def test_wake_word_while_thinking_interrupts_the_round(rig_factory) -> None:
    """The wake word interrupts a round that has not said anything yet."""
    rig = rig_factory("lights on", mode=BargeIn.WAKE_WORD)
    await rig.say()
    await rig.child.pushed.wait()
    rig.session.wake_word_detected()
    assert rig.child.interrupts == 1


async def test_an_older_round_ending_late_is_acknowledged_empty(rig_factory) -> None:
    """A round that said nothing and ends after a newer one started: heard nothing."""
    rig = rig_factory()
    rig.session.output_delta(3, "Newer round. ")
    rig.session.output_end(2)
    assert rig.child.finals() == [(2, 0)]
    rig.session.output_end(3)
    await rig.child.final_acks(2)
    assert rig.child.finals() == [(2, 0), (3, len("Newer round. "))]


async def test_on_a_dsp_worker_results_before_a_wake_word_are_stale() -> None:
    """DSP off the loop: audio submitted before a wake word yields no utterance."""
    worker = DspWorker()
    stt = FakeStt("after")
    child = FakeChild()
    session = DuplexSession(
        child,
        stt=stt,
        tts=FakeTts(),
        send=FakeTransport().send,
        options=DuplexOptions(end_silence_ms=0),
        segmenter=UtteranceSegmenter(scripted_vad, silence_ms=100, pre_roll_ms=50),
        clock=VirtualClock(),
        dsp=worker,
    )
    try:
        session.feed_mic(quiet(500) + speech(300) + quiet(150))  # not applied yet
        session.wake_word_detected()  # the segmenter restarts after that audio
        session.feed_mic(speech(300) + quiet(150))
        drained = asyncio.Event()
        worker.submit(lambda: None, done=lambda _: drained.set())
        await drained.wait()
        await child.pushed.wait()
        assert child.pushes == ["after"]
        assert len(stt.heard) == 1
        assert session.mic_ms == 1400  # every frame counted, stale or not
    finally:
        await session.aclose()
        await worker.aclose()
