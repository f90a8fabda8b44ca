"""The residual echo suppressor after the numpy canceller's linear filter.

``ResidualSuppressor.suppress`` compares each bin of the linear filter's output
with its *predicted residual echo*: the echo's power there (the filter's
estimate or the reference through the coherence path, whichever is larger,
spread over neighbouring bins and a reverberant tail; neither needs the filter
aligned to the sample) times the share the linear filter is known to leave (the
attenuation: all of it while cold, after the path moved, on a newly placed
stretch and the first echo after a silence; down to ~-25 dB as the filter shows
it). Bins no louder than their prediction fall to the room's noise, and a frame
with nothing beyond its prediction is the room's noise (so the onset gate never
opens on residual echo); a user louder than the residual passes in the frame
they start (no attack smoothing). The gain is applied as a 65-tap linear-phase
filter: 2 ms of latency, no block artefacts.
"""

from __future__ import annotations

import numpy as np

BLOCK = 160  # 10 ms at 16 kHz
_FFT = 2 * BLOCK
_BINS = BLOCK + 1
_GAIN_TAPS = 32  # the suppression filter's half length (2 ms)
OVER = 2.0
SPREAD_BINS = 3  # the residual prediction covers this many neighbouring bins
SPREAD_GAIN = 0.5  # at this share of their power
KEPT_SHARE = 0.1  # a frame with less than this beyond its residual is all echo
COLD_GAIN = 8.0  # echo power over the loudest reference, assumed while cold
TAIL_DECAY = 0.7  # per frame: the residual prediction's reverberant tail
ATTENUATION_FLOOR = 0.003  # the linear filter never leaves less than this
RISE = 10 ** (0.5 / 10)  # the attenuation's rise per frame (0.5 dB)
FALL = 10 ** (-0.5 / 10)  # and its fall (0.5 dB)
JUMP = 4.0  # error this far over the prediction is near-end speech
ONSET_FRAMES = 20  # after a far-end onset, the device's latency and the first echo
ONSET_QUIET = 40  # far-end silence before an onset (a new sentence, not a word)


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
        self.attenuation = 1.0  # share of the echo the linear filter leaves
        self._new_stretch = False  # the next frame starts a newly placed stretch
        self._far_quiet = 0  # frames since the far end last played
        self._onset_frames = 0  # frames left of a far-end onset after silence
        self._window: np.ndarray = np.hanning(2 * _GAIN_TAPS + 1)
        self._rows: np.ndarray = np.zeros((3, _FFT))
        self._last_e: np.ndarray = np.zeros(BLOCK)

    def new_stretch(self) -> None:
        """Take all of the echo as residual from the next frame on (a new placement)."""
        self._new_stretch = True

    def track_noise(self, power: np.ndarray) -> None:
        """Track the mic's noise floor per bin: down with quiet frames, creeping up.

        ``power``: the mic's [last d, d] power spectrum, while the far end is
        silent (the echo is no floor to keep).
        """
        # The [0, e] spectra the suppressor compares against hold half the power.
        half = 0.5 * power
        self.noise = np.where(
            half < self.noise, 0.7 * self.noise + 0.3 * half, self.noise * 1.002
        )

    def pass_through(self, ef: np.ndarray) -> None:
        """Note a frame the suppressor did not see (it needs the last output)."""
        self._last_e = ef

    def suppress(
        self,
        ef: np.ndarray,
        yf: np.ndarray,
        *,
        coarse: np.ndarray,
        loudest: np.ndarray,
        leak: float,
        cold: bool,
        far: bool,
        worse: bool,
    ) -> np.ndarray:
        """Attenuate each bin of ``ef`` by its predicted residual echo, instantly.

        ``yf``: the filter's echo estimate; ``coarse``: the echo's power per bin
        through the coherence path; ``loudest``: the loudest reference power per
        bin over the filter's span (the echo's bound while ``cold``); ``leak``: the
        share of the estimate's power the error holds; ``worse``: the path moved.
        """
        rows = self._rows  # [last e, e], [0, yf], [0, e]
        rows[0, :BLOCK] = self._last_e
        rows[0, BLOCK:] = ef
        rows[1, BLOCK:] = yf
        rows[2, BLOCK:] = ef
        self._last_e = ef
        spectrum, big_yf, big_ef = np.fft.rfft(rows, axis=1)
        echo = big_yf.real**2 + big_yf.imag**2
        error = big_ef.real**2 + big_ef.imag**2
        envelope = np.maximum(echo, coarse)
        if cold:
            # No path learnt yet: any delay of the filter's span, at a
            # conservative gain (the echo may be louder than the reference).
            envelope = np.maximum(envelope, COLD_GAIN * loudest)
        # Spread over neighbouring bins: a bin the estimate misses (a weak
        # reference there, the speaker's distortion) is covered by its neighbours.
        spread = envelope.copy()
        for k in range(1, SPREAD_BINS + 1):
            np.maximum(spread[k:], SPREAD_GAIN * envelope[:-k], out=spread[k:])
            np.maximum(spread[:-k], SPREAD_GAIN * envelope[k:], out=spread[:-k])
        self._envelope = np.maximum(spread, TAIL_DECAY * self._envelope)
        self._track_attenuation(
            float(error.sum()), float(echo.sum()), far=far, worse=worse, cold=cold
        )
        residual = self.attenuation * self._envelope
        residual = np.maximum(residual, leak * echo)
        self.residual = residual
        gain = 1.0 - self._over * residual / (error + 1e-12)
        # Never below the room's own noise: the onset gate's floor stays the room's.
        floor = np.sqrt(self.noise / (error + 1e-12))
        gain = np.clip(gain, np.maximum(self._min_gain, np.minimum(floor, 1.0)), 1.0)
        # The gain as a short linear-phase filter: 2 ms late, no block artefacts.
        taps = np.fft.irfft(gain, n=_FFT)
        taps = np.concatenate([taps[-_GAIN_TAPS:], taps[: _GAIN_TAPS + 1]])
        taps *= self._window
        response = np.fft.rfft(taps, n=_FFT)
        out = np.fft.irfft(spectrum * response, n=_FFT)[BLOCK:]
        # What the frame holds beyond the predicted residual: nothing (all echo)
        # leaves the room's noise, not the filter's leakage between bins.
        kept = float(np.sum(np.maximum(0.0, error - self._over * residual)))
        noise = float(self.noise.sum())
        if kept <= noise + KEPT_SHARE * float(residual.sum()):
            level = float(np.dot(out, out)) * _FFT / 2 + 1e-12
            if level > noise:
                out = out * np.sqrt(noise / level)
        return out

    def _track_attenuation(
        self, error: float, echo: float, *, far: bool, worse: bool, cold: bool
    ) -> None:
        """Follow the share of the echo the linear filter leaves (frame power ratio).

        Up at most ``RISE`` a frame, and only while the error stays within ``JUMP``
        of the prediction (a user talking raises the ratio far more at once: that
        is near end, not a worse filter), down slowly; all of it while cold, after
        the path moved, or on a newly placed stretch of far end (``new_stretch``).
        """
        if far and self._far_quiet >= ONSET_QUIET:
            self._onset_frames = ONSET_FRAMES
        self._far_quiet = 0 if far else self._far_quiet + 1
        if cold or worse or self._new_stretch:
            self.attenuation = 1.0
            self._new_stretch = False
            return
        if not far and not self._onset_frames:
            return
        if echo <= 4 * float(self.noise.sum()):
            return
        ratio = min(1.0, max(ATTENUATION_FLOOR, error / (echo + 1e-12)))
        if self._onset_frames:
            # The first echo after a silence is not cancelled as well as the
            # steady echo (measured: 10-15 dB less for ~50 ms), however well
            # placed: until the device's latency has passed, what is left counts.
            self._onset_frames -= 1
            if ratio > self.attenuation:
                self.attenuation = ratio
                return
        if ratio > JUMP * self.attenuation:
            return  # far more than the filter leaves: a user talking, not the echo
        if ratio > self.attenuation:
            self.attenuation = min(ratio, self.attenuation * RISE)
        else:
            self.attenuation = max(ratio, self.attenuation * FALL)
