"""Offline speech clips for tests: espeak-ng speaks, sox converts.

``speak(text)`` returns raw PCM (16 kHz, 16-bit little-endian, mono) of the phrase
with silence before and after it, so a voice-activity detector sees an utterance start
and end. Clips are generated on first use and cached per (text, voice, rate, silence)
in a folder under the system temp dir; nothing is downloaded. The Debian packages
``espeak-ng`` and ``sox`` are needed (``scripts/test`` installs them).

This is speech for tests of known phrases, not a model of real voices.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
import shutil
import subprocess
import tempfile
import wave

__all__ = [
    "BYTES_PER_MS",
    "LET_IT_PLAY_MS",
    "SAMPLE_RATE",
    "SpeechToolsMissingError",
    "after_a_moment",
    "silence",
    "speak",
    "speech_tools_available",
    "to_wav",
]

SAMPLE_RATE = 16000
SAMPLE_WIDTH = 2
BYTES_PER_MS = SAMPLE_RATE * SAMPLE_WIDTH // 1000  # 32

_CACHE = Path(
    os.environ.get(
        "RTVOICE_SPEECH_CACHE", Path(tempfile.gettempdir()) / "rtvoice-speech"
    )
)


class SpeechToolsMissingError(RuntimeError):
    """espeak-ng or sox is not installed."""


def speech_tools_available() -> bool:
    """Return True when espeak-ng and sox are on PATH."""
    return shutil.which("espeak-ng") is not None and shutil.which("sox") is not None


def silence(ms: int) -> bytes:
    """Return ``ms`` milliseconds of digital silence."""
    return bytes(ms * BYTES_PER_MS)


LET_IT_PLAY_MS = 1000
"""How long a user lets an answer play before talking over it, in mic audio.

An answer may start at the short pause that ends a turn early (issue 18) while the
segmenter's hangover still holds that utterance open (measured: up to 0.71 s after
the pause). Words said then are part of the same utterance, and the rig's STT hears
one declared phrase per utterance: "turn on the kitchen lights … stop" is heard as
the first phrase, the same words as the answer's, and "stop" is lost (a real STT
hears both words, and the session pushes them: ``tests/duplex/test_turn_session.py``).
The mic is past that pause whenever an answer plays, so words queued after this much
silence are a turn of their own, whatever the machine's load.
"""


def after_a_moment(pcm: bytes) -> bytes:
    """Return ``pcm`` after ``LET_IT_PLAY_MS`` of silence: words over an answer."""
    return silence(LET_IT_PLAY_MS) + pcm


def speak(
    text: str,
    *,
    voice: str = "en-us",
    rate: int = 160,
    lead_ms: int = 300,
    tail_ms: int = 800,
) -> bytes:
    """Return 16 kHz mono s16le PCM of ``text`` spoken by espeak-ng.

    ``voice`` is an espeak-ng voice (``en-us``, ``en-gb``, ``en-us+f3`` …), ``rate``
    words per minute; ``lead_ms``/``tail_ms`` of silence surround the speech.
    Blocking (runs two small processes on a cache miss): call it from a test's setup
    or through ``asyncio.to_thread``.
    """
    if not text.strip():
        raise ValueError("speak() needs some text")
    key = hashlib.sha256(f"{text}|{voice}|{rate}".encode()).hexdigest()[:24]
    path = _CACHE / f"{key}.raw"
    if not path.exists():
        if not speech_tools_available():
            raise SpeechToolsMissingError(
                "espeak-ng and sox are needed for speech clips"
                " (apt-get install espeak-ng sox; scripts/test installs them)"
            )
        _CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            spoken = Path(tmp) / "espeak.wav"
            subprocess.run(
                ["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(spoken), text],
                check=True,
                capture_output=True,
            )
            converted = Path(tmp) / "clip.raw"
            subprocess.run(
                [
                    "sox",
                    str(spoken),
                    "-r", str(SAMPLE_RATE),
                    "-c", "1",
                    "-b", "16",
                    "-e", "signed-integer",
                    "-L",
                    str(converted),
                ],
                check=True,
                capture_output=True,
            )  # fmt: skip
            partial = path.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(converted.read_bytes())
            partial.replace(path)  # atomic: parallel test runs share the cache
    return silence(lead_ms) + path.read_bytes() + silence(tail_ms)


def to_wav(pcm: bytes, path: Path, *, rate: int = SAMPLE_RATE) -> Path:
    """Write 16-bit mono PCM to a WAV file (for listening to what a test heard)."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(SAMPLE_WIDTH)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return path
