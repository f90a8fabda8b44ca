"""Whether a satellite's microphone hears its own answers.

Barge-in by voice (``vad``) needs the answer's echo out of the mic: the board's own
canceller (Voice PE's XMOS) or the server's. On a board that hears itself with echo
cancellation off, the gate opens on the answer, the VAD takes its speech for the
user's, the answer is cut and the echo is transcribed and answered — a loop of
0.25 s fragments that never ends. The product tells the user instead.

It can tell: the answer's own audio comes back in the mic. The loudness envelope of
the mic (one level per 10 ms frame) follows the envelope of what was sent to the
device, shifted by the device's unknown output latency and the room's delay. The
detector keeps both envelopes over the last few seconds, and while an answer plays
correlates them over every lag up to ``max_lag_ms``, over the frames where the
answer played at that lag: echo gives a high correlation at one lag (the syllables
of the answer rise and fall in the mic), a user talking over it, a TV or a board
that cancels its echo do not (their envelope is not the answer's), nor a user who
interrupts every answer alike (the answer's silences, where both are quiet, do not
count; and a mic that is often loud where the answer has long been silent is
someone talking, whatever the match). ``evidence`` consecutive windows over
``threshold`` make the verdict, which is final for the detector's life (one
conversation).

Sent frames are placed on the mic's frame count as they leave the server (a
paced player keeps a steady lead ahead of playback): the lead, the network and the
device's buffers only move the lag, which the search covers.

Pure Python and numpy, no Home Assistant; one per conversation, fed on the loop.
Its memory is two fixed rings; an evaluation (every ``every_ms`` of answer, 81
lags) costs about 3 ms on the loop.
"""

from __future__ import annotations

import numpy as np

from .audio import FRAME_MS

FLOOR_DBFS = -70.0  # levels below this are the same silence (room floor)
ACTIVE_DBFS = -55.0  # a sent frame this loud or louder is answer audio
TAIL = 15  # frames: gaps between words and the echo's reverberant tail
LOUD_OVER_DB = 15.0  # a mic frame this far above its quiet is sound, not the floor
MAX_LOUD_ALONE = 0.25  # echo: this share of the mic's loud frames at most is alone


class SelfHearing:
    """Correlates the mic's envelope with the answer's; says when they match."""

    def __init__(
        self,
        *,
        window_ms: int = 4000,
        max_lag_ms: int = 800,
        every_ms: int = 500,
        min_active_ms: int = 500,
        threshold: float = 0.6,
        evidence: int = 3,
        min_spread_db: float = 6.0,
    ) -> None:
        """Judge windows of ``window_ms`` with at least ``min_active_ms`` of answer.

        ``min_spread_db``: a mic whose level barely moves (a board that cancels its
        own echo, a steady fan) is no evidence either way.
        """
        self._window = window_ms // FRAME_MS
        self._max_lag = max_lag_ms // FRAME_MS
        self._every = every_ms // FRAME_MS
        self._min_active = min_active_ms // FRAME_MS
        self._threshold = threshold
        self._evidence = evidence
        self._min_spread = min_spread_db
        self._mic = np.full(self._window, FLOOR_DBFS, dtype=np.float32)
        # The far end reaches up to ``max_lag`` frames into the past of the
        # window (the lags) and, sent ahead, up to ``max_lag`` into its future.
        self._far = np.full(self._window + 2 * self._max_lag, FLOOR_DBFS, np.float32)
        self._frames = 0  # mic frames seen
        self._far_frames = 0  # the far-end cursor, on the mic's frame count
        self._since_check = 0
        self._streak = 0
        self.correlation: float | None = None  # of the last judged window
        self.hears_itself = False

    def played(self, dbfs: float) -> None:
        """Take the level of one 10 ms answer frame as it is sent to the device."""
        self._far_frames = max(self._far_frames, self._frames)
        if self._far_frames - self._frames >= self._max_lag:
            return  # far ahead of the mic (a burst): beyond the lags searched
        self._far[self._far_frames % len(self._far)] = max(FLOOR_DBFS, dbfs)
        self._far_frames += 1

    def mic(self, dbfs: float) -> bool:
        """Take the level of the next 10 ms mic frame; True once it hears itself."""
        self._mic[self._frames % self._window] = max(FLOOR_DBFS, dbfs)
        self._frames += 1
        # The far-end slot that now enters the future the cursor may write (it
        # still holds a frame older than any lag): nothing was sent there yet.
        self._far[(self._frames + self._max_lag - 1) % len(self._far)] = FLOOR_DBFS
        if self.hears_itself:
            return True
        self._since_check += 1
        if self._since_check >= self._every and self._frames >= self._window:
            self._since_check = 0
            self._judge()
        return self.hears_itself

    def _judge(self) -> None:
        end = self._frames  # mic frames [end - window, end) are judged
        mic = _take(self._mic, end - self._window, self._window)
        far = _take(
            self._far, end - self._window - self._max_lag, self._window + self._max_lag
        )
        if int(np.count_nonzero(far >= ACTIVE_DBFS)) < self._min_active:
            return  # too little answer in the window: no evidence either way
        if float(np.percentile(mic, 90) - np.percentile(mic, 10)) < self._min_spread:
            self.correlation = 0.0
            self._streak = 0
            return
        best, lag = max(
            (self._while_playing(mic, far[self._max_lag - lag : len(far) - lag]), lag)
            for lag in range(self._max_lag + 1)
        )
        if best >= self._threshold and self._loud_alone(
            mic, far[self._max_lag - lag : len(far) - lag]
        ):
            best = 0.0  # the mic is loud by itself too: someone talks, not echo
        self.correlation = best
        self._streak = self._streak + 1 if best >= self._threshold else 0
        if self._streak >= self._evidence:
            self.hears_itself = True

    def _while_playing(self, mic: np.ndarray, far: np.ndarray) -> float:
        """Correlation of the mic with the answer over the frames the answer played.

        Only there does echo show: the mic rises and falls with the answer's
        syllables. Frames where the answer is silent say nothing about it, and
        would make a user who interrupts every answer alike (answer, then the
        user while it is cut, then both quiet) look like its echo.
        """
        playing = far >= ACTIVE_DBFS
        if int(np.count_nonzero(playing)) < self._min_active:
            return 0.0
        return _pearson(mic[playing], far[playing])

    def _loud_alone(self, mic: np.ndarray, far: np.ndarray) -> bool:
        """Whether the mic is often loud where the answer (at the lag) is silent.

        Echo is only there while the answer plays (and a short reverberant tail
        after it); a user who speaks once the answer stopped for them (a
        barge-in pauses it) makes the mic loud where the answer is silent. Two
        envelopes with few syllables in a window can match at some lag by chance;
        this tells such a match from echo.
        """
        loud = mic > float(np.percentile(mic, 10)) + LOUD_OVER_DB
        # The answer counts as playing across its short gaps and its echo's
        # reverberant tail: silent only where nothing played for a while.
        playing = np.convolve(far >= ACTIVE_DBFS, np.ones(2 * TAIL + 1), "same") > 0
        alone = np.count_nonzero(loud & ~playing)
        return float(alone) > MAX_LOUD_ALONE * float(np.count_nonzero(loud))


def _take(ring: np.ndarray, first: int, count: int) -> np.ndarray:
    """Return ``count`` entries of ``ring`` from absolute index ``first`` on."""
    taken: np.ndarray = ring[np.arange(first, first + count) % len(ring)]
    return taken


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two equally long envelopes (0 when either is flat)."""
    a = a - a.mean()
    b = b - b.mean()
    denominator = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    return float(np.dot(a, b)) / denominator if denominator > 0 else 0.0
