"""The room model (tests/duplex/room.py) behaves like the room it describes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.duplex.room import (
    STEP,
    RealRoom,
    RoomSpec,
    SmallSpeaker,
    background_signal,
    grid,
    impulse_responses,
    measured_rt60,
)

pytest.importorskip("pyroomacoustics", reason="the room simulator is not installed")


def test_grid_spans_the_ranges() -> None:
    """Rooms 10–40 m², RT60 0.2–0.8 s, speaker 3–10 cm, user 0.5–3 m, ±50 ppm."""
    specs = grid()
    assert {s.echo_to_user_db for s in specs} == {-10.0, 0.0, 5.0, 10.0, 15.0}
    assert min(s.rt60_s for s in specs) == 0.2 and max(s.rt60_s for s in specs) == 0.8
    for spec in specs:
        assert 10 <= spec.area_m2 <= 40 and 0.03 <= spec.speaker_mic_m <= 0.10
        assert 0.5 <= spec.user_m <= 3.0 and abs(spec.skew_ppm) <= 50


@pytest.mark.parametrize("rt60", [0.2, 0.6])
def test_reverberation_time_is_the_rooms(rt60: float) -> None:
    """The user's impulse response decays at the asked RT60 (Schroeder, ±35 %)."""
    rirs = impulse_responses(RoomSpec(seed=5, rt60_s=rt60, area_m2=20))
    assert measured_rt60(rirs["user"]) == pytest.approx(rt60, rel=0.35)
    # The speaker a few cm away: its direct path dominates the mic.
    speaker = rirs["speaker"]
    peak = int(np.argmax(np.abs(speaker)))
    assert np.sum(speaker[: peak + 8] ** 2) > 0.5 * np.sum(speaker**2)


def _run(spec: RoomSpec, far: np.ndarray, near: np.ndarray) -> RealRoom:
    room = RealRoom(spec)
    for i in range(len(far) // STEP):
        room.mic_step(far[i * STEP : (i + 1) * STEP], near[i * STEP : (i + 1) * STEP])
    return room


def test_echo_to_user_ratio_and_seeding() -> None:
    """Speech-like sources: the echo over the user at the mic is the asked ratio (±4 dB)."""
    rng = np.random.default_rng(3)
    far = np.convolve(rng.standard_normal(48000), np.ones(8) / 8, "same") * 6000
    near = np.convolve(rng.standard_normal(48000), np.ones(8) / 8, "same") * 6000
    for ratio in (-10.0, 15.0):
        room = _run(RoomSpec(seed=1, echo_to_user_db=ratio), far, near)
        echo = np.concatenate(room.echo_part)[8000:]
        user = np.concatenate(room.user_part)[8000:]
        measured = 10 * np.log10(np.mean(echo**2) / np.mean(user**2))
        assert measured == pytest.approx(ratio, abs=4)
    again = _run(RoomSpec(seed=1, echo_to_user_db=15.0), far, near)
    assert np.array_equal(
        np.concatenate(again.echo_part), np.concatenate(room.echo_part)
    )


def test_playback_clock_slides_the_echo() -> None:
    """50 ppm: after 9 s the echo has slid 7 samples (0.45 ms) against what was played."""
    rng = np.random.default_rng(4)
    far = rng.standard_normal(16000 * 11) * 3000
    spec = RoomSpec(seed=1, skew_ppm=50.0, device_delay_ms=20)
    room = _run(spec, far, np.zeros_like(far))
    echo = np.concatenate(room.echo_part)

    def lag(at: int) -> int:
        corr = np.correlate(far[at - 1000 : at + 8000], echo[at : at + 8000], "valid")
        return int(np.argmax(np.abs(corr)))

    assert abs(lag(160000) - lag(16000)) == pytest.approx(7.2, abs=2)


def test_small_speaker_distorts_more_when_loud() -> None:
    """A sine through the speaker: its harmonics rise with the volume."""
    t = np.arange(16000) / 16000
    tone = np.sin(2 * np.pi * 1000 * t) * 16000

    def distortion(volume: float) -> float:
        speaker = SmallSpeaker(volume)
        out = np.concatenate(
            [speaker.step(tone[i : i + STEP]) for i in range(0, len(tone), STEP)]
        )[4000:]
        spectrum = np.abs(np.fft.rfft(out * np.hanning(len(out))))
        fundamental = spectrum[len(out) * 1000 // 16000]
        third = spectrum[len(out) * 3000 // 16000]
        return float(third / fundamental)

    assert distortion(1.0) > 10 * distortion(0.3)


@pytest.mark.parametrize("kind", ["music", "kitchen"])
def test_backgrounds_are_generated(kind: str) -> None:
    """Music and kitchen noise are made here, seeded, at about -20 dBFS."""
    signal = background_signal(kind, 2.0, seed=1)
    assert np.array_equal(signal, background_signal(kind, 2.0, seed=1))
    level = 20 * np.log10(np.sqrt(np.mean(signal**2)) / 32768)
    assert level == pytest.approx(-20, abs=1)


def test_tv_is_speech(clip) -> None:
    """The TV talks (espeak-ng voices) and sits at the asked level under the user."""
    tv = background_signal("tv", 3.0)
    spec = replace(RoomSpec(seed=1), background="tv", background_db=-10.0)
    room = RealRoom(spec, background=tv)
    for _ in range(300):
        room.mic_step(np.zeros(STEP))
    assert np.mean(np.concatenate(room.background_part) ** 2) > 0
