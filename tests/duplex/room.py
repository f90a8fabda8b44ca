"""A room that behaves like one: image-source echo, a small speaker, two clocks, a TV.

``RoomSpec`` describes one condition of the grid (issue 19 §1): a shoebox of
10–40 m² with an RT60 of 0.2–0.8 s, the device's speaker 3–10 cm from its mic, the
user 0.5–3 m away, a background source, and the echo-to-user ratio at the mic
(−10…+15 dB). ``RealRoom`` is a drop-in for ``echo_sim.Room`` (``mic_step(played,
user)``): what the device plays goes through

- the small speaker: a band limit (2nd-order high-pass at ~250 Hz, low-pass at ~6 kHz)
  and soft clipping that rises with the volume;
- the playback clock, ``skew_ppm`` off the capture clock (independent crystals): the
  echo slides against the reference by ``skew_ppm`` µs per second;
- the device's own output latency (``device_delay_ms``, unknown to the server);
- the room impulse response from the speaker to the mic;

and the user's speech and the background through their own impulse responses.
Impulse responses come from ``pyroomacoustics`` (image-source method, the absorption
from Sabine's formula for the RT60), seeded by the spec and cached per spec on disk,
so a grid run pays for each room once. Background sources are generated (espeak-ng
speech through a TV's band, synthetic music, kitchen clatter and water): nothing
is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import functools
import hashlib
import os
from pathlib import Path
import tempfile

import numpy as np

from custom_components.rtvoice.duplex.audio import SAMPLE_RATE

STEP = 160  # 10 ms
_CACHE = Path(
    os.environ.get("RTVOICE_ROOM_CACHE", Path(tempfile.gettempdir()) / "rtvoice-rooms")
)
_ECHO_DBFS = -14.0  # echo RMS at the mic for speech played at -20 dBFS, full volume
TV_LINES = (
    "Good evening and welcome to the news at six.",
    "The weather tomorrow will be cloudy with a chance of rain in the north.",
    "And now, the sports results from this afternoon's matches.",
    "Scientists say the new bridge will open to traffic next spring.",
)


@dataclass(frozen=True)
class RoomSpec:
    """One room condition. Seeded: the same spec gives the same room and sources."""

    seed: int = 0
    rt60_s: float = 0.4
    area_m2: float = 20.0
    speaker_mic_m: float = 0.05
    user_m: float = 1.5
    echo_to_user_db: float = 0.0  # echo level over the user's level, at the mic
    volume: float = 0.7  # 0..1: loudness and the speaker's distortion
    skew_ppm: float = 0.0  # playback clock minus capture clock
    device_delay_ms: float = 40.0  # the device's own output latency
    background: str | None = None  # "tv", "music", "kitchen"
    background_db: float = -10.0  # background level against the user's, at the mic
    noise_dbfs: float = -70.0  # mic self-noise
    echo: bool = True  # False: a board that cancels its own echo (none reaches here)

    def geometry(self) -> dict[str, list[float]]:
        """Room dimensions and positions (m), seeded."""
        rng = np.random.default_rng(self.seed)
        aspect = rng.uniform(1.0, 1.6)
        width = float(np.sqrt(self.area_m2 / aspect))
        length = float(self.area_m2 / width)
        height = float(rng.uniform(2.4, 2.8))
        device = [
            float(rng.uniform(0.3, 0.6)),
            float(rng.uniform(0.3 * width, 0.7 * width)),
            float(rng.uniform(0.7, 1.1)),
        ]
        angle = rng.uniform(0, 2 * np.pi)
        mic = [
            device[0] + self.speaker_mic_m * 0.3,
            device[1] + self.speaker_mic_m * float(np.cos(angle)) * 0.95,
            device[2] + self.speaker_mic_m * 0.1,
        ]
        # The user in front of the device, ``user_m`` away, head height.
        spread = rng.uniform(-0.6, 0.6)
        distance = min(self.user_m, length - device[0] - 0.3)
        user = [
            device[0] + distance * float(np.cos(spread)),
            float(np.clip(device[1] + distance * np.sin(spread), 0.3, width - 0.3)),
            float(rng.uniform(1.1, 1.7)),
        ]
        source = [
            float(rng.uniform(0.5 * length, length - 0.3)),
            float(rng.uniform(0.2 * width, 0.8 * width)),
            float(rng.uniform(0.5, 1.2)),
        ]
        return {
            "dims": [length, width, height],
            "speaker": device,
            "mic": mic,
            "user": user,
            "background": source,
        }


def _key(spec: RoomSpec) -> str:
    room = (spec.seed, spec.rt60_s, spec.area_m2, spec.speaker_mic_m, spec.user_m)
    return hashlib.sha256(repr(room).encode()).hexdigest()[:20]


@functools.cache
def impulse_responses(spec: RoomSpec) -> dict[str, np.ndarray]:
    """Speaker, user and background → mic impulse responses (cached on disk)."""
    path = _CACHE / f"rir-{_key(spec)}.npz"
    if path.exists():
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    import pyroomacoustics as pra  # noqa: PLC0415 - test-only, slow import

    geometry = spec.geometry()
    absorption, max_order = pra.inverse_sabine(spec.rt60_s, geometry["dims"])
    room = pra.ShoeBox(
        geometry["dims"],
        fs=SAMPLE_RATE,
        materials=pra.Material(absorption),
        max_order=min(max_order, 120),
    )
    for name in ("speaker", "user", "background"):
        room.add_source(geometry[name])
    room.add_microphone(geometry["mic"])
    room.compute_rir()
    rirs = {
        name: np.asarray(room.rir[0][i], dtype=np.float64)
        for i, name in enumerate(("speaker", "user", "background"))
    }
    _CACHE.mkdir(parents=True, exist_ok=True)
    partial = _CACHE / f"rir-{_key(spec)}.{os.getpid()}.part.npz"
    np.savez(partial, **rirs)
    partial.replace(path)
    return rirs


def measured_rt60(rir: np.ndarray) -> float:
    """RT60 from the Schroeder decay (T20: −5 to −25 dB, extrapolated)."""
    energy = np.cumsum(rir[::-1] ** 2)[::-1]
    decay = 10 * np.log10(energy / energy[0] + 1e-30)
    start = np.argmax(decay <= -5)
    end = np.argmax(decay <= -25)
    return 3.0 * (end - start) / SAMPLE_RATE


class StreamConvolver:
    """Convolution with a long impulse response, 10 ms at a time (uniform partitions)."""

    def __init__(self, ir: np.ndarray) -> None:
        """Split ``ir`` into 10 ms partitions, in the frequency domain."""
        parts = max(1, -(-len(ir) // STEP))
        padded = np.zeros(parts * STEP)
        padded[: len(ir)] = ir
        blocks = padded.reshape(parts, STEP)
        self._h = np.fft.rfft(blocks, n=2 * STEP, axis=1)
        self._parts = parts
        # Input spectra twice over, so the newest-first window is one slice.
        self._x = np.zeros((2 * parts, STEP + 1), dtype=complex)
        self._head = 0
        self._last = np.zeros(STEP)

    def step(self, block: np.ndarray) -> np.ndarray:
        """Return the next 10 ms of output for the next 10 ms of input."""
        self._head = (self._head - 1) % self._parts
        spectrum = np.fft.rfft(np.concatenate([self._last, block]))
        self._x[self._head] = self._x[self._head + self._parts] = spectrum
        self._last = block
        window = self._x[self._head : self._head + self._parts]
        out = np.fft.irfft(np.einsum("pk,pk->k", window, self._h), n=2 * STEP)
        return out[STEP:]


def truncated(ir: np.ndarray, floor_db: float = -60.0) -> np.ndarray:
    """Cut an impulse response where what is left of its energy is ``floor_db`` down."""
    remaining = np.cumsum(ir[::-1] ** 2)[::-1]
    keep = np.nonzero(remaining > remaining[0] * 10 ** (floor_db / 10))[0]
    return ir[: int(keep[-1]) + 1] if len(keep) else ir


class SmallSpeaker:
    """A 40 mm speaker: band-limited, soft clipping that grows with the volume."""

    def __init__(self, volume: float) -> None:
        """Drive scales with the volume; past ~0.5 the cone compresses audibly."""
        self.gain = 10 ** ((volume - 1.0) * 20 / 20)  # 20 dB of volume range
        self.drive = 0.2 + 2.0 * volume**3  # soft clipping rises with the volume
        self._hp = _Biquad.highpass(250.0)
        self._lp = _Biquad.lowpass(6000.0)

    def step(self, played: np.ndarray) -> np.ndarray:
        """Return the sound pressure (mic-scaled) for 10 ms of samples (int16 scale)."""
        x = self._hp.step(played / 32768.0)
        x = np.tanh(self.drive * x) / self.drive  # peaks compress
        return self._lp.step(x) * 32768.0 * self.gain


class _Biquad:
    """A second-order IIR section (RBJ cookbook), 10 ms at a time."""

    def __init__(self, b: np.ndarray, a: np.ndarray) -> None:
        self.b, self.a = b / a[0], a / a[0]
        self.z = np.zeros(2)

    @classmethod
    def highpass(cls, f0: float, q: float = 0.707) -> _Biquad:
        w = 2 * np.pi * f0 / SAMPLE_RATE
        alpha, cos = np.sin(w) / (2 * q), np.cos(w)
        b = np.array([(1 + cos) / 2, -(1 + cos), (1 + cos) / 2])
        return cls(b, np.array([1 + alpha, -2 * cos, 1 - alpha]))

    @classmethod
    def lowpass(cls, f0: float, q: float = 0.707) -> _Biquad:
        w = 2 * np.pi * f0 / SAMPLE_RATE
        alpha, cos = np.sin(w) / (2 * q), np.cos(w)
        b = np.array([(1 - cos) / 2, 1 - cos, (1 - cos) / 2])
        return cls(b, np.array([1 + alpha, -2 * cos, 1 - alpha]))

    def step(self, x: np.ndarray) -> np.ndarray:
        from scipy.signal import lfilter  # noqa: PLC0415 - pyroomacoustics needs it

        out, self.z = lfilter(self.b, self.a, x, zi=self.z)
        return out


class SkewedClock:
    """Resamples the playback stream onto the capture clock (linear interpolation)."""

    def __init__(self, ppm: float, delay_samples: float) -> None:
        """Playback runs ``ppm`` fast; its sound reaches the mic ``delay`` samples late."""
        self.ratio = 1.0 + ppm * 1e-6
        self._buffer = np.zeros(int(delay_samples) + 4 * STEP)
        self._position = float(len(self._buffer) - int(delay_samples) - STEP)
        self._position -= delay_samples - int(delay_samples)

    def step(self, block: np.ndarray) -> np.ndarray:
        """Take 10 ms played, return the 10 ms the mic hears of the playback stream."""
        self._buffer = np.concatenate([self._buffer, block])
        positions = self._position + np.arange(STEP) * self.ratio
        self._position += STEP * self.ratio
        low = np.floor(positions).astype(int)
        frac = positions - low
        low = np.clip(low, 0, len(self._buffer) - 2)
        out = self._buffer[low] * (1 - frac) + self._buffer[low + 1] * frac
        drop = max(0, int(self._position) - 2 * STEP)
        if drop:
            self._buffer = self._buffer[drop:]
            self._position -= drop
        return out


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x**2))) if len(x) else 0.0


def _speech_rms(ir: np.ndarray) -> float:
    """RMS at the mic of unit-RMS white noise through ``ir`` (its energy gain)."""
    return float(np.sqrt(np.sum(ir**2)))


def _echo_level(volume: float, echo_ir: np.ndarray) -> float:
    """RMS at the mic of speech-like noise at -20 dBFS played through the speaker."""
    rng = np.random.default_rng(7)
    noise = _Biquad.lowpass(800.0, q=0.5).step(rng.standard_normal(2 * SAMPLE_RATE))
    noise *= 3277.0 / _rms(noise)
    speaker = SmallSpeaker(volume)
    sound = np.concatenate(
        [speaker.step(noise[i : i + STEP]) for i in range(0, len(noise), STEP)]
    )
    return _rms(np.convolve(sound, echo_ir)[: len(sound)][SAMPLE_RATE // 2 :])


class RealRoom:
    """What the device's mic hears, 10 ms at a time (the ``echo_sim.Room`` interface).

    ``echo_part``, ``user_part`` and ``background_part`` keep what each source
    contributed (float, int16 scale) so a benchmark can score ERLE and near-end
    distortion against the truth.
    """

    def __init__(self, spec: RoomSpec, *, background: np.ndarray | None = None) -> None:
        """Build the room; ``background``: its source signal (see ``background_signal``)."""
        self.spec = spec
        rirs = impulse_responses(spec)
        self.rng = np.random.default_rng(spec.seed + 1000)
        self._speaker = SmallSpeaker(spec.volume)
        self._clock = SkewedClock(
            spec.skew_ppm, spec.device_delay_ms * SAMPLE_RATE / 1000
        )
        speaker_ir = truncated(rirs["speaker"])
        # Scale: speech at -20 dBFS played at full volume is echo at _ECHO_DBFS.
        self._echo_ir = speaker_ir * (
            10 ** (_ECHO_DBFS / 20) / 0.1 / _speech_rms(speaker_ir)
        )
        # The user's level follows from the echo's level (measured with speech-like
        # noise through this speaker at this volume) and the ratio at the mic.
        echo_level = _echo_level(spec.volume, self._echo_ir)
        user_level = echo_level * 10 ** (-spec.echo_to_user_db / 20)
        user_ir = truncated(rirs["user"], -50.0)
        # Speech clips are ~-20 dBFS RMS while speaking: scale to user_level.
        self._user_ir = user_ir * (user_level / (3277.0 * _speech_rms(user_ir)))
        self._echo = StreamConvolver(self._echo_ir)
        self._user = StreamConvolver(self._user_ir)
        self._background_source = background
        self._background_at = 0
        self._background: StreamConvolver | None = None
        if background is not None:
            bg_ir = truncated(rirs["background"], -50.0)
            level = user_level * 10 ** (spec.background_db / 20)
            source_rms = _rms(background) or 1.0
            self._background = StreamConvolver(
                bg_ir * (level / (source_rms * _speech_rms(bg_ir)))
            )
        self.noise = 32768 * 10 ** (spec.noise_dbfs / 20)
        self.echo_part: list[np.ndarray] = []
        self.user_part: list[np.ndarray] = []
        self.background_part: list[np.ndarray] = []
        self.samples = 0

    @property
    def user_gain(self) -> float:
        """The user's speech gain at the mic (their IR's energy gain)."""
        return _speech_rms(self._user_ir)

    def mic_step(self, played: np.ndarray, user: np.ndarray | None = None) -> bytes:
        """Return the next 10 ms at the mic (s16le), given the 10 ms just played."""
        sound = self._speaker.step(played)
        sound = self._clock.step(sound)
        echo = self._echo.step(sound) if self.spec.echo else np.zeros(STEP)
        near = self._user.step(user if user is not None else np.zeros(STEP))
        background = np.zeros(STEP)
        if self._background is not None and self._background_source is not None:
            source = self._background_source
            index = np.arange(self._background_at, self._background_at + STEP)
            background = self._background.step(source[index % len(source)])
            self._background_at += STEP
        self.samples += STEP
        self.echo_part.append(echo)
        self.user_part.append(near)
        self.background_part.append(background)
        mic = echo + near + background + self.rng.standard_normal(STEP) * self.noise
        return np.clip(np.round(mic), -32768, 32767).astype("<i2").tobytes()


def background_signal(kind: str, seconds: float, *, seed: int = 0) -> np.ndarray:
    """Return a generated background source (float, int16 scale, ~-20 dBFS)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    if kind == "tv":
        from tests.peers.speech import speak  # noqa: PLC0415 - espeak-ng

        voices = ("en-us", "en-gb+m3", "en-us+f2", "en-gb")
        parts = []
        while sum(len(p) for p in parts) < n:
            i = len(parts)
            pcm = speak(TV_LINES[i % len(TV_LINES)], voice=voices[i % 4], lead_ms=0)
            parts.append(np.frombuffer(pcm[: -800 * 32], dtype="<i2").astype(float))
            parts.append(np.zeros(int(rng.uniform(0.05, 0.4) * SAMPLE_RATE)))
        speech = np.concatenate(parts)[:n]
        music = _music(t, rng) * 0.15  # a jingle under the speech
        signal = _Biquad.highpass(150.0).step(speech + music * _rms(speech))
    elif kind == "music":
        signal = _music(t, rng)
    elif kind == "kitchen":
        water = np.cumsum(rng.standard_normal(n)) * 0.02  # brown-ish noise
        water = _Biquad.highpass(300.0).step(water) + rng.standard_normal(n) * 0.3
        clatter = np.zeros(n)
        for start in rng.integers(0, n - 4000, size=int(seconds * 1.5)):
            length = int(rng.uniform(300, 3000))
            burst = rng.standard_normal(length) * np.exp(-np.arange(length) / 300)
            clatter[start : start + length] += burst * rng.uniform(2, 8)
        hum = 0.2 * np.sin(2 * np.pi * 100 * t)
        signal = water + clatter + hum
    else:
        raise ValueError(f"unknown background {kind!r}")
    return signal * (3277.0 / (_rms(signal) or 1.0))


def _music(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Chords changing every half second over a kick drum (synthetic)."""
    out = np.zeros_like(t)
    notes = 220 * 2 ** (rng.integers(0, 12, size=int(t[-1] * 2) + 2) / 12)
    beat = (t * 2).astype(int)
    for harmonic, weight in ((1, 1.0), (1.5, 0.5), (2, 0.3), (3, 0.15)):
        out += weight * np.sin(2 * np.pi * notes[beat] * harmonic * t)
    kick_phase = (t * 2) % 1
    out += 2.0 * np.sin(2 * np.pi * 60 * t) * np.exp(-kick_phase * 30)
    return out


def grid(
    ratios: tuple[float, ...] = (-10.0, 0.0, 5.0, 10.0, 15.0), *, rooms: int = 4
) -> list[RoomSpec]:
    """Seeded room conditions spanning §1's ranges, each at every echo-to-user ratio."""
    rng = np.random.default_rng(19)
    specs = []
    for seed in range(rooms):
        base = RoomSpec(
            seed=seed,
            rt60_s=float(np.round(0.2 + 0.6 * seed / max(1, rooms - 1), 2)),
            area_m2=float(np.round(rng.uniform(10, 40), 1)),
            speaker_mic_m=float(np.round(rng.uniform(0.03, 0.10), 3)),
            user_m=float(np.round(rng.uniform(0.5, 3.0), 2)),
            volume=float(np.round(rng.uniform(0.5, 1.0), 2)),
            skew_ppm=float(np.round(rng.uniform(-50, 50), 1)),
            device_delay_ms=float(np.round(rng.uniform(20, 120))),
        )
        specs.extend(replace(base, echo_to_user_db=ratio) for ratio in ratios)
    return specs
