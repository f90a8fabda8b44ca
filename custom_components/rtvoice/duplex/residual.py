"""The residual echo suppressor after the numpy canceller's linear filter.

``ResidualSuppressor.suppress`` compares each bin of the linear filter's output
with its *predicted residual echo*: the echo's power there (the filter's
estimate or the reference through the coherence path, whichever is larger,
spread over neighbouring bins and a reverberant tail) times the share of it the
linear filter leaves in that
band (the attenuation, followed per band: the filter leaves far more at high
frequencies, where the speaker distorts and a fraction of a sample of drift
counts). The attenuation follows an upper quantile of what the filter is seen
to leave frame by frame (up 0.5 dB a frame, down 0.2 dB: about the 70th
percentile), not its median: the residual of a frame swings ±10 dB around it,
and the onset gate must not open on the loud ones. Above 4 kHz (fricatives, the
speaker's distortion) the prediction is four times over. Bins no louder than
their prediction fall to the room's noise; a band whose power stays within its
own prediction (over-suppressed, summed over the band: single bins of the
residual swing past theirs) and what its neighbours' residual leaks through the
suppression filter is residual too, and a frame with nothing beyond that is
the room's noise (so the onset gate never opens on residual echo), while a user
louder than the residual in any band passes in the frame they start (no attack
smoothing). The
gain is applied as a 65-tap linear-phase filter: 2 ms of latency, no block
artefacts.

All of it is taken as residual (``distrust``) in a frame the filter made louder
and while the filter waits to be aligned on a new stretch (``align.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

BLOCK = 160  # 10 ms at 16 kHz
_FFT = 2 * BLOCK
_BINS = BLOCK + 1
_GAIN_TAPS = 32  # the suppression filter's half length (2 ms)
OVER = 2.0
SPREAD_BINS = 3  # the residual prediction covers this many neighbouring bins
SPREAD_GAIN = 0.5  # at this share of their power
# Leakage of the suppression filter into a band: this share of its neighbours'
# residual (measured: p99 -16 dB of the residual, at the band edges).
LEAK_SHARE = 0.03
COLD_GAIN = 8.0  # echo power over the loudest reference, assumed while cold
TAIL_DECAY = 0.6  # per frame: the residual prediction's reverberant tail
ATTENUATION_FLOOR = 0.003  # the linear filter never leaves less than this
RISE = 10 ** (0.5 / 10)  # the attenuation's rise per frame
FALL = 10 ** (-0.2 / 10)  # and its fall: an upper quantile
HIGH_BIN = 80  # 4 kHz: above it the prediction is HIGH_OVER times over
HIGH_OVER = 4.0
JUMP = 4.0  # error this far over the prediction is near-end speech
# Bands the attenuation is followed in (bin edges): the filter leaves far more of
# the echo at high frequencies (the speaker's distortion) than below 1 kHz.
EDGES = np.array([0, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100, 128, _BINS])
_STARTS = EDGES[:-1]
_WIDTHS = np.diff(EDGES)
MEASURED = 10.0  # the echo estimate over the noise at which its ratio is measured
NOISE_SMOOTH = 0.8  # the mic's power per bin is smoothed over frames (this pole)
# The smoothed power's minimum (down fast, up 0.2 % a frame) lies this far under
# its mean (measured: -2.6 dB for Gaussian noise).
NOISE_BIAS = 10 ** (2.6 / 10)
# Neighbouring bins' weights in the spread (the bin itself weighs 1).
_SPREAD = np.array([SPREAD_GAIN] * SPREAD_BINS + [1.0] + [SPREAD_GAIN] * SPREAD_BINS)


def _gain_response() -> np.ndarray:
    """Gains per bin to the short linear-phase filter's response, as one matrix.

    Row ``i`` is the response of the 65-tap Hann-windowed filter made from a gain
    of 1 in bin ``i`` (irfft, centred, windowed, rfft); the response is linear in
    the gains, so one matrix product replaces three FFTs (numpy's cost is per
    call). Real and imaginary parts interleave: the product views as complex.
    """
    taps = np.fft.irfft(np.eye(_BINS), n=_FFT, axis=1)
    taps = np.concatenate([taps[:, -_GAIN_TAPS:], taps[:, : _GAIN_TAPS + 1]], axis=1)
    taps *= np.hanning(2 * _GAIN_TAPS + 1)
    response = np.fft.rfft(taps, n=_FFT, axis=1)
    return np.ascontiguousarray(response).view(np.float64)


_RESPONSE = _gain_response()


class ResidualSuppressor:
    """Residual echo suppression state for one stream (float samples, ±1 scale)."""

    def __init__(
        self, *, min_gain_db: float = -40.0, over_suppress: float = OVER
    ) -> None:
        """Suppress residual echo down to ``min_gain_db``, ``over_suppress`` times over."""
        self._min_gain = 10 ** (min_gain_db / 20)
        self._over = over_suppress
        self.noise: np.ndarray = np.full(_BINS, 1e-3)  # the mic's floor, [0, e] scale
        self.residual: np.ndarray = np.zeros(_BINS)  # predicted residual echo per bin
        self._envelope: np.ndarray = np.zeros(_BINS)  # the echo's power per bin
        # Share of the echo the linear filter leaves, per band.
        self.attenuation: np.ndarray = np.ones(len(_WIDTHS))
        self._smoothed: np.ndarray | None = None  # the mic's power, smoothed
        self._minimum: np.ndarray = np.full(_BINS, 1e-3)  # and its minimum
        self._padded: np.ndarray = np.zeros(_BINS + 2 * SPREAD_BINS)
        # Each bin with its neighbours (a view: it follows the padded envelope).
        self._around: np.ndarray = np.lib.stride_tricks.sliding_window_view(
            self._padded, len(_SPREAD)
        )

    def quiet(self) -> bool:
        """Return True when no residual echo is predicted any more (its tail died)."""
        return float(self._envelope.sum()) <= 1e-3 * float(self.noise.sum())

    def decay(self) -> None:
        """Let the predicted tail die down over a frame the suppressor does not see."""
        self._envelope *= TAIL_DECAY

    def track_noise(self, power: np.ndarray) -> None:
        """Track the mic's noise floor per bin: down with quiet frames, creeping up.

        ``power``: the mic's [last d, d] power spectrum, while the far end is
        silent (the echo is no floor to keep).
        """
        if self._smoothed is None:
            self._smoothed = power.copy()
        else:
            self._smoothed += (1.0 - NOISE_SMOOTH) * (power - self._smoothed)
        smoothed = self._smoothed
        low = self._minimum
        self._minimum = np.where(
            smoothed < low, 0.7 * low + 0.3 * smoothed, low * 1.002
        )
        # The [0, e] spectra the suppressor compares against hold half the power.
        self.noise = 0.5 * NOISE_BIAS * self._minimum

    def suppress(
        self,
        spectrum: np.ndarray,
        big_yf: np.ndarray,
        big_ef: np.ndarray,
        *,
        coarse: np.ndarray,
        loudest: Callable[[], np.ndarray] | None,
        leak: float,
        cold: bool,
        far: bool,
        distrust: bool,
    ) -> np.ndarray:
        """Attenuate each bin of the filter's output by its residual echo, instantly.

        ``spectrum``: the output's last two frames (the newest is returned,
        suppressed); ``big_yf`` and ``big_ef``: the filter's echo estimate and its
        output, each as [0, frame] spectra; ``coarse``: the echo's power per bin
        through the coherence path; ``loudest``: gives the loudest reference power
        per bin over the filter's span (the echo's bound while ``cold``); ``leak``: the
        share of the estimate's power the error holds; ``distrust``: take all of
        this frame's echo as residual (the filter is off its path), and learn
        nothing of what it leaves.
        """
        echo = big_yf.real**2 + big_yf.imag**2
        error = big_ef.real**2 + big_ef.imag**2
        envelope = np.maximum(echo, coarse)
        if cold and loudest is not None:
            # No path learnt yet: any delay of the filter's span, at a
            # conservative gain (the echo may be louder than the reference).
            envelope = np.maximum(envelope, COLD_GAIN * loudest())
        # Spread over neighbouring bins: a bin the estimate misses (a weak
        # reference there, the speaker's distortion) is covered by its neighbours.
        self._padded[SPREAD_BINS:-SPREAD_BINS] = envelope
        spread = (self._around * _SPREAD).max(axis=1)
        self._envelope = np.maximum(spread, TAIL_DECAY * self._envelope)
        if distrust:
            residual = self._envelope.copy()
        else:
            self._track_attenuation(error, echo, far=far, cold=cold)
            residual = np.repeat(self.attenuation, _WIDTHS) * self._envelope
        residual[HIGH_BIN:] *= HIGH_OVER
        residual = np.maximum(residual, leak * echo)
        self.residual = residual
        gain = 1.0 - self._over * residual / (error + 1e-12)
        # Never below the room's own noise: the onset gate's floor stays the room's.
        floor = np.sqrt(self.noise / (error + 1e-12))
        gain = np.clip(gain, np.maximum(self._min_gain, np.minimum(floor, 1.0)), 1.0)
        # The gain as a short linear-phase filter: 2 ms late, no block artefacts.
        response = (gain @ _RESPONSE).view(np.complex128)
        out = np.fft.irfft(spectrum * response, n=_FFT)[BLOCK:]
        # What the frame holds beyond the predicted residual, band by band (a
        # band's sum, not its bins': one bin of the residual often swings
        # past its prediction), less what the suppression filter leaks into
        # the band from its neighbours' residual: nothing (all echo) leaves the
        # room's noise.
        bands = np.add.reduceat(residual, _STARTS)
        leaking = np.zeros_like(bands)
        leaking[1:] += bands[:-1]
        leaking[:-1] += bands[1:]
        kept = (
            np.add.reduceat(error, _STARTS) - self._over * bands - LEAK_SHARE * leaking
        )
        beyond = float(np.maximum(0.0, kept).sum())
        noise = float(self.noise.sum())
        if beyond <= noise:
            level = float(np.dot(out, out)) * _FFT / 2 + 1e-12
            if level > noise:
                out = out * np.sqrt(noise / level)
        return out

    def _track_attenuation(
        self, error: np.ndarray, echo: np.ndarray, *, far: bool, cold: bool
    ) -> None:
        """Follow the share of the echo the linear filter leaves, per band.

        Measured while the far end plays, in bands where the filter's estimate
        stands ``MEASURED`` over the room's noise (before the echo arrives the
        estimate is the filter's noise, and the ratio says nothing). Up at most
        ``RISE`` a frame, and only while the error stays within ``JUMP`` of the
        prediction (a user talking raises the ratio far more at once: that is
        near end, not a worse filter), down 0.2 dB: an upper quantile of what the
        filter leaves, so the loud frames of the residual stay under it; all of
        it while cold.
        """
        if cold:
            self.attenuation[:] = 1.0
            return
        if not far:
            return
        echo_bands = np.add.reduceat(echo, _STARTS)
        noise_bands = np.add.reduceat(self.noise, _STARTS)
        measured = echo_bands > MEASURED * noise_bands
        # What the filter leaves, the room's noise taken out.
        ratio = (np.add.reduceat(error, _STARTS) - noise_bands) / (echo_bands + 1e-12)
        ratio = np.clip(ratio, ATTENUATION_FLOOR, 1.0)
        attenuation = self.attenuation
        # Far more than the filter leaves: a user talking, not the echo.
        measured &= ratio <= JUMP * attenuation
        moved = np.where(
            ratio > attenuation,
            np.minimum(ratio, attenuation * RISE),
            np.maximum(ratio, attenuation * FALL),
        )
        self.attenuation = np.where(measured, moved, attenuation)
