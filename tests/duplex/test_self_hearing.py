"""A satellite that hears its own answers, in ``vad`` mode without echo cancellation.

The detector on envelopes first (what counts as hearing itself, what does not), then
the session in the simulated room of ``echo_sim``: every utterance the session pushes
is answered again, as the model would, so echo without cancellation loops — until
the session tells that the mic hears the answers and stops listening to it.
"""

from __future__ import annotations

import numpy as np
import pytest

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions, DuplexSession
from custom_components.rtvoice.duplex.audio import FRAME_BYTES, frame_dbfs
from custom_components.rtvoice.duplex.self_hearing import SelfHearing
from tests.duplex.echo_sim import (
    SENTENCES,
    AnswerTts,
    Device,
    Drive,
    Room,
    SteppedClock,
    pcm_steps,
)
from tests.duplex.fakes import FakeChild


def speech_envelope(frames: int, seed: int) -> np.ndarray:
    """Levels of speech-like audio: syllables of 80–250 ms, pauses between words."""
    rng = np.random.default_rng(seed)
    levels: list[float] = []
    while len(levels) < frames:
        levels += [float(rng.uniform(-35, -18))] * int(rng.integers(8, 25))
        levels += [-70.0] * int(rng.integers(2, 12))
    return np.array(levels[:frames])


def feed(detector: SelfHearing, far: np.ndarray, mic: np.ndarray) -> int | None:
    """Feed both envelopes frame by frame; the frame of the verdict, if any."""
    for n, (played, heard) in enumerate(zip(far, mic, strict=True)):
        detector.played(float(played))
        if detector.mic(float(heard)):
            return n
    return None


def test_the_answers_echo_in_the_mic_is_heard() -> None:
    """The mic's envelope is the answer's, 230 ms later and 10 dB down: it hears itself."""
    far = speech_envelope(1500, seed=1)
    lag = 23
    echo = np.concatenate([np.full(lag, -70.0), far[:-lag] - 10])
    rng = np.random.default_rng(2)
    mic = np.maximum(
        echo + rng.normal(0, 2, len(far)), -68 + rng.normal(0, 1, len(far))
    )
    detector = SelfHearing()
    verdict = feed(detector, far, mic)
    assert verdict is not None
    assert detector.correlation is not None and detector.correlation > 0.6


@pytest.mark.parametrize(
    "case", ["user over the answer", "a board that cancels its echo", "nothing sent"]
)
def test_what_is_not_the_answer_is_not_self_hearing(case: str) -> None:
    """A user's speech, a steady quiet mic or a mic without answers make no verdict."""
    far = speech_envelope(3000, seed=1)
    rng = np.random.default_rng(3)
    if case == "user over the answer":
        mic = speech_envelope(3000, seed=7) + 5
    elif case == "a board that cancels its echo":
        mic = -66 + rng.normal(0, 1, 3000)
    else:
        mic = speech_envelope(3000, seed=1) - 10  # the same words, never sent
        far = np.full(3000, -90.0)
    detector = SelfHearing()
    assert feed(detector, far, mic) is None
    assert not detector.hears_itself


def test_a_user_who_interrupts_every_answer_alike_is_not_self_hearing() -> None:
    """Answers cut by the user at the same moment each time make no verdict.

    The user starts 0.6 s into each answer, which stops 50 ms later (a
    barge-in); the user speaks ~1 s, a quiet second, the next answer. The
    pattern repeats at one lag, and the silences agree: only where the mic is
    loud while the answer is silent does it show that someone talks.
    """
    far_parts: list[np.ndarray] = []
    mic_parts: list[np.ndarray] = []
    for turn in range(12):
        answer = speech_envelope(65, seed=10 + turn)  # cut 50 ms into the user
        user = speech_envelope(100, seed=40 + turn)  # from 0.6 s on
        quiet = np.full(100, -70.0)
        far_parts += [answer, np.full(125, -70.0), quiet]
        mic_parts += [np.full(60, -68.0), user + 3, np.full(30, -68.0), quiet]
    far = np.concatenate(far_parts)
    mic = np.concatenate(mic_parts)[: len(far)]
    detector = SelfHearing()
    assert feed(detector, far, mic) is None
    assert not detector.hears_itself


ANSWERS = (
    "The kitchen light is now on and the heating is set to twenty degrees.",
    "It is twenty one degrees in the living room and the windows are closed.",
    "Your next meeting starts at three o'clock this afternoon in the office.",
    "I have turned off every light in the house except the hallway lamp.",
    "Tomorrow will be sunny with a high of eighteen degrees and light wind.",
)
INTERRUPTIONS = ("stop", "no wait", "what about tomorrow", "turn it off", "never mind")


def envelope(pcm: bytes) -> np.ndarray:
    """Levels of each 10 ms frame of ``pcm``."""
    ends = range(FRAME_BYTES, len(pcm) + 1, FRAME_BYTES)
    return np.array([frame_dbfs(pcm[end - FRAME_BYTES : end]) for end in ends])


@pytest.mark.parametrize("same", [True, False], ids=["same words", "other words"])
def test_a_user_who_says_stop_early_in_every_answer_is_not_self_hearing(
    clip, same: bool
) -> None:
    """Spoken answers, each cut 50 ms after the user starts 300 ms into it."""
    far_parts: list[np.ndarray] = []
    mic_parts: list[np.ndarray] = []
    for turn in range(15):
        pick = 0 if same else turn % len(ANSWERS)
        answer = envelope(clip(ANSWERS[pick], lead_ms=0, tail_ms=0))[:35]
        user = envelope(clip(INTERRUPTIONS[pick], voice="en-gb", lead_ms=0, tail_ms=0))
        length = 30 + len(user) + 100
        far = np.full(length, -90.0)
        far[: len(answer)] = answer
        mic = np.full(length, -66.0)
        mic[30 : 30 + len(user)] = np.maximum(user + 3, -66.0)
        far_parts.append(far)
        mic_parts.append(mic)
    detector = SelfHearing()
    assert feed(detector, np.concatenate(far_parts), np.concatenate(mic_parts)) is None


async def looping_conversation(
    clip, *, seconds: float, echo_db: float, user: bytes | None = None
) -> tuple[DuplexSession, FakeChild, list[int], list[bool]]:
    """Run ``seconds`` of a vad conversation without echo cancellation.

    Every push is answered again with the three sentences (the model answering
    what it heard). Returns the session, the child, the mic step of every push and
    the verdict calls.
    """
    clips = {s: clip(s, lead_ms=0, tail_ms=150) for s in SENTENCES}
    clock = SteppedClock()
    device = Device(clock=clock)
    child = FakeChild()
    heard: list[bool] = []

    async def stt(pcm: bytes) -> str:
        return "words"  # a real STT transcribes the echo of speech as words too

    session = DuplexSession(
        child,
        stt=stt,
        tts=AnswerTts(clips),
        send=device.send,
        clock=clock,
        options=DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=0),
        on_hears_itself=lambda: heard.append(True),
    )
    room = Room(delay_ms=120, seed=4, drift_ms=1, drift_period_s=60, gain_db=echo_db)
    drive = Drive(session, device, room, clock)
    user_steps = pcm_steps(user) if user is not None else []

    def answer(seq: int) -> None:
        for sentence in SENTENCES:
            session.output_delta(seq, sentence + " ")
        session.output_end(seq)

    for _ in range(50):
        await drive.step()
    child.seq = answered = 1  # the first answer's round
    answer(1)
    push_steps: list[int] = []
    while drive.steps < seconds * 100:
        index = drive.steps - 250  # the user (if any) speaks from 2.5 s on
        await drive.step(user_steps[index] if 0 <= index < len(user_steps) else None)
        if child.seq > answered:  # a push: the model answers it
            answered = child.seq
            push_steps.append(drive.steps)
            answer(child.seq)
    await session.aclose()
    return session, child, push_steps, heard


async def test_a_board_that_hears_itself_stops_interrupting_itself(clip) -> None:
    """Echo 3 dB over the room, no cancellation: pushes loop, then the verdict ends them."""
    session, child, push_steps, heard = await looping_conversation(
        clip, seconds=30, echo_db=-3
    )
    assert heard == [True]  # told once
    assert session.stats.hears_itself
    assert push_steps, "the echo interrupted the answers before the verdict"
    verdict_step = push_steps[-1]
    assert all(step <= verdict_step for step in push_steps)
    # After the verdict the answers play out: the last one is heard whole.
    finals = child.finals()
    assert finals[-1][1] > 0
    assert len(push_steps) < 10  # the loop stopped (it ran on for 30 s before)


async def test_a_quiet_board_keeps_barge_in_by_voice(clip) -> None:
    """No echo in the mic: the user's words still interrupt and nothing is said."""
    user = clip("no wait, stop that", voice="en-gb+f3", lead_ms=0, tail_ms=300)
    session, child, push_steps, heard = await looping_conversation(
        clip, seconds=8, echo_db=-80, user=user
    )
    assert heard == []
    assert not session.stats.hears_itself
    assert child.pushes[:1] == ["words"]
    assert session.stats.barge_ins >= 1


def test_levels_of_silence_are_the_floor() -> None:
    """Digital silence sent or heard counts as the room floor, not as a level."""
    detector = SelfHearing()
    detector.played(frame_dbfs(bytes(FRAME_BYTES)))
    assert not detector.mic(frame_dbfs(bytes(FRAME_BYTES)))
