"""Utterance segmentation over a VAD (HA's ``pymicro-vad``) with hangover and pre-roll.

pymicro-vad needs exactly 10 ms frames (it returns -1, silently, for anything else)
and ~760 ms of audio before it scores anything (-1 again) — per instance. So a
segmenter owns one instance for the whole stream and warms it up with silence when
it is made; ``feed`` accepts PCM of any size and cuts it into 10 ms frames itself.

The VAD is slow at both ends (measured: speech found 110–350 ms after onset, "speech"
for ~0.3–0.5 s after it ends), so the utterance keeps ``pre_roll_ms`` of audio from
before the start decision (the STT gets the onset) and ends after ``silence_ms`` of
non-speech frames on top of the VAD's own tail. Those frames also begin the next
utterance's pre-roll: the VAD, still decaying from the last words (or from before a
``restart``), may call the onset of the next ones non-speech for a while (an "s" of
"stop" scored 0.0 for 170 ms); they are heard in both utterances rather than in
neither. It is not a barge-in detector (see ``gate.OnsetGate``).

With ``pause_ms`` set, a short silence inside an utterance (that many ms of frames
the caller marks ``quiet``, by energy, long before the VAD's tail ends) is reported
once per silence as ``UtterancePaused`` with the audio so far: the session
transcribes it to decide the end of the turn by what was said (``turn.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
import enum
import logging

from .audio import FRAME_BYTES, FRAME_MS, FrameChunker

_LOGGER = logging.getLogger(__name__)

FrameScorer = Callable[[bytes], float]
"""Speech probability of one 10 ms frame (negative: no score yet)."""

WARM_UP_MS = 800


class VadUnavailableError(RuntimeError):
    """pymicro-vad cannot be imported here."""


def micro_vad_scorer() -> FrameScorer:
    """Return a warmed pymicro-vad instance's scorer (blocking: ~25 ms of CPU)."""
    try:
        from pymicro_vad import MicroVad  # noqa: PLC0415 - optional native wheel
    except ImportError as err:
        raise VadUnavailableError(f"pymicro-vad is not installed: {err}") from err
    vad = MicroVad()
    silence = bytes(FRAME_BYTES)
    for _ in range(WARM_UP_MS // FRAME_MS):
        vad.Process10ms(silence)
    process: FrameScorer = vad.Process10ms
    return process


class SegmentState(enum.Enum):
    """Whether the segmenter is inside an utterance."""

    SILENCE = "silence"
    SPEECH = "speech"


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    """The VAD found speech; ``start_ms`` is where the kept audio begins (pre-roll)."""

    start_ms: int
    detected_ms: int


@dataclass(frozen=True, slots=True)
class UtteranceEnded:
    """An utterance is complete: its PCM (pre-roll included) and stream positions."""

    pcm: bytes
    start_ms: int
    end_ms: int
    forced: bool = False  # cut at max_utterance_ms, not by silence


@dataclass(frozen=True, slots=True)
class UtterancePaused:
    """A short silence inside an utterance: its PCM so far (pre-roll included)."""

    pcm: bytes
    start_ms: int
    at_ms: int


SegmentEvent = UtteranceStarted | UtteranceEnded | UtterancePaused


class UtteranceSegmenter:
    """Finds utterances in a 16 kHz s16le mono stream. One per stream, never shared."""

    def __init__(
        self,
        scorer: FrameScorer | None = None,
        *,
        threshold: float = 0.5,
        speech_ms: int = 30,
        silence_ms: int = 250,
        pre_roll_ms: int = 500,
        max_utterance_ms: int = 15000,
        pause_ms: int = 0,
    ) -> None:
        """Use ``scorer`` (default: a warmed pymicro-vad) with these timings.

        ``pause_ms``: report a short silence of this length (0: never); settable
        later as ``pause_frames`` (10 ms frames).
        """
        self._score = scorer if scorer is not None else micro_vad_scorer()
        self.threshold = threshold
        self._speech_frames = max(1, speech_ms // FRAME_MS)
        self._silence_frames = max(1, silence_ms // FRAME_MS)
        self._max_frames = max(1, max_utterance_ms // FRAME_MS)
        self._pre_roll: deque[bytes] = deque(maxlen=max(0, pre_roll_ms // FRAME_MS))
        self._chunker = FrameChunker(FRAME_BYTES)
        self._utterance: list[bytes] = []
        self._start_frame = 0
        self._run = (
            0  # consecutive speech (in SILENCE) or non-speech (in SPEECH) frames
        )
        self.pause_frames = max(0, pause_ms // FRAME_MS)
        self._quiet = 0  # consecutive quiet frames in SPEECH
        self._loud_seen = False  # a loud frame since the utterance or its last pause
        self.frames = 0  # 10 ms frames seen
        self.state = SegmentState.SILENCE
        self.last_probability = -1.0

    @property
    def position_ms(self) -> int:
        """Milliseconds of audio seen so far."""
        return self.frames * FRAME_MS

    @property
    def in_utterance(self) -> bool:
        """True between UtteranceStarted and UtteranceEnded."""
        return self.state is SegmentState.SPEECH

    def feed(self, pcm: bytes) -> list[SegmentEvent]:
        """Process PCM of any size; return the events it caused."""
        events = [self.process_frame(frame) for frame in self._chunker.feed(pcm)]
        return [event for event in events if event is not None]

    def process_frame(
        self, frame: bytes, *, quiet: bool | None = None
    ) -> SegmentEvent | None:
        """Process exactly one 10 ms frame; ``quiet``: no energy in it (None: unknown)."""
        if len(frame) != FRAME_BYTES:
            raise ValueError(f"frames must be {FRAME_BYTES} bytes, got {len(frame)}")
        self.frames += 1
        probability = self._score(frame)
        self.last_probability = probability
        speech = probability >= self.threshold
        if self.state is SegmentState.SILENCE:
            self._pre_roll.append(frame)
            self._run = self._run + 1 if speech else 0
            if self._run < self._speech_frames:
                return None
            self.state = SegmentState.SPEECH
            self._utterance = list(self._pre_roll)
            self._pre_roll.clear()
            self._start_frame = self.frames - len(self._utterance)
            self._run = 0
            self._quiet = 0
            self._loud_seen = quiet is False
            return UtteranceStarted(self._start_frame * FRAME_MS, self.position_ms)
        self._utterance.append(frame)
        self._run = 0 if speech else self._run + 1
        if self._run >= self._silence_frames:
            return self._end(forced=False)
        if len(self._utterance) >= self._max_frames:
            return self._end(forced=True)
        return self._pause(quiet)

    def _pause(self, quiet: bool | None) -> UtterancePaused | None:
        """Count quiet frames after a loud one; report the silence once."""
        if not self.pause_frames or quiet is None:
            return None
        if not quiet:
            self._quiet = 0
            self._loud_seen = True
            return None
        self._quiet += 1
        if self._quiet < self.pause_frames or not self._loud_seen:
            return None
        self._loud_seen = False  # once per silence: speech must come back first
        return UtterancePaused(
            b"".join(self._utterance), self._start_frame * FRAME_MS, self.position_ms
        )

    def restart(self) -> None:
        """Drop the audio kept so far; speech that goes on starts a new utterance."""
        self._utterance = []
        self._pre_roll.clear()
        self._run = 0
        self.state = SegmentState.SILENCE

    def _end(self, *, forced: bool) -> UtteranceEnded:
        pcm = b"".join(self._utterance)
        if not forced:
            # The hangover (frames the VAD called non-speech) is the next
            # utterance's pre-roll: words begun in it (a fricative the VAD is slow
            # to score) keep their onset. Forced: speech goes on, nothing to carry.
            self._pre_roll.extend(self._utterance[len(self._utterance) - self._run :])
        self._utterance = []
        self._run = 0
        self.state = SegmentState.SILENCE
        return UtteranceEnded(
            pcm, self._start_frame * FRAME_MS, self.position_ms, forced
        )
