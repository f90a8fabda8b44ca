"""Finding where a newly placed stretch of reference lies (duplex/align.py)."""

from __future__ import annotations

import numpy as np
import pytest

from custom_components.rtvoice.duplex.align import BLOCK, StretchAligner, shift_taps


def _speechlike(seconds: float, seed: int) -> np.ndarray:
    """Band-limited noise bursts: speech-like enough for a cross-correlation."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    noise = np.convolve(rng.standard_normal(n), np.hanning(9), "same")
    envelope = np.repeat(rng.uniform(0.1, 1.0, n // 800 + 1), 800)[:n]
    return noise * envelope * 0.1


def _delayed(x: np.ndarray, lag: float) -> np.ndarray:
    """``x`` delayed by ``lag`` samples (a fraction by its phase)."""
    n = 2 * len(x)
    spectrum = np.fft.rfft(x, n)
    spectrum *= np.exp(-1j * np.arange(len(spectrum)) * 2 * np.pi / n * lag)
    return np.fft.irfft(spectrum, n)[: len(x)]


@pytest.mark.parametrize("lag", [-3.0, 2.4, 17.0, -40.6])
def test_the_offset_of_the_echo_is_found(lag: float) -> None:
    """The mic holds the estimate ``lag`` samples later: the aligner says so."""
    estimate = _speechlike(0.5, seed=1)
    mic = (
        _delayed(estimate, lag)
        + np.random.default_rng(2).standard_normal(len(estimate)) * 1e-4
    )
    aligner = StretchAligner()
    aligner.start()
    found = None
    for i in range(len(estimate) // BLOCK):
        frame = slice(i * BLOCK, (i + 1) * BLOCK)
        found = aligner.feed(mic[frame], estimate[frame], floor=1e-6)
        if found is not None:
            break
    assert found is not None
    assert found.lag == pytest.approx(lag, abs=0.25)
    assert found.residual < 0.05  # moved by it, the estimate leaves < -13 dB
    assert not aligner.active


def test_a_user_alone_is_no_offset() -> None:
    """Nothing in the mic correlates with the estimate: no offset, and it gives up."""
    estimate = _speechlike(1.2, seed=3)
    user = _speechlike(1.2, seed=4)
    aligner = StretchAligner(give_up_frames=100)
    aligner.start()
    found = [
        aligner.feed(
            user[i * BLOCK : (i + 1) * BLOCK],
            estimate[i * BLOCK : (i + 1) * BLOCK],
            floor=1e-6,
        )
        for i in range(len(estimate) // BLOCK)
    ]
    assert found == [None] * len(found)
    assert not aligner.active  # gave up


@pytest.mark.parametrize("lag", [3.0, -5.0, 1.5])
def test_shifted_taps_are_the_same_path_later(lag: float) -> None:
    """A partitioned filter moved by ``lag`` filters like the path ``lag`` later."""
    rng = np.random.default_rng(5)
    taps = np.zeros(6 * BLOCK)
    taps[200] = 1.0
    taps[201:900] = rng.standard_normal(699) * np.exp(-np.arange(699) / 150) * 0.2
    blocks = np.zeros((6, 2 * BLOCK))
    blocks[:, :BLOCK] = taps.reshape(6, BLOCK)
    filters = np.fft.rfft(blocks, axis=1)
    moved = shift_taps(filters, lag)
    moved_taps = np.fft.irfft(moved, n=2 * BLOCK, axis=1)[:, :BLOCK].reshape(-1)
    expected = _delayed(taps, lag)
    assert np.max(np.abs(moved_taps - expected)) < 0.02
