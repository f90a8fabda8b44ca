"""Speech clips for the duplex tests (espeak-ng + sox, cached; skipped when missing)."""

from __future__ import annotations

import asyncio
from pathlib import Path
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


def epoll_loop() -> asyncio.AbstractEventLoop:
    """Return the running loop when it waits on Linux epoll; else skip the test."""
    loop = asyncio.get_running_loop()
    selector = getattr(loop, "_selector", None)
    if type(selector).__name__ != "EpollSelector":
        pytest.skip("needs the epoll selector loop")
    return loop


def selector_keys_epoll_lost(loop: asyncio.AbstractEventLoop) -> list[int]:
    """Return the fds the loop's selector waits on that epoll no longer watches.

    A writer left registered for a socket that then closed stays in the
    selector's map while the kernel forgets it: the next socket given that fd
    number waits forever for a writability epoll never reports.
    """
    selector = loop._selector  # type: ignore[attr-defined]  # noqa: SLF001
    epoll = selector._selector.fileno()  # noqa: SLF001
    info = Path(f"/proc/self/fdinfo/{epoll}").read_text(encoding="ascii")
    watched = {
        int(line.split()[1]) for line in info.splitlines() if line.startswith("tfd:")
    }
    return sorted(fd for fd in selector.get_map() if fd not in watched)
