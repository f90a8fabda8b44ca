"""Speech clips for the duplex tests (espeak-ng + sox, cached; skipped when missing)."""

from __future__ import annotations

import random

import pytest

from tests.peers.speech import speak, speech_tools_available


@pytest.fixture(scope="session")
def clip():
    """Return speak(), skipping the test when espeak-ng/sox are not installed."""
    if not speech_tools_available():
        pytest.skip("espeak-ng and sox are needed for speech clips")
    return speak


def noise(ms: int, dbfs: float, seed: int = 1) -> bytes:
    """White noise of ``ms`` at roughly ``dbfs`` RMS (deterministic)."""
    rng = random.Random(seed)
    amplitude = 32768 * 10 ** (dbfs / 20) * 3**0.5  # uniform: rms = a / sqrt(3)
    samples = [int(rng.uniform(-amplitude, amplitude)) for _ in range(ms * 16)]
    return b"".join(s.to_bytes(2, "little", signed=True) for s in samples)
