"""Where a newly placed stretch of reference lies against the learnt echo path.

The server knows what it sent, not when the device played it: each new stretch of
answer (the device's queue ran dry) is placed on the mic's time line from the mic
chunks' arrival times, a few milliseconds off the last one. A linear filter that
learnt the echo path on the last stretch then models a path a few ms away from
the real one and leaves most of the echo. Relearning takes seconds; measuring the
offset takes the first tenth of a second of echo.

``StretchAligner`` compares the mic with the filter's own echo estimate over the
stretch's first frames of echo (GCC-PHAT: the cross-spectrum with its magnitude
divided out, so the peak is sharp for speech) and says by how many samples (with
a fraction) the echo arrives later than the filter thinks. ``shift_taps`` moves a
partitioned filter by that much. The mic and the estimate are both echo of the
same answer, so a user talking over it (uncorrelated) only lowers the peak: the
aligner waits for a clear one, or gives up and leaves the filter to learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 160  # 10 ms at 16 kHz
_FFT = 2 * BLOCK
_EDGE = 64  # samples left out at each end of the frames measured


@dataclass(frozen=True, slots=True)
class Alignment:
    """What the aligner found: the echo is ``lag`` samples later than estimated."""

    lag: float
    # What the filter leaves of the echo once moved (error over echo power, on the
    # frames measured; a user talking in them only raises it).
    residual: float


class StretchAligner:
    """Finds the offset of a newly placed stretch from the frames after it."""

    def __init__(
        self,
        *,
        max_lag: int = 480,
        frames: int = 16,
        min_frames: int = 6,
        give_up_frames: int = 100,
        min_peak: float = 8.0,
    ) -> None:
        """Look ``max_lag`` samples either way, over the last ``frames`` frames.

        Decide once ``min_frames`` of them held echo and the correlation's peak
        stands ``min_peak`` standard deviations over the other lags; stop looking
        after ``give_up_frames``.
        """
        self.max_lag = max_lag
        self._frames = frames
        self._min_frames = min_frames
        self._give_up = give_up_frames
        self._min_peak = min_peak
        self._n = 1 << int(np.ceil(np.log2(frames * BLOCK + max_lag)))
        self._mic: np.ndarray = np.zeros(frames * BLOCK)
        self._echo: np.ndarray = np.zeros(frames * BLOCK)
        self._echo_frames = 0
        self._seen = 0
        self.active = False
        self.found: list[float] = []  # lags applied so far (diagnostics, tests)

    def start(self) -> None:
        """Look for the offset from the next frame on."""
        self.active = True
        self._mic[:] = 0.0
        self._echo[:] = 0.0
        self._echo_frames = 0
        self._seen = 0

    def feed(
        self, mic: np.ndarray, estimate: np.ndarray, *, floor: float
    ) -> Alignment | None:
        """Take one frame of mic and echo estimate; return the offset once it is clear.

        ``floor``: a frame energy (sum of squares) both must exceed to count as echo.
        """
        self._seen += 1
        self._mic = np.roll(self._mic, -BLOCK)
        self._echo = np.roll(self._echo, -BLOCK)
        self._mic[-BLOCK:] = mic
        self._echo[-BLOCK:] = estimate
        if (
            float(np.dot(estimate, estimate)) > floor
            and float(np.dot(mic, mic)) > floor
        ):
            self._echo_frames += 1
        if self._seen >= self._give_up:
            self.active = False
            return None
        if self._echo_frames < self._min_frames or self._echo_frames % 2:
            return None
        found = self._estimate()
        if found is not None:
            self.active = False
            self.found.append(found.lag)
        return found

    def _estimate(self) -> Alignment | None:
        n = self._n
        mic = np.fft.rfft(self._mic, n)
        echo = np.fft.rfft(self._echo, n)
        cross = mic * echo.conj()
        power = echo.real**2 + echo.imag**2
        band = power > 1e-4 * float(power.max())
        magnitude = np.abs(cross) + 1e-20
        weighted = np.where(band, cross / magnitude, 0.0)
        r = np.fft.irfft(weighted, n)
        lags = np.concatenate([r[-self.max_lag :], r[: self.max_lag + 1]])
        best = int(np.argmax(lags))
        peak = float(lags[best])
        spread = float(np.std(lags)) + 1e-20
        if peak / spread < self._min_peak:
            return None
        fraction = 0.0
        if 0 < best < len(lags) - 1:
            left, right = float(lags[best - 1]), float(lags[best + 1])
            curve = left - 2 * peak + right
            if curve < 0:
                fraction = 0.5 * (left - right) / curve
        lag = best - self.max_lag + fraction
        # What the moved filter leaves of the echo, on these frames (the buffer's
        # ends left out: a fractional move rings where the frames are cut).
        omega = np.arange(len(echo)) * (2 * np.pi / n)
        moved = np.fft.irfft(echo * np.exp(-1j * omega * lag), n)
        inner = slice(_EDGE, len(self._mic) - _EDGE)
        error = self._mic[inner] - moved[inner]
        kept = float(np.dot(error, error))
        total = float(np.dot(moved[inner], moved[inner])) + 1e-20
        return Alignment(lag, min(1.0, kept / total))


def shift_taps(filters: np.ndarray, lag: float) -> np.ndarray:
    """Return partitioned filter spectra (rows of rfft([taps, 0])) delayed by ``lag``.

    The whole impulse response is moved (a fraction of a sample by its phase);
    what moves out of the filter's span is dropped, what moves in is zero.
    """
    partitions = filters.shape[0]
    taps = np.fft.irfft(filters, n=_FFT, axis=1)[:, :BLOCK].reshape(-1)
    pad = int(np.ceil(abs(lag))) + BLOCK
    n = len(taps) + 2 * pad
    padded = np.zeros(n)
    padded[pad : pad + len(taps)] = taps
    spectrum = np.fft.rfft(padded)
    spectrum *= np.exp(-1j * np.arange(len(spectrum)) * (2 * np.pi / n) * lag)
    moved = np.fft.irfft(spectrum, n)[pad : pad + len(taps)]
    blocks = np.zeros((partitions, _FFT))
    blocks[:, :BLOCK] = moved.reshape(partitions, BLOCK)
    return np.asarray(np.fft.rfft(blocks, axis=1), dtype=filters.dtype)
