"""Server-side echo cancellation with livekit's WebRTC AEC3 in a simulated room.

The room (tests/duplex/echo_sim.py) feeds the device's own output back into its mic
with a delay of 50–400 ms that drifts slowly, attenuation and a diffuse tail; the
answer and the user are espeak speech. STT is a fake that hears words in any
utterance, as a real one would in echo of speech: every push is a self-interruption.
"""

from __future__ import annotations

import numpy as np
import pytest

from custom_components.rtvoice.duplex.audio import FRAME_BYTES, frame_dbfs
from custom_components.rtvoice.duplex.echo import (
    EchoCanceller,
    MicTimeline,
    unavailable_reason,
)
from tests.duplex.echo_sim import SENTENCES, Room, pcm_steps, run_answer

pytest.importorskip("livekit.rtc", reason="the optional livekit wheel is not installed")


@pytest.fixture(scope="module")
def clips(clip):
    """Return the answer's sentences as speech."""
    return {sentence: clip(sentence, lead_ms=0, tail_ms=150) for sentence in SENTENCES}


def test_available_here() -> None:
    """Livekit is installed in the test venv: no reason to refuse either engine."""
    assert unavailable_reason() is None
    assert unavailable_reason("aec3") is None


def test_echo_of_what_was_sent_is_removed(clip) -> None:
    """Open loop: the reference placed on the mic's time line; the echo drops by > 25 dB."""
    speech = clip(" ".join(SENTENCES), lead_ms=0, tail_ms=0)
    room = Room(delay_ms=150, seed=3, drift_ms=0)
    aec = EchoCanceller(engine="aec3")
    raw_levels, clean_levels = [], []
    for index, step in enumerate(pcm_steps(speech)):
        aec.far_end(step.astype("<i2").tobytes(), at_sample=index * 160)
        mic = room.mic_step(step)
        raw_levels.append(frame_dbfs(mic))
        clean_levels.append(frame_dbfs(aec.process(mic)))
    # After one second to converge, compare the loud (echo) frames.
    loud = [i for i, level in enumerate(raw_levels) if i > 100 and level > -35]
    raw = np.mean([raw_levels[i] for i in loud])
    clean = np.mean([clean_levels[i] for i in loud])
    assert raw - clean > 25


def test_a_stretch_after_silence_starts_a_fresh_canceller(clip) -> None:
    """The device starts each stretch a few ms off: a converged AEC3 would leak there.

    Stretch one converges at the true delay; after 1.5 s of silence the device plays
    stretch two 20 ms later than the reference says (its own buffers: unknowable
    here). The canceller restarts for it and the echo stays removed; frames in the
    stretch and short gaps do not restart it.
    """
    speech = clip(" ".join(SENTENCES), lead_ms=0, tail_ms=0)
    steps = pcm_steps(speech)
    room = Room(delay_ms=150, seed=3, drift_ms=0)
    aec = EchoCanceller(engine="aec3")
    silence = np.zeros(160)
    plays = [*steps, *[silence] * 150, *([silence] * 2 + steps)]  # 2 steps late
    placed = dict(enumerate(steps))
    second = len(steps) + 150
    placed |= {second + i: step for i, step in enumerate(steps)}
    raw_levels, clean_levels = [], []
    for index, played in enumerate(plays):
        if index in placed:
            aec.far_end(placed[index].astype("<i2").tobytes(), at_sample=index * 160)
        mic = room.mic_step(played)
        raw_levels.append(frame_dbfs(mic))
        clean_levels.append(frame_dbfs(aec.process(mic)))
    assert aec.restarts == 1
    echo = [i for i in range(second, len(plays)) if raw_levels[i] > -35]
    assert max(raw_levels[i] for i in echo) - max(clean_levels[i] for i in echo) > 30


def test_mic_timeline_takes_the_least_delayed_chunk() -> None:
    """Chunks that arrive late do not move the estimate; an early one does."""
    timeline = MicTimeline(creep_ms_per_s=0)
    timeline.chunk(10.050, 512)  # 32 ms of audio, 18 ms late
    timeline.chunk(10.080, 512)  # on time: 64 ms of audio by 10.080 → origin 10.016
    timeline.chunk(10.140, 512)  # late again
    assert timeline.offset == pytest.approx(10.016)
    assert timeline.sample_at(10.016 + 1.0) == 16000


def test_reference_is_placed_by_sample() -> None:
    """far_end writes the reference at its sample; the past is dropped."""
    aec = EchoCanceller(engine="aec3")
    aec.far_end(b"\x01\x00" * 100, at_sample=250)
    frames = aec._frames  # noqa: SLF001 - the time line itself
    assert sorted(frames) == [1, 2]
    assert frames[1][180:182] == b"\x01\x00" and frames[1][178:180] == b"\x00\x00"
    aec.process(bytes(FRAME_BYTES))
    aec.process(bytes(FRAME_BYTES))
    aec.process(bytes(FRAME_BYTES))
    aec.process(bytes(FRAME_BYTES))
    aec.far_end(b"\x02\x00" * 10, at_sample=0)  # in the past: placed at the present
    assert frames[4][:20] == b"\x02\x00" * 10


def test_a_following_frame_continues_the_reference_and_none_overlaps() -> None:
    """Without a sample the audio follows the last reference; a new stretch never overlaps it.

    The device plays its frames one after another: a mic time line that moved by a
    sample between two frames must not slip the reference (AEC3 would re-learn).
    """
    aec = EchoCanceller(engine="aec3")
    aec.far_end(b"\x01\x00" * 160, at_sample=100)
    aec.far_end(b"\x02\x00" * 160)  # back to back: samples 260..419
    aec.far_end(b"\x03\x00" * 10, at_sample=415)  # early by 5 samples: after 420
    reference = b"".join(aec._frames[i] for i in range(3))  # noqa: SLF001
    samples = [int.from_bytes(reference[i : i + 2], "little") for i in range(0, 960, 2)]
    assert samples[:100] == [0] * 100
    assert samples[100:260] == [1] * 160
    assert samples[260:420] == [2] * 160
    assert samples[420:430] == [3] * 10


@pytest.mark.parametrize("delay_ms", [50, 400])
async def test_echo_self_interrupts_without_aec_and_not_with_it(
    clips, delay_ms: int
) -> None:
    """Vad barge-in with echo: without AEC the answer interrupts itself; with AEC it plays out."""
    without = await run_answer(clips, aec=False, delay_ms=delay_ms, seed=delay_ms)
    assert without.pushes >= 1
    with_aec = await run_answer(clips, aec=True, delay_ms=delay_ms, seed=delay_ms)
    assert with_aec.pushes == 0
    assert with_aec.heard_chars == with_aec.answer_chars


async def test_barge_in_over_echo_with_aec(clips, clip) -> None:
    """With AEC the user's words over the playing answer still cut it and are pushed."""
    user = clip("no wait, turn it off", voice="en-gb+f3", lead_ms=0, tail_ms=300)
    run = await run_answer(
        clips, aec=True, delay_ms=200, seed=9, user=user, user_at_ms=1500
    )
    assert run.pushes == 1
    assert run.onset_to_pause_ms is not None
    assert 0 < run.heard_chars < run.answer_chars
