"""Fast speech-onset gate: energy over an adaptive noise floor, sustained a few frames.

It answers "possible speech" within tens of milliseconds, long before the VAD does
(DESIGN §5.5). That is cheap to get wrong: the session only *pauses* playback on an
onset; the VAD and the transcript decide whether it was words (cancel the round) or
not (resume). Feed it the echo-cancelled signal when there is one.

The floor follows quiet frames down fast and creeps up slowly (``rise_db_per_s``), and
is frozen while the gate is open; the first ``calibration_frames`` only measure it, so steady noise (a fan, residual echo) raises it and
speech does not.

A room's own sound that comes and goes (a TV, music) has quiet moments the floor
follows, and every loud moment of it would be an onset. ``RoomLevel`` is how loud
the room's own sound gets: an upper quantile (~97 %) of the gate's frames while
the answer plays and the user is quiet (the session says when:
``process(frame, learn_room=True)``). An onset must also stand ``room_margin_db``
(8 dB) over it: the user near the satellite is louder than a TV across the room.
It outlives a conversation (the room does): pass the satellite's ``RoomLevel``
to every gate. With no sound of its own in the room it stays near the floor and
changes nothing.
"""

from __future__ import annotations

from collections import deque
import enum

from .audio import FRAME_MS, frame_dbfs


class GateEvent(enum.Enum):
    """What a frame changed."""

    ONSET = "onset"  # possible speech: sustained energy above the floor
    QUIET = "quiet"  # the gate closed again


class RoomLevel:
    """How loud the room's own sounds get (dBFS): an upper quantile of frame levels.

    Up ``up_db`` for a frame louder than it, down ``down_db`` for one that is not:
    it settles where one frame in (up + down) / down is louder (~3 % for 1 and
    0.03 dB: 3 dB a second when the room goes quiet; a TV is learnt within a
    second or two of an answer). None until it has learnt.
    """

    def __init__(
        self,
        *,
        up_db: float = 1.0,
        down_db: float = 0.03,
    ) -> None:
        """Follow the room's loud frames with these steps per 10 ms frame."""
        self.level: float | None = None
        self._up = up_db
        self._down = down_db

    def learn(self, level: float, floor: float) -> None:
        """Take one frame's level (the gate's noise ``floor``: where it starts)."""
        current = floor if self.level is None else self.level
        if level > current:
            current += min(self._up, level - current)
        else:
            current -= min(self._down, current - level)
        self.level = current


class OnsetGate:
    """Energy onset detector over 10 ms frames. One per stream."""

    def __init__(
        self,
        *,
        margin_db: float = 12.0,
        min_dbfs: float = -50.0,
        sustain_frames: int = 3,
        strong_db: float = 10.0,
        strong_frames: int = 2,
        release_frames: int = 15,
        rise_db_per_s: float = 3.0,
        fall_factor: float = 0.3,
        initial_floor_dbfs: float = -70.0,
        calibration_frames: int = 30,
        room_margin_db: float = 8.0,
        room: RoomLevel | None = None,
    ) -> None:
        """Open on ``sustain_frames`` loud frames, or ``strong_frames`` very loud ones.

        Loud: ``margin_db`` over the floor, ``room_margin_db`` over the room's own
        sound (``room``, shared by the satellite's gates) and over ``min_dbfs``;
        very loud: another ``strong_db`` above the floor's margin.
        """
        self.margin_db = margin_db
        self.min_dbfs = min_dbfs
        self.sustain_frames = sustain_frames
        self.strong_db = strong_db
        self.strong_frames = strong_frames
        self._strong = 0
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
        self.room_margin_db = room_margin_db
        self.room = room if room is not None else RoomLevel()

    @property
    def room_loud(self) -> bool:
        """True when the room's own sound stands ``margin_db`` over the noise floor."""
        room = self.room.level
        return room is not None and room >= self.floor + self.margin_db

    def process(self, frame: bytes, *, learn_room: bool = False) -> GateEvent | None:
        """Score one frame (any length; 10 ms expected).

        ``learn_room``: the frame is the room's own sound (the answer plays and
        the user is quiet), for ``room``.
        """
        self.frames += 1
        level = frame_dbfs(frame)
        self.level = level
        if self.frames <= self._calibration:
            # The first frames set the floor, whatever its level: no onset yet.
            self.floor += (level - self.floor) / self.frames
            return None
        if learn_room:
            self.room.learn(level, self.floor)
        room = self.room.level
        loud = (
            level >= self.floor + self.margin_db
            and level >= self.min_dbfs
            and (room is None or level >= room + self.room_margin_db)
        )
        if self.open:
            self._run = 0 if loud else self._run + 1
            if self._run >= self.release_frames:
                self.open = False
                self._run = 0
                return GateEvent.QUIET
            return None
        if loud:
            self._run += 1
            strong = level >= self.floor + self.margin_db + self.strong_db
            self._strong = self._strong + 1 if strong else 0
            if self._run >= self.sustain_frames or self._strong >= self.strong_frames:
                self.open = True
                self.onset_frame = self.frames - self._run + 1
                self._run = self._strong = 0
                return GateEvent.ONSET
            return None
        self._run = self._strong = 0
        self._track_floor(level)
        return None

    def _track_floor(self, level: float) -> None:
        if level < self.floor:
            self.floor += (level - self.floor) * self._fall
        else:
            self.floor += min(self._rise, level - self.floor)


class EchoAwareGate:
    """Onset on the *raw* mic while echo plays, over an upper envelope of that echo.

    AEC3's suppressor holds back the first ~100 ms of near-end speech during double
    talk, so a gate on the cleaned signal alone is late. This gate predicts the
    loudest echo the raw mic can hold now: the loudest reference frame of the last
    ``window_ms`` (whatever the delay within that window) plus the echo path gain.
    The gain is learned from frames where the cleaned signal is quiet: fast during
    the first ``learn_frames`` of echo, then rising at most ``rise_db_per_s`` (a user
    talking under AEC3's suppression is not learned as echo) and decaying slowly.
    Sustained raw energy ``margin_db`` over the prediction is an onset. With no
    reference playing it stays silent (the cleaned-signal gate covers that case).
    """

    def __init__(
        self,
        *,
        window_ms: int = 450,
        margin_db: float = 6.0,
        sustain_frames: int = 3,
        min_dbfs: float = -50.0,
        learn_frames: int = 100,
        rise_db_per_s: float = 2.0,
        decay_db_per_s: float = 0.5,
    ) -> None:
        """Predict echo over ``window_ms``; fire ``margin_db`` above it."""
        self._window: deque[float] = deque(maxlen=max(1, window_ms // FRAME_MS))
        self.margin_db = margin_db
        self.sustain_frames = sustain_frames
        self.min_dbfs = min_dbfs
        self._learn_frames = learn_frames
        self._rise = rise_db_per_s * FRAME_MS / 1000
        self._decay = decay_db_per_s * FRAME_MS / 1000
        self.echo_gain_db: float | None = None
        self._learned = 0
        self._run = 0
        self.frames = 0
        self.onset_frame = 0

    def process(self, raw: bytes, reference: bytes, *, learn: bool) -> GateEvent | None:
        """Score one raw 10 ms mic frame with the reference frame the AEC got with it.

        ``learn``: the cleaned signal is quiet (no user heard), so the raw frame is echo.
        """
        self.frames += 1
        self._window.append(frame_dbfs(reference))
        loudest = max(self._window)
        level = frame_dbfs(raw)
        if loudest < self.min_dbfs:
            self._run = 0
            return None  # nothing playing: no echo to predict
        gain = level - loudest
        estimate = self.echo_gain_db
        if (
            estimate is not None
            and level >= self.min_dbfs
            and gain >= estimate + self.margin_db
        ):
            self._run += 1
            if self._run == self.sustain_frames:
                self.onset_frame = self.frames - self._run + 1
                return GateEvent.ONSET
            return None
        self._run = 0
        if learn:
            if estimate is None:
                self.echo_gain_db = gain
            elif gain > estimate:
                fast = self._learned < self._learn_frames
                self.echo_gain_db = (
                    gain if fast else estimate + min(gain - estimate, self._rise)
                )
            else:
                self.echo_gain_db = max(gain, estimate - self._decay)
            self._learned += 1
        return None
