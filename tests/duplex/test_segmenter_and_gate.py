"""Utterance segmentation (real pymicro-vad on espeak clips) and the onset gate."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.duplex.audio import (
    BYTES_PER_MS,
    FRAME_BYTES,
    FrameChunker,
)
from custom_components.rtvoice.duplex.gate import EchoAwareGate, GateEvent, OnsetGate
from custom_components.rtvoice.duplex.segmenter import (
    UtteranceEnded,
    UtteranceSegmenter,
    UtteranceStarted,
)
from tests.duplex.conftest import noise
from tests.peers.speech import silence

LEAD = 1000
TAIL = 1500


def events_of(segmenter: UtteranceSegmenter, pcm: bytes, chunk: int):
    """Feed ``pcm`` in ``chunk``-byte pieces and collect the events."""
    out = []
    for i in range(0, len(pcm), chunk):
        out += segmenter.feed(pcm[i : i + chunk])
    return out


@pytest.mark.parametrize("chunk", [FRAME_BYTES, 1024, 4000, 7])
def test_one_utterance_with_plausible_bounds(clip, chunk: int) -> None:
    """A phrase is one utterance that keeps its onset, whatever the chunk size."""
    pcm = clip("turn on the kitchen light please", lead_ms=LEAD, tail_ms=TAIL)
    speech_end = len(pcm) // BYTES_PER_MS - TAIL
    events = events_of(UtteranceSegmenter(), pcm, chunk)
    assert [type(e) for e in events] == [UtteranceStarted, UtteranceEnded]
    started, ended = events
    assert started.start_ms <= LEAD < started.detected_ms  # pre-roll covers the onset
    assert speech_end < ended.end_ms < len(pcm) // BYTES_PER_MS
    assert len(ended.pcm) == (ended.end_ms - ended.start_ms) * BYTES_PER_MS
    assert not ended.forced


def test_two_phrases_two_utterances_and_a_short_word(clip) -> None:
    """Phrases apart by silence are two utterances; 'stop' alone is found too."""
    segmenter = UtteranceSegmenter()
    pcm = clip("what time is it", tail_ms=1200) + clip("stop", tail_ms=1200)
    ends = [e for e in segmenter.feed(pcm) if isinstance(e, UtteranceEnded)]
    assert len(ends) == 2


def test_silence_and_steady_noise_are_no_utterance() -> None:
    """Nothing starts on silence or steady low noise."""
    segmenter = UtteranceSegmenter()
    assert segmenter.feed(silence(2000) + noise(2000, -50)) == []


def test_wrong_frame_size_is_refused() -> None:
    """process_frame takes exactly 10 ms (pymicro-vad would return -1 silently)."""
    segmenter = UtteranceSegmenter(lambda frame: 0.0)
    with pytest.raises(ValueError, match="320"):
        segmenter.process_frame(bytes(640))


def test_max_length_and_restart() -> None:
    """An endless utterance is cut at max length; restart drops what was kept."""
    segmenter = UtteranceSegmenter(
        lambda frame: 1.0 if frame[0] else 0.0,
        speech_ms=10,
        pre_roll_ms=20,
        max_utterance_ms=100,
    )
    loud = b"\x01" * FRAME_BYTES
    events = segmenter.feed(bytes(FRAME_BYTES) * 5 + loud * 20)
    assert isinstance(events[0], UtteranceStarted)
    assert isinstance(events[1], UtteranceEnded) and events[1].forced
    assert len(events[1].pcm) == 10 * FRAME_BYTES
    segmenter.restart()
    assert not segmenter.in_utterance
    (started,) = segmenter.feed(loud)
    assert started.start_ms == started.detected_ms - 10


def test_words_begun_in_a_hangover_keep_their_onset() -> None:
    """The hangover of one utterance is the pre-roll of the next.

    As measured after a wake word (a satellite's test of 2026-12-07): the VAD, still
    decaying from the words before ``restart``, starts an utterance on silence; the
    "s" of "stop" is then scored 0.0 for 170 ms and falls in that utterance's
    hangover; the next utterance begins once "op" is scored. Without the carry, its
    audio lacked "st" and the STT heard "the".
    """
    silent, onset, vowel = (bytes([tag]) * FRAME_BYTES for tag in (0, 1, 2))
    script = (
        [(silent, 0.99)] * 12  # the VAD decaying: an utterance starts on silence
        + [(silent, 0.0)] * 15
        + [(onset, 0.0)] * 17  # the word begins; the VAD does not score it yet
        + [(vowel, 1.0)] * 20
        + [(silent, 0.0)] * 30
    )
    scores = iter(score for _, score in script)
    segmenter = UtteranceSegmenter(lambda frame: next(scores))
    segmenter.restart()
    ends = [
        event
        for frame, _ in script
        if isinstance(event := segmenter.process_frame(frame), UtteranceEnded)
    ]
    assert len(ends) == 2
    frames = [
        ends[1].pcm[i : i + FRAME_BYTES]
        for i in range(0, len(ends[1].pcm), FRAME_BYTES)
    ]
    assert frames.count(onset) == 17  # the whole onset, before the vowel
    assert frames.index(vowel) == frames.index(onset) + 17
    assert len(ends[1].pcm) == (ends[1].end_ms - ends[1].start_ms) * BYTES_PER_MS


def gate_frames(gate: OnsetGate, pcm: bytes) -> list[tuple[int, GateEvent]]:
    """Return (frame number, event) for every event ``pcm`` causes."""
    events = [(gate.process(frame), gate.frames) for frame in FrameChunker().feed(pcm)]
    return [(n, event) for event, n in events if event is not None]


def test_gate_opens_within_a_few_frames_of_speech(clip) -> None:
    """Speech over a quiet floor opens the gate within tens of ms of its first loud frame."""
    pcm = (
        noise(LEAD, -65)
        + clip("turn on the light", lead_ms=0, tail_ms=0)
        + noise(800, -65)
    )
    gate = OnsetGate()
    events = gate_frames(gate, pcm)
    onset_frame, event = events[0]
    assert event is GateEvent.ONSET
    first_speech_frame = LEAD // 10 + 1
    assert first_speech_frame <= gate.onset_frame <= onset_frame
    assert onset_frame - first_speech_frame < 10  # under 100 ms of audio
    assert events[-1][1] is GateEvent.QUIET


def test_gate_ignores_silence_and_steady_noise() -> None:
    """Silence and steady noise (whatever its level) never open it."""
    assert gate_frames(OnsetGate(), silence(3000)) == []
    assert gate_frames(OnsetGate(), noise(5000, -30)) == []


def test_gate_opens_on_a_noise_burst() -> None:
    """A cough-like burst opens it too: the VAD and the transcript decide later."""
    pcm = noise(1000, -60) + noise(150, -20, seed=2) + noise(1000, -60, seed=3)
    kinds = [event for _, event in gate_frames(OnsetGate(), pcm)]
    assert kinds == [GateEvent.ONSET, GateEvent.QUIET]


def tone(dbfs: float, frames: int = 1) -> bytes:
    """Return a square wave at ``dbfs`` RMS, ``frames`` 10 ms frames long."""
    amplitude = int(32768 * 10 ** (dbfs / 20))
    half = amplitude.to_bytes(2, "little", signed=True) + (-amplitude).to_bytes(
        2, "little", signed=True
    )
    return half * (80 * frames)


def test_echo_aware_gate_learns_the_echo_and_fires_over_it() -> None:
    """Echo 20 dB under the reference is learned; a user 15 dB over it is an onset."""
    gate = EchoAwareGate(sustain_frames=3)
    reference, echo = tone(-15), tone(-35)
    assert all(gate.process(echo, reference, learn=True) is None for _ in range(150))
    assert gate.echo_gain_db == pytest.approx(-20, abs=0.5)
    loud = tone(-20)
    events = [gate.process(loud, reference, learn=False) for _ in range(3)]
    assert events == [None, None, GateEvent.ONSET]
    assert gate.onset_frame == 151


def test_echo_aware_gate_is_silent_without_reference() -> None:
    """Nothing playing: this gate leaves onsets to the cleaned-signal gate."""
    gate = EchoAwareGate()
    silent = bytes(FRAME_BYTES)
    assert all(gate.process(tone(-10), silent, learn=False) is None for _ in range(20))
