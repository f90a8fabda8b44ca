"""Our own echo canceller in numpy: runs wherever Home Assistant runs (musl included).

``FdafCanceller`` cancels the echo of a far-end reference in a mic signal, 10 ms at a
time (16 kHz, 160 samples). It is the multidelay block frequency-domain adaptive
filter (MDF, Soo & Pang 1990) as Speex runs it, in numpy:

- **Partitioned filter**: ``filter_ms`` of echo path in 10 ms partitions (overlap-save,
  FFT of 320), long enough for the device's own output latency plus the room's
  reverberation at a mic a few cm from the speaker.
- **Double-talk-robust step**: the step of each bin is the ratio of the *residual
  echo* to the error in that bin (Valin 2007, "On adjusting the learning rate in
  frequency domain echo cancellation with double-talk"), the residual estimated from
  the leakage of the echo estimate into the error. When the user talks the error
  grows and the step shrinks by itself; no double-talk detector decides. Before the
  filter has converged the step follows the far-end-to-error ratio.
- **Two filters**: the adaptive (background) filter learns, the foreground filter
  cancels. The foreground takes the background's taps when they cancel better; a
  background that cancels much worse than the foreground for a while (it diverged
  in double talk) is reset to the foreground's.
- **Drift**: playback and capture run on separate crystals, so the echo slides
  against the reference by tens of µs per second. The filter never stops learning
  while the far end plays, and the step rises with the residual (a slid path leaves
  more), so it follows the slide.
- **New stretches** (``align.py``): each new stretch of answer is placed on the
  mic's time line a few ms off the last one; on its first frames of echo the
  offset is measured (the mic against the filter's own estimate) and both filters
  are moved by it, so the filter cancels as before instead of relearning for
  seconds. Meanwhile all of the echo is taken as residual. A filter that makes a
  loud mic clearly louder for five frames in a row is aligned the same way.
- **Residual echo suppression** (``residual.py``): what the linear filter leaves is
  predicted per bin and suppressed, so the onset gate never opens on it, while a
  user louder than it passes in the frame they start.
- **No echo, no harm**: when the filter finds no echo path (a board that cancels its
  own echo), ``echo_found`` stays False and the mic passes through untouched.

Blocking, ~0.4–0.6 ms of CPU per 10 ms frame (docs/benchmarks.md, "Echo
cancellation in real rooms"): run it on the stream's DSP worker. numpy's cost at
320 points is per call, not per element: the code batches rows into one call.
"""

from __future__ import annotations

import numpy as np

from .align import Alignment, StretchAligner, shift_taps
from .residual import ATTENUATION_FLOOR, ResidualSuppressor

BLOCK = 160  # 10 ms at 16 kHz
_FFT = 2 * BLOCK
_BINS = BLOCK + 1
_INT16 = 32768.0
_GAIN_DELAY = 32  # samples: the suppression filter's latency (2 ms)
_LOW_BINS = 81  # bins below 4 kHz: the drift's phase slope without wrapping
POWER_ALPHA = 0.35 / 30
STEP_SCALE = 0.99
CONSTRAIN_TURNS = 4
COARSE_SCALE = 0.3
COHERENCE_ALPHA = 0.02  # the coherence's smoothing per frame of far end
COHERENCE_EVERY = 4  # frames of far end between its transfer functions
TURN_EVERY = 4  # frames between turns of the filters by the drift
# The coherence path's echo power counted by the residual suppressor: it spreads
# each partition's echo over its neighbours (speech is alike from one 10 ms to
# the next), so it overstates the echo by ~8 dB; this share of it is the
# suppressor's safety net where the filter's own estimate falls short.
COARSE_SHARE = 0.45
MOVED = 5  # frames the filter made the mic clearly louder: its path moved
LOUD = 1e-5  # a mic frame this loud (power, -50 dBFS) holds more than noise


class FdafCanceller:
    """Echo canceller state for one stream (float samples in int16 scale)."""

    def __init__(
        self,
        *,
        filter_ms: int = 300,
        suppress: bool = True,
        min_gain_db: float = -40.0,
        over_suppress: float = 2.0,
        no_echo_db: float = -45.0,
    ) -> None:
        """Cover ``filter_ms`` of echo path; suppress residual echo down to ``min_gain_db``.

        ``no_echo_db``: an echo path weaker than this (echo over reference energy)
        counts as none: the mic then passes through.
        """
        self.partitions = max(1, filter_ms // 10)
        p = self.partitions
        self._x: np.ndarray = np.zeros(
            (2 * p, _BINS), dtype=np.complex128
        )  # spectra, doubled
        self._head = 0
        # Both filters in one array (one multiply filters with both): the
        # background (learning) and the foreground (cancelling), as views.
        self._filters: np.ndarray = np.zeros((2, p, _BINS), dtype=np.complex128)
        self._w: np.ndarray = self._filters[0]
        self._wf: np.ndarray = self._filters[1]
        self._last_x: np.ndarray = np.zeros(BLOCK)
        self._last_d: np.ndarray = np.zeros(BLOCK)
        self._cross: np.ndarray = np.zeros(
            (p, _BINS), dtype=np.complex128
        )  # mic x reference
        self._mic_power: np.ndarray = np.zeros(_BINS)
        # Per frame of reference, doubled like the spectra: its conjugate, its
        # power, and its power smoothed over time (the coherence's denominator).
        self._xc: np.ndarray = np.zeros((2 * p, _BINS), dtype=np.complex128)
        self._xx: np.ndarray = np.zeros((2 * p, _BINS))
        self._xs: np.ndarray = np.zeros((2 * p, _BINS))
        self._smoothed: np.ndarray = np.zeros(_BINS)
        self._coarse: np.ndarray = np.zeros(_BINS)  # echo power now, from coherence
        self._gain: np.ndarray = np.zeros((p, _BINS))
        self._far_frames = 0
        self._decide_frames = 300
        self.coherence = 0.0
        self._coherent_frames = 0
        self._coherence_frames = 0  # frames of far end the coherence has seen
        self._ratio = 1.0
        self._ratio_block = 1.0
        self._ratio_mins: list[float] = []
        self.residual_ratio = 1.0
        self._worse = 0  # recent frames the filter made louder than the mic
        self._moved = 0  # frames in a row it made a loud mic clearly louder
        self.drift = 0.0  # samples per second the echo path slides (estimate)
        self._snapshot: np.ndarray | None = None
        self._rotation: np.ndarray = np.ones(_BINS, dtype=np.complex128)
        self._drift_turn = False
        self._power: np.ndarray = np.full(_BINS, 1.0)  # smoothed far-end power per bin
        self._suppress = suppress
        self.suppressor = ResidualSuppressor(
            min_gain_db=min_gain_db, over_suppress=over_suppress
        )
        self._no_echo = 10 ** (no_echo_db / 10)
        # Leakage of the echo estimate into the error (Valin): Pey / Pyy.
        self._pey = 0.0
        self._pyy = 1.0
        self.leak = 0.5
        self._adapt_sum = 0.0
        self.adapted = False
        # Foreground/background error energies (smoothed) and the divergence count.
        self._sbg = 0.0
        self._sfg = 0.0
        self._diverged = 0
        # Echo path strength: echo estimate vs far-end energy, while the far end plays.
        self._echo_energy = 0.0
        self._far_energy = 0.0
        # None until decided: True once the mic holds a coherent echo of the far
        # end, False after ``_decide_frames`` of far end without one (pass through).
        self.echo_found: bool | None = None
        self.aligner = StretchAligner()
        # The attenuation before the stretch (or move) to align.
        self._trusted: np.ndarray = self.suppressor.attenuation.copy()
        self._pair: np.ndarray = np.zeros((2, _FFT))
        self._rows: np.ndarray = np.zeros((5, _FFT))
        self._last_out: np.ndarray = np.zeros(BLOCK)  # the last, before suppression
        self._silent_run = 0  # frames since the reference last held sound
        self.frames = 0
        self._turn = 0  # frames since the filter was last constrained
        self._weights: np.ndarray = np.full(self.partitions, 0.99 / self.partitions)

    @property
    def echo_return_db(self) -> float | None:
        """Echo path strength learned so far (dB, echo over reference); None: no far end."""
        if self._far_energy <= 0:
            return None
        return 10 * float(np.log10(max(self._echo_energy, 1e-12) / self._far_energy))

    def process(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Return 10 ms of mic with the echo of ``reference`` removed."""
        self.frames += 1
        d = mic / _INT16
        x = reference / _INT16
        p = self.partitions
        self._head = (self._head - 1) % p
        # One FFT call per stage, rows stacked (numpy's per-call cost dominates).
        pair = self._pair
        pair[0, :BLOCK] = self._last_x
        pair[0, BLOCK:] = x
        pair[1, :BLOCK] = self._last_d
        pair[1, BLOCK:] = d
        spectrum, mic_spectrum = np.fft.rfft(pair, axis=1)
        self._last_d = d
        head = self._head
        self._x[head] = self._x[head + p] = spectrum
        self._xc[head] = self._xc[head + p] = spectrum.conj()
        xx = spectrum.real**2 + spectrum.imag**2
        self._xx[head] = self._xx[head + p] = xx
        self._last_x = x
        window = self._x[head : head + p]  # newest partition first
        sxx = float(np.dot(x, x))
        far = sxx > BLOCK * 1e-7
        self._silent_run = 0 if far else self._silent_run + 1
        if (
            self._silent_run > p  # the filter's whole span holds no reference
            and not self._worse
            and not self.aligner.active
            and self.suppressor.quiet()
        ):
            return self._without_echo(mic, d, mic_spectrum, xx)

        filtered = (self._filters * window).sum(axis=1)
        y, yf = np.fft.irfft(filtered, n=_FFT, axis=1)[:, BLOCK:]
        e = d - y
        ef = d - yf
        see = float(np.dot(e, e))
        sff = float(np.dot(ef, ef))
        syy = float(np.dot(y, y))
        aligning = self.aligner.active
        if aligning:
            found = self.aligner.feed(d, yf, floor=BLOCK * 1e-6)
            if found is not None:
                self._realign(found)
            elif not self.aligner.active:  # no clear offset: learn what it leaves
                self.suppressor.attenuation[:] = 1.0
        learn = far and not aligning  # a filter being aligned keeps its taps
        if learn:
            self._two_paths(see, sff, sxx)

        out = ef
        worse = False
        if far or self._worse:
            # Never louder than the mic: a path that moved (a new stretch of
            # reference placed a few ms off) would add the reference, not remove it.
            sdd = float(np.dot(d, d))
            worse = sff > sdd and self.echo_found is not False
            self._worse = self._worse + 1 if worse else max(0, self._worse - 1)
            # Clearly louder than a loud mic, frame after frame: the path moved
            # (a stretch nobody announced). Not the filter's own noise where the
            # echo pauses (a quiet mic), nor a user (who raises the mic too).
            clearly = sff > 2 * sdd and sdd > BLOCK * LOUD
            self._moved = self._moved + 1 if clearly else 0
            if self._moved >= MOVED:
                self._align()
            if worse:
                out = d

        # One FFT call for the learning ([0, e], [0, y]) and the suppressor
        # ([last out, out], [0, yf], [0, out]).
        rows = self._rows
        rows[0, BLOCK:] = e
        rows[1, BLOCK:] = y
        rows[2, :BLOCK] = self._last_out
        rows[2, BLOCK:] = out
        rows[3, BLOCK:] = yf
        rows[4, BLOCK:] = out
        self._last_out = out
        big_e, big_y, out_spectrum, big_yf, big_out = np.fft.rfft(rows, axis=1)

        # Learning: the background filter.
        ee = big_e.real**2 + big_e.imag**2
        yy = big_y.real**2 + big_y.imag**2
        self._power += POWER_ALPHA * (xx - self._power)
        conj = self._xc[head : head + p]
        if learn:  # the far end plays: learn
            step = self._step(e, y, ee, yy, see=see, syy=syy, sxx=sxx)
            self._far_frames += 1
            if self.frames % 4 == 1:
                self._weights = self._proportions()
            scaled = big_e * step / (self._power + 1e-9)
            update = conj * scaled
            update *= self._weights[:, None]
            self._w += update
            self._constrain()
            self._far_energy += sxx
            self._echo_energy += float(np.dot(yf, yf))
        if far:
            self._smoothed += COHERENCE_ALPHA * (xx - self._smoothed)
        self._xs[head] = self._xs[head + p] = self._smoothed
        self._coarse_echo(conj, mic_spectrum, sff, learn=far)

        if self._suppress and self.echo_found is not False:
            cold = not self.adapted or self.echo_found is not True
            out = self.suppressor.suppress(
                out_spectrum,
                big_yf,
                big_out,
                coarse=self._coarse * (COARSE_SHARE / COARSE_SCALE),
                loudest=self._loudest if cold else None,
                leak=self.leak,
                cold=cold,
                far=far,
                # This frame's output is not the filter's (it made it louder),
                # or the filter is off its path until aligned: all of it is echo.
                distrust=worse or self.aligner.active,
            )
        if not self.echo_found and self.coherence <= 0.3:
            return mic.copy()  # no echo here (yet): the mic as it came
        self._track_drift()
        return np.asarray(out * _INT16, dtype=np.float64)

    def _without_echo(
        self, mic: np.ndarray, d: np.ndarray, mic_spectrum: np.ndarray, xx: np.ndarray
    ) -> np.ndarray:
        """Pass a frame with no reference in the filter's span: no echo, nothing to learn.

        The filter's estimate is exactly zero, so the mic passes (2 ms late, as
        through the suppressor with nothing to suppress); the noise floor and
        the drift's turns go on. Most of a conversation is this (the user
        talking, the model thinking): it costs a fraction of a frame with echo.
        """
        head, p = self._head, self.partitions
        self._power += POWER_ALPHA * (xx - self._power)
        self._xs[head] = self._xs[head + p] = self._smoothed
        self.suppressor.track_noise(mic_spectrum.real**2 + mic_spectrum.imag**2)
        self.suppressor.decay()
        self._coarse[:] = 0.0
        late = np.concatenate([self._last_out[BLOCK - _GAIN_DELAY :], d[:-_GAIN_DELAY]])
        self._last_out = d
        self._track_drift()
        if not self.echo_found and self.coherence <= 0.3:
            return mic.copy()  # no echo here (yet): the mic as it came
        if not self._suppress or self.echo_found is False:
            return mic.copy()
        return np.asarray(late * _INT16, dtype=np.float64)

    def _track_drift(self) -> None:
        """Follow the echo path sliding against the reference (two crystals).

        Every second, the foreground filter's phase against its copy of a second
        ago gives the slide in samples (the phase slope over the bins below 4 kHz,
        weighted by the filter's energy); its smoothed rate then turns both filters
        a little every ``TURN_EVERY`` frames (hundredths of a sample), so the
        learning only has to fix what is left.
        """
        if self._drift_turn and self.frames % TURN_EVERY == 0:
            self._filters *= self._rotation
        if self.frames % 100 or not self.echo_found:
            return
        snapshot = self._wf.copy()
        if self._snapshot is not None:
            cross = (snapshot * self._snapshot.conj()).sum(axis=0)[1:_LOW_BINS]
            weight = np.abs(cross)
            omega = np.pi * np.arange(1, _LOW_BINS) / BLOCK
            phase = np.angle(cross)
            slide = -float(np.sum(weight * omega * phase))
            slide /= float(np.sum(weight * omega**2)) + 1e-12  # samples per second
            # The filters moved by the turning plus what learning added to it.
            self.drift += 0.5 * (float(np.clip(slide, -2.0, 2.0)) - self.drift)
            per_turn = self.drift / 100 * TURN_EVERY
            self._rotation = np.exp(-1j * np.pi * np.arange(_BINS) / BLOCK * per_turn)
            self._drift_turn = True
        self._snapshot = snapshot

    def _coarse_echo(
        self, conj: np.ndarray, mic_spectrum: np.ndarray, sff: float, *, learn: bool
    ) -> None:
        """Echo power the mic holds now, from its coherence with the reference.

        Per partition (delay) the cross-spectrum of mic and reference over its power
        is a transfer function that needs no convergence: a user talking at the
        same time is not correlated with the reference and averages out. Its
        strongest partition says whether an echo reaches the mic at all
        (``echo_found``) and, scaled by what the linear filter leaves
        (``residual_ratio``), bounds the residual echo while the filter learns.
        The transfer function changes slowly: it is worked out every
        ``COHERENCE_EVERY`` frames of far end, its echo estimate every frame.
        """
        head, p = self._head, self.partitions
        xx = self._xx[head : head + p]
        if not learn:
            self._coarse = (self._gain * xx).sum(axis=0) * COARSE_SCALE  # the tail
            self.suppressor.track_noise(mic_spectrum.real**2 + mic_spectrum.imag**2)
            return
        a = COHERENCE_ALPHA
        self._coherence_frames += 1
        if self._coherence_frames % 2 == 0:  # every other frame, twice the step
            cross = self._cross
            cross *= 1.0 - 2 * a
            cross += conj * (2 * a * mic_spectrum)
        mic_power = mic_spectrum.real**2 + mic_spectrum.imag**2
        self._mic_power += a * (mic_power - self._mic_power)
        if self._coherence_frames % COHERENCE_EVERY == 0:
            cross = self._cross
            xpow = self._xs[head : head + p]
            power = cross.real**2 + cross.imag**2
            self._gain = power / (xpow**2 + 1e-12)  # |H|^2 per partition and bin
            # Coherent share of the mic's power (the strongest partition).
            share = float((power / (xpow + 1e-12)).max(axis=0).sum())
            share /= float(self._mic_power.sum()) + 1e-12
            self.coherence = share
            coherent = self._coherent_frames + COHERENCE_EVERY
            self._coherent_frames = coherent if share > 0.3 else 0
            if self._coherent_frames >= 50:
                self.echo_found = True
            elif self.echo_found is None and self._far_frames >= self._decide_frames:
                self.echo_found = False  # seconds of far end, never an echo: none
        self._coarse = (self._gain * xx).sum(axis=0) * COARSE_SCALE
        # What the linear filter leaves of the mic: the minimum of its smoothed
        # ratio over 2 s (the user only ever raises it).
        smm = float(mic_power.sum()) / _FFT + 1e-12
        self._ratio += 0.3 * (min(1.0, 2 * sff / smm) - self._ratio)
        self._ratio_block = min(self._ratio_block, self._ratio)
        if self.frames % 50 == 0:
            self._ratio_mins = [*self._ratio_mins[-3:], self._ratio_block]
            self._ratio_block = 1.0
        self.residual_ratio = min([self._ratio_block, *self._ratio_mins])

    def _loudest(self) -> np.ndarray:
        """Return the loudest reference power per bin over the filter's span ([0, x])."""
        head, p = self._head, self.partitions
        return np.asarray(self._xx[head : head + p].max(axis=0) * 0.5)

    def new_stretch(self) -> None:
        """Say the reference from the next frame on was placed anew (a few ms off).

        The echo path learnt on the last stretch may be a few ms off it: the
        suppressor takes all of the echo as residual until the aligner has found
        the offset in the first frames of echo and moved the filters by it.
        """
        self._align()

    def _align(self) -> None:
        """Find the learnt path's offset in the frames to come, if there is a path."""
        if not self.adapted or self.echo_found is not True or self.aligner.active:
            return
        self._trusted = self.suppressor.attenuation.copy()
        self.aligner.start()

    def _realign(self, found: Alignment) -> None:
        """Move both filters by the offset found; trust them as before, or less."""
        if abs(found.lag) < 0.25:
            self.suppressor.attenuation = self._trusted.copy()  # nothing moved
            return
        self._w[:] = shift_taps(self._w, found.lag)
        self._wf[:] = shift_taps(self._wf, found.lag)
        self._snapshot = None  # the drift's reference: the filter moved
        self.suppressor.attenuation = np.clip(
            self._trusted, max(found.residual, ATTENUATION_FLOOR), 1.0
        )

    @property
    def learning(self) -> bool:
        """True while the far end has an echo here the filter does not cancel yet."""
        if self.echo_found is None:  # undecided: learning only if it hears echo
            return self.coherence > 0.3
        if self._suppress:  # the suppressor holds back what the filter leaves
            return False
        return self.echo_found and self.residual_ratio > 0.1

    def _constrain(self) -> None:
        """Keep the partitions causal and one block long, every fourth frame.

        The gradient constraint of the overlap-save filter, as often for each
        partition as Speex's AUMDF (which does a quarter every frame), all at once:
        numpy's cost is per call, not per row.
        """
        self._turn = (self._turn + 1) % CONSTRAIN_TURNS
        if self._turn:
            return
        taps = np.fft.irfft(self._w, n=_FFT, axis=1)
        taps[:, BLOCK:] = 0.0
        self._w[:] = np.fft.rfft(taps, axis=1)

    def _proportions(self) -> np.ndarray:
        """Share the step among partitions by their weight (proportionate MDF).

        The direct path a few cm from the speaker holds most of the echo: its
        partitions learn fastest, the tail's slowly (Speex's mdf_adjust_prop).
        """
        w = self._w
        energy = np.sqrt((w.real**2 + w.imag**2).sum(axis=1) + 1.0)
        energy += 0.1 * energy.max() + 1e-6
        # Before the filter holds the path, the reference's coherence with the mic
        # says which partitions hold the echo (the device's latency): learn there.
        cross = self._cross
        coherence = (cross.real**2 + cross.imag**2).sum(axis=1)
        coherence /= float(np.dot(self._mic_power, self._power)) + 1e-12
        coherence += 0.1 * coherence.max() + 1e-12
        mix = 0.5 * energy / energy.sum() + 0.5 * coherence / coherence.sum()
        return np.asarray(STEP_SCALE * mix, dtype=np.float64)

    def _two_paths(self, see: float, sff: float, sxx: float) -> None:
        """Copy the background filter when it cancels better; reset it when diverged."""
        self._sbg += 0.3 * (see - self._sbg)
        self._sfg += 0.3 * (sff - self._sfg)
        if sxx <= BLOCK * 1e-7:
            return
        if self._sbg < 0.8 * self._sfg or not self.adapted:
            self._wf[:] = self._w
            self._sfg = self._sbg
            self._diverged = 0
        elif self._sbg > 4.0 * self._sfg:
            self._diverged += 1
            if self._diverged >= 5:
                self._w[:] = self._wf
                self._sbg = self._sfg
                self._diverged = 0
        else:
            self._diverged = 0

    def _step(
        self,
        e: np.ndarray,
        y: np.ndarray,
        ee: np.ndarray,
        yy: np.ndarray,
        *,
        see: float,
        syy: float,
        sxx: float,
    ) -> np.ndarray:
        """Per-bin step (residual echo over error): small in double talk, by itself."""
        # Leakage: how much of the echo estimate's power shows up in the error.
        de = ee - ee.mean()
        dy = yy - yy.mean()
        beta = 0.05 * min(1.0, syy / (syy + see + 1e-12) * 2)
        self._pey += beta * (float(np.dot(de, dy)) - self._pey)
        self._pyy += beta * (float(np.dot(dy, dy)) - self._pyy)
        self._pyy = max(self._pyy, 1e-12)
        self._pey = max(self._pey, 0.005 * self._pyy)
        self.leak = min(1.0, self._pey / self._pyy)
        if not self.adapted:
            rate = min(0.5 * sxx, 0.5 * see) / (see + 1e-12)
            self._adapt_sum += rate
            if self._adapt_sum > self.partitions:
                self.adapted = True
            return np.full(_BINS, rate)
        sey = float(np.dot(e, y))
        rer = (1e-4 * sxx + 3.0 * self.leak * syy) / (see + 1e-12)
        rer = min(0.5, max(rer, sey * sey / (1e-12 + see * syy)))
        residual = np.minimum(self.leak * yy, ee)
        residual = 0.7 * residual + 0.3 * rer * ee
        return np.asarray(residual / (ee + 1e-9), dtype=np.float64)
