"""The numpy echo canceller's contracts, in image-source rooms (tests/duplex/room.py).

Convergence, double talk (no divergence, the user preserved), clock drift, the
user's onset let through at once, no harm where no echo reaches the mic, the
device's own reference channel used as the far end (by the session too), and the
residual echo suppressed so that it never opens the onset gate (no
self-interruption) while the user's onset does, within three frames.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from custom_components.rtvoice.duplex import DuplexSession, VirtualClock
from custom_components.rtvoice.duplex.audio import FRAME_BYTES
from custom_components.rtvoice.duplex.echo import EchoCanceller
from custom_components.rtvoice.duplex.fdaf import FdafCanceller
from custom_components.rtvoice.duplex.gate import GateEvent, OnsetGate
from tests.duplex.echo_sim import SENTENCES, run_answer
from tests.duplex.fakes import FakeChild, FakeStt, FakeTransport, FakeTts
from tests.duplex.room import STEP, RealRoom, RoomSpec

ROOM = RoomSpec(
    seed=2, rt60_s=0.3, area_m2=15, volume=0.4, echo_to_user_db=5.0, device_delay_ms=30
)
USER = "no wait, turn it off, I want to hear the news instead"


def samples(pcm: bytes) -> np.ndarray:
    """Return s16le PCM as float samples."""
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


@pytest.fixture(scope="module")
def answer(clip) -> np.ndarray:
    """About 16 s of the assistant's speech (the far end)."""
    return samples(clip(" ".join(SENTENCES * 2), lead_ms=0, tail_ms=0))


@pytest.fixture(scope="module")
def user(clip) -> np.ndarray:
    """About 3 s of the user's speech (the near end)."""
    return samples(clip(USER, voice="en-gb+f3", lead_ms=0, tail_ms=0))


def db(x: np.ndarray) -> float:
    """Mean power in dB."""
    return 10 * float(np.log10(np.mean(x**2) + 1e-9))


def run(
    spec: RoomSpec,
    far: np.ndarray,
    *,
    near: np.ndarray | None = None,
    near_at: int = 0,
    suppress: bool = True,
    canceller: FdafCanceller | None = None,
) -> tuple[RealRoom, FdafCanceller, np.ndarray, np.ndarray]:
    """Play ``far`` in the room (the user from step ``near_at``); cancel; return all."""
    room = RealRoom(spec)
    aec = canceller or FdafCanceller(suppress=suppress)
    mics, outs = [], []
    for i in range(len(far) // STEP):
        j = i - near_at
        voice = None
        if near is not None and 0 <= j < len(near) // STEP:
            voice = near[j * STEP : (j + 1) * STEP]
        mic = samples(room.mic_step(far[i * STEP : (i + 1) * STEP], voice))
        mics.append(mic)
        outs.append(aec.process(mic, far[i * STEP : (i + 1) * STEP]))
    return room, aec, np.concatenate(mics), np.concatenate(outs)


def test_converges_on_speech(answer) -> None:
    """The linear filter removes > 20 dB of echo after 12 s; the suppressor > 28 dB."""
    room, aec, _, out = run(ROOM, answer, suppress=False)
    echo = np.concatenate(room.echo_part)
    last = slice(len(echo) - 64000, len(echo))
    assert db(echo[last]) - db(out[last]) > 20
    assert aec.echo_found is True
    room, _, _, out = run(ROOM, answer)
    assert db(echo[last]) - db(out[last]) > 28


def test_double_talk_keeps_the_user_and_does_not_diverge(answer, user) -> None:
    """The user over the echo (+5 dB): kept within -8 dB error; echo still removed after."""
    far = np.concatenate([answer, answer[: 6 * 16000]])
    start = len(answer) // STEP - 100  # after ~15 s of far end alone
    room, aec, mic, out = run(ROOM, far, near=user, near_at=start)
    near = np.concatenate(room.user_part)
    echo = np.concatenate(room.echo_part)
    s0, s1 = start * STEP, (start + len(user) // STEP) * STEP
    # 2 ms of suppressor latency: compare with the user 32 samples earlier.
    kept = db(out[s0 + 32 : s1] - near[s0 : s1 - 32]) - db(near[s0:s1])
    raw = db(mic[s0:s1] - near[s0:s1]) - db(near[s0:s1])
    assert raw > 0  # the echo was louder than the user
    assert kept < -8
    after = slice(s1 + 16000, len(echo))
    assert db(echo[after]) - db(out[after]) > 20  # no divergence in the double talk


@pytest.mark.parametrize("ppm", [-50.0, 50.0])
def test_follows_clock_drift(answer, ppm: float) -> None:
    """Playback ±50 ppm off the capture clock: the filter follows the sliding path."""
    room, aec, _, out = run(replace(ROOM, skew_ppm=ppm), answer, suppress=False)
    echo = np.concatenate(room.echo_part)
    last = slice(len(echo) - 64000, len(echo))
    assert db(echo[last]) - db(out[last]) > 18  # ~5 dB without drift tracking
    assert np.sign(aec.drift) == -np.sign(ppm)  # fast playback: the echo comes earlier


def test_user_onset_passes_at_once(answer, user) -> None:
    """Over a converged echo the user's first two 10 ms frames come through."""
    start = len(answer) // STEP - len(user) // STEP - 20
    room, _, _, out = run(ROOM, answer, near=user, near_at=start)
    near = np.concatenate(room.user_part)
    frames = [near[i : i + STEP] for i in range(0, len(near), STEP)]
    onset = next(i for i in range(start, len(frames)) if db(frames[i]) > 20 * 2.5)
    for i in (onset, onset + 1):
        user_frame = near[i * STEP : (i + 1) * STEP - 32]
        passed = out[i * STEP + 32 : (i + 1) * STEP]
        assert db(passed) > db(user_frame) - 6


def test_no_echo_leaves_the_mic_alone(answer, user) -> None:
    """A board that cancels its own echo: none found, the user untouched, gate on time."""
    spec = replace(ROOM, echo=False)
    room, aec, mic, out = run(spec, answer, near=user, near_at=400)
    assert aec.echo_found is False
    decided = 400 * STEP
    assert np.array_equal(out[decided:], mic[decided:])
    assert db(out - mic) - db(mic) < -30
    onsets = []
    for signal in (mic, out):
        gate = OnsetGate()
        frames = signal.astype("<i2").tobytes()
        onsets.append(
            next(
                i
                for i in range(len(frames) // FRAME_BYTES)
                if gate.process(frames[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
                is GateEvent.ONSET
            )
        )
    assert onsets[0] == onsets[1]


def test_the_devices_own_reference_is_the_far_end(answer) -> None:
    """MULTI_CHANNEL_AUDIO: the second channel, sample-aligned, cancels without a time line."""
    room = RealRoom(replace(ROOM, device_delay_ms=0))
    aec = EchoCanceller()
    raw, clean = [], []
    for i in range(len(answer) // STEP):
        played = answer[i * STEP : (i + 1) * STEP]
        mic = room.mic_step(played)
        raw.append(samples(mic))
        clean.append(samples(aec.process(mic, played.astype("<i2").tobytes())))
    last = slice(len(raw) - 400, len(raw))
    assert db(np.concatenate(raw[last])) - db(np.concatenate(clean[last])) > 25
    assert aec.echo_found is True


class _RecordingEcho(EchoCanceller):
    """Our canceller, noting the device reference each mic frame came with."""

    def __init__(self) -> None:
        """Make our canceller; ``references`` fills in mic order."""
        super().__init__()
        self.references: list[bytes | None] = []

    def process(self, frame: bytes, reference: bytes | None = None) -> bytes:
        """Clean ``frame``; note the reference it came with."""
        self.references.append(reference)
        return super().process(frame, reference)


async def test_session_hands_the_devices_reference_to_the_canceller() -> None:
    """feed_mic(mic, reference): each 10 ms mic frame is cleaned with its own 10 ms.

    ESPHome's 32 ms chunks do not divide into 10 ms frames: the reference is cut in
    step with the mic; chunks without one use the placed time line (None).
    """
    echo = _RecordingEcho()
    session = DuplexSession(
        FakeChild(),
        stt=FakeStt(""),
        tts=FakeTts(),
        send=FakeTransport().send,
        clock=VirtualClock(),
        echo=echo,
    )
    reference = np.arange(16 * 64, dtype="<i2").tobytes()  # 64 ms, every sample known
    mic = bytes(len(reference))
    session.feed_mic(mic[:1024], reference[:1024])
    session.feed_mic(mic[1024:], reference[1024:])
    session.feed_mic(bytes(1024))  # no second channel in this chunk
    frames = echo.references
    assert b"".join(f for f in frames[:6] if f is not None) == reference[: 6 * 320]
    assert frames[6:] == [None] * (len(frames) - 6)
    await session.aclose()


def _gate_onsets(aec_out: list[np.ndarray], learning: list[bool]) -> list[int]:
    """Frames where the onset gate opens on the canceller's output (as the session).

    The session ignores the gate while the canceller says it is still learning
    (an echo heard, no path decided yet).
    """
    gate = OnsetGate()
    onsets = []
    for i, frame in enumerate(aec_out):
        pcm = np.clip(np.round(frame), -32768, 32767).astype("<i2").tobytes()
        if gate.process(pcm) is GateEvent.ONSET and not learning[i]:
            onsets.append(i)
        if learning[i]:
            gate.open = False
    return onsets


def test_residual_echo_never_opens_the_gate_and_the_user_does(answer, user) -> None:
    """+15 dB: echo louder than the user; the gate opens on the user only, at once.

    Cold (the room's first answer) with the speaker distorting, the clocks 40 ppm
    apart and a silence between two stretches of answer: the residual echo left by
    the linear filter never opens the gate (no self-interruption), and the user's
    onset opens it within three 10 ms frames.
    """
    spec = replace(ROOM, echo_to_user_db=15.0, volume=0.8, skew_ppm=40.0)
    room = RealRoom(spec)
    aec = FdafCanceller()
    silence = np.zeros(60 * STEP)
    far = np.concatenate([answer[: 7 * 16000], silence, answer[7 * 16000 :]])
    start = len(far) // STEP - len(user) // STEP - 30
    outs, learning = [], []
    for i in range(len(far) // STEP):
        played = far[i * STEP : (i + 1) * STEP]
        j = i - start
        voice = user[j * STEP : (j + 1) * STEP] if 0 <= j < len(user) // STEP else None
        mic = samples(room.mic_step(played, voice))
        outs.append(aec.process(mic, played))
        learning.append(aec.learning)
    near = np.concatenate(room.user_part)
    onset = next(
        i for i in range(start, len(outs)) if db(near[i * STEP : (i + 1) * STEP]) > 50
    )
    onsets = _gate_onsets(outs, learning)
    assert onsets, "the user never opened the gate"
    assert onsets[0] >= onset  # nothing before the user: the echo never opened it
    assert onsets[0] - onset <= 2  # the user's third frame at the latest


async def test_an_answer_in_a_loud_echo_room_does_not_interrupt_itself(clip) -> None:
    """The product's chain (canceller, gate, VAD, an STT that hears words in anything).

    Two answers in a +15 dB room, the first cold: each placed anew on the mic's
    time line (a new stretch), no pause and no push.
    """
    clips = {s: clip(s, lead_ms=0, tail_ms=150) for s in SENTENCES[:2]}
    spec = replace(ROOM, echo_to_user_db=15.0, volume=0.8, skew_ppm=-30.0)
    learned = None
    for seed in range(2):
        echo = EchoCanceller(learned=learned)
        learned = echo.fdaf
        run = await run_answer(
            clips,
            aec=True,
            echo=echo,
            delay_ms=0,
            seed=seed,
            room=RealRoom(spec),
            sentences=SENTENCES[:2],
        )
        assert (run.pushes, run.pauses) == (0, 0)


def test_a_new_stretch_placed_a_few_samples_off_is_cancelled_at_once(answer) -> None:
    """A stretch placed 3 samples late: found on its first echo, the filter moved.

    The first answer teaches the filter its path; the second is placed on the
    mic's time line 3 samples (0.2 ms) later than the device plays it, as a new
    stretch: from its first echo on the linear filter cancels as before (~16 dB
    in this young filter; 1-9 dB for the first second if it is not moved).
    """
    spec = replace(ROOM, skew_ppm=0.0)
    room = RealRoom(spec)
    aec = FdafCanceller(suppress=False)
    first = answer[: 9 * 16000]
    second = answer[9 * 16000 :]
    lag = 3
    played = np.concatenate([first, np.zeros(60 * STEP), second])
    placed = np.concatenate([first, np.zeros(60 * STEP + lag), second[:-lag]])
    starts = len(first) // STEP + 60
    outs = []
    for i in range(len(played) // STEP):
        if i == starts:
            aec.new_stretch()
        mic = samples(room.mic_step(played[i * STEP : (i + 1) * STEP]))
        outs.append(aec.process(mic, placed[i * STEP : (i + 1) * STEP]))
    out = np.concatenate(outs)
    echo = np.concatenate(room.echo_part)
    assert aec.aligner.found[-1] == pytest.approx(-lag, abs=0.3)  # echo comes earlier
    soon = slice((starts + 10) * STEP, (starts + 40) * STEP)  # its first 0.3 s
    assert db(echo[soon]) - db(out[soon]) > 14


def test_the_noise_floor_is_the_rooms(answer) -> None:
    """The suppressor's noise floor is the mic's own noise (±3 dB), not far under it.

    Frames with nothing beyond the residual are put at this floor, and the onset
    gate measures speech against it: too low a floor makes residual echo an onset.
    """
    spec = replace(ROOM, noise_dbfs=-60.0)
    room, aec, mic, _ = run(spec, answer[: 8 * 16000])
    # Its [0, e] spectra of one frame hold STEP times the frame's energy.
    noise = STEP * STEP * 10 ** (-60.0 / 10)
    floor = float(aec.suppressor.noise.sum())
    assert 10 * np.log10(floor / noise) == pytest.approx(0.0, abs=3.0)


async def test_a_user_right_after_a_new_stretch_pauses_the_answer(clip) -> None:
    """Over the echo of a new answer (a new stretch), the user is heard at once.

    The second answer in a +10 dB room is placed anew; the user starts as its
    second sentence begins (the first echo after a silence): the answer pauses
    within 150 ms of the user's onset (mic time; 90 ms measured), and the user's
    words cut it. (Before the stretch was aligned, the suppressor held all of
    the echo as residual there and this user was not heard at all.)
    """
    clips = {s: clip(s, lead_ms=0, tail_ms=150) for s in SENTENCES}
    spec = replace(ROOM, echo_to_user_db=10.0)
    user_clip = clip("no wait, turn it off", voice="en-gb+f3", lead_ms=0, tail_ms=300)
    echo = EchoCanceller()
    await run_answer(
        clips, aec=True, echo=echo, delay_ms=0, seed=0, room=RealRoom(spec)
    )
    echo = EchoCanceller(learned=echo.fdaf)
    result = await run_answer(
        clips,
        aec=True,
        echo=echo,
        delay_ms=0,
        seed=1,
        room=RealRoom(spec),
        user=user_clip,
        user_at_ms=2280,
    )
    assert result.onset_to_pause_ms is not None
    assert result.onset_to_pause_ms <= 150
    assert result.pushes == 1


def test_with_no_reference_in_its_span_the_mic_passes_as_through_the_full_path(
    answer, user
) -> None:
    """The far end silent for longer than the filter's span: the user passes as-is.

    The canceller skips its work there (most of a conversation), and what comes
    out is what its full path gives: the mic, 2 ms late (the suppressor's filter);
    the room's noise floor is followed all the same.
    """
    far = np.concatenate([answer[: 6 * 16000], np.zeros(3 * 16000)])
    near_at = 6 * 100 + 80  # the user starts 0.8 s into the silence
    outputs, floors = [], []
    for skip in (True, False):
        aec = FdafCanceller()
        if not skip:
            aec.suppressor.quiet = lambda: False  # type: ignore[method-assign]
        _, _, mic, out = run(ROOM, far, near=user, near_at=near_at, canceller=aec)
        outputs.append(out)
        floors.append(aec.suppressor.noise.sum())
    quiet = slice((6 * 100 + 60) * STEP, len(far))  # the echo's tail has died
    fast, full = outputs[0][quiet], outputs[1][quiet]
    assert db(fast) > 40  # the user is there
    assert db(fast - full) - db(full) < -40
    assert db(fast - np.roll(mic, 32)[quiet]) - db(full) < -40  # the mic, 2 ms late
    assert floors[0] == pytest.approx(floors[1], rel=1e-6)
