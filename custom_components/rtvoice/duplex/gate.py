"""Fast speech-onset gate: energy over an adaptive noise floor, sustained a few frames.

It answers "possible speech" within tens of milliseconds, long before the VAD does
(DESIGN §5.5). That is cheap to get wrong: the session only *pauses* playback on an
onset; the VAD and the transcript decide whether it was words (cancel the round) or
not (resume). Feed it the echo-cancelled signal when there is one.

The floor follows quiet frames down fast and creeps up slowly (``rise_db_per_s``), and
is frozen while the gate is open; the first ``calibration_frames`` only measure it, so steady noise (a fan, residual echo) raises it and
speech does not.
"""

from __future__ import annotations

import enum

from .audio import FRAME_MS, frame_dbfs


class GateEvent(enum.Enum):
    """What a frame changed."""

    ONSET = "onset"  # possible speech: sustained energy above the floor
    QUIET = "quiet"  # the gate closed again


class OnsetGate:
    """Energy onset detector over 10 ms frames. One per stream."""

    def __init__(
        self,
        *,
        margin_db: float = 12.0,
        min_dbfs: float = -50.0,
        sustain_frames: int = 3,
        release_frames: int = 15,
        rise_db_per_s: float = 3.0,
        fall_factor: float = 0.3,
        initial_floor_dbfs: float = -70.0,
        calibration_frames: int = 30,
    ) -> None:
        """Open after ``sustain_frames`` frames ``margin_db`` over the floor (and over ``min_dbfs``)."""
        self.margin_db = margin_db
        self.min_dbfs = min_dbfs
        self.sustain_frames = sustain_frames
        self.release_frames = release_frames
        self._rise = rise_db_per_s * FRAME_MS / 1000
        self._fall = fall_factor
        self.floor = initial_floor_dbfs
        self.open = False
        self.frames = 0
        self.onset_frame = 0  # first frame of the run that opened the gate
        self._run = 0
        self.level = initial_floor_dbfs
        self._calibration = calibration_frames

    def process(self, frame: bytes) -> GateEvent | None:
        """Score one frame (any length; 10 ms expected)."""
        self.frames += 1
        level = frame_dbfs(frame)
        self.level = level
        if self.frames <= self._calibration:
            # The first frames set the floor, whatever its level: no onset yet.
            self.floor += (level - self.floor) / self.frames
            return None
        loud = level >= self.floor + self.margin_db and level >= self.min_dbfs
        if self.open:
            self._run = 0 if loud else self._run + 1
            if self._run >= self.release_frames:
                self.open = False
                self._run = 0
                return GateEvent.QUIET
            return None
        if loud:
            self._run += 1
            if self._run >= self.sustain_frames:
                self.open = True
                self.onset_frame = self.frames - self._run + 1
                self._run = 0
                return GateEvent.ONSET
            return None
        self._run = 0
        self._track_floor(level)
        return None

    def _track_floor(self, level: float) -> None:
        if level < self.floor:
            self.floor += (level - self.floor) * self._fall
        else:
            self.floor += min(self._rise, level - self.floor)
