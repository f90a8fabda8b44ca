"""openWakeWord detector (HA-free) against generated speech.

The speech comes from espeak-ng (``tests/peers/speech.py``): real models, real audio,
nothing mocked except where a test says so. espeak-ng is one synthetic voice family,
so the cases below are those the models hear in it; the full grid (and what they do
not hear) is measured by ``scripts/bench_wakeword.py`` and recorded in the docs.
"""

from __future__ import annotations

import random
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from custom_components.rtvoice.audio import wakeword
from custom_components.rtvoice.audio.wakeword import (
    FRAME_BYTES,
    MODELS,
    WakeWordEngine,
    WakeWordStream,
    WakeWordUnavailableError,
)
from tests.peers.speech import silence, speak, speech_tools_available

pytest.importorskip("pyopen_wakeword")
pytestmark = pytest.mark.skipif(
    not speech_tools_available(), reason="espeak-ng and sox are needed"
)

# (model, text, voice, rate): espeak-ng reads "mycroft" as "mick-roft"; people and
# the model say "my croft", so that is how it is spelled for espeak-ng.
WAKE_CASES = [
    ("okay_nabu", "okay nabu", "en-us", 160),
    ("okay_nabu", "okay nabu", "en-us", 200),
    ("okay_nabu", "okay nabu", "en-us+f3", 130),
    ("okay_nabu", "okay nabu", "en-us+m3", 160),
    ("hey_jarvis", "hey jarvis", "en-us", 130),
    ("hey_jarvis", "hey jarvis", "en-gb", 160),
    ("hey_jarvis", "hey jarvis", "en-us+f3", 200),
    ("hey_jarvis", "hey jarvis", "en-gb+f2", 160),
    ("hey_mycroft", "hey my croft", "en-us", 160),
    ("hey_mycroft", "hey my croft", "en-gb", 160),
    ("hey_mycroft", "hey my croft", "en-us+f3", 160),
    ("alexa", "alexa", "en-us", 130),
    ("alexa", "alexa", "en-gb", 160),
    ("alexa", "alexa", "en-gb+f2", 200),
    ("alexa", "alexa", "en-us+m3", 200),
]

OTHER_PHRASES = [
    "turn on the kitchen lights",
    "what is the weather like tomorrow",
    "play some music in the living room",
    "set a timer for ten minutes",
    "okay",
    "hey",
]


def _noise(ms: int, seed: int) -> bytes:
    """Return ``ms`` of white noise at about -20 dBFS (seeded, reproducible)."""
    rng = random.Random(seed)
    samples = [int(rng.gauss(0, 3000)) for _ in range(ms * 16)]
    return b"".join(
        max(-32768, min(32767, s)).to_bytes(2, "little", signed=True) for s in samples
    )


@pytest.fixture(scope="module")
def engine() -> WakeWordEngine:
    """One warmed engine with every bundled model."""
    warmed = WakeWordEngine()
    warmed.warm_up()
    return warmed


def _detect(
    stream: WakeWordStream, pcm: bytes, chunk: int = FRAME_BYTES
) -> wakeword.Detection | None:
    """Feed ``pcm`` in ``chunk``-byte pieces, processing as frames complete."""
    try:
        for start in range(0, len(pcm), chunk):
            if stream.feed(pcm[start : start + chunk], start // 32):
                if (detection := stream.process()) is not None:
                    return detection
        return None
    finally:
        stream.close()


@pytest.mark.parametrize(("model_id", "text", "voice", "rate"), WAKE_CASES)
def test_wake_phrase_detected(
    engine: WakeWordEngine, model_id: str, text: str, voice: str, rate: int
) -> None:
    """Each wake phrase is detected, by its own model, when listening to all."""
    detection = _detect(engine.open_stream(), speak(text, voice=voice, rate=rate))
    assert detection is not None
    assert detection.model_id == model_id
    assert detection.probability >= engine.threshold


@pytest.mark.parametrize("text", OTHER_PHRASES)
@pytest.mark.parametrize("voice", ["en-us", "en-gb+f2"])
def test_other_phrases_not_detected(
    engine: WakeWordEngine, text: str, voice: str
) -> None:
    """Commands and fragments of wake phrases wake nothing."""
    stream = engine.open_stream()
    assert _detect(stream, speak(text, voice=voice)) is None


def test_silence_and_noise_not_detected(engine: WakeWordEngine) -> None:
    """Ten seconds of silence, then of white noise: nothing."""
    stream = engine.open_stream()
    assert _detect(stream, silence(10_000) + _noise(10_000, seed=8)) is None


def test_only_the_asked_model_listens(engine: WakeWordEngine) -> None:
    """A stream for one wake word does not answer another."""
    jarvis = speak("hey jarvis")
    assert _detect(engine.open_stream(["alexa"]), jarvis) is None
    detection = _detect(engine.open_stream(["hey_jarvis"]), jarvis)
    assert detection is not None
    assert detection.model_id == "hey_jarvis"


@pytest.mark.parametrize("chunk", [1, 7, 320, 1000, FRAME_BYTES, 10_001, 64_000])
def test_any_chunk_size_gives_the_same_detection(
    engine: WakeWordEngine, chunk: int
) -> None:
    """Chunks of any size (odd byte counts too) are buffered into 80 ms frames."""
    pcm = speak("hey jarvis")
    reference = _detect(engine.open_stream(), pcm)
    detection = _detect(engine.open_stream(), pcm, chunk)
    assert reference is not None
    assert detection is not None
    assert detection.audio_ms == reference.audio_ms
    assert detection.probability == pytest.approx(reference.probability, abs=1e-6)


def test_detection_reports_the_chunk_timestamp(engine: WakeWordEngine) -> None:
    """The timestamp is that of the chunk completing the detecting frame."""
    pcm = speak("alexa")
    stream = engine.open_stream()
    chunk = 1000  # 31.25 ms: frames and chunks do not line up
    detection = _detect(stream, pcm, chunk)
    assert detection is not None
    end = detection.audio_ms * 32  # byte offset of the end of the frame
    assert detection.timestamp_ms == ((end - 1) // chunk) * chunk // 32


def test_warm_state_matches_a_fresh_library_run(engine: WakeWordEngine) -> None:
    """The snapshot is the state a fresh pyopen-wakeword pipeline would have."""
    backend = wakeword.load_backend()
    pcm = speak("okay nabu")
    features = backend.OpenWakeWordFeatures.from_builtin()
    model = backend.OpenWakeWord.from_builtin(backend.Model("okay_nabu"))
    fresh: list[float] = []
    for start in range(0, len(pcm), FRAME_BYTES):
        for embedding in features.process_streaming(pcm[start : start + FRAME_BYTES]):
            fresh.extend(model.process_streaming(embedding))
    stream = engine.open_stream(["okay_nabu"])
    stream.feed(pcm)
    while stream.frames_ready:  # every frame, past the detection too
        stream.process()
    assert stream.best["okay_nabu"] == pytest.approx(max(fresh), abs=1e-4)
    stream.close()


def test_streams_share_no_state(engine: WakeWordEngine) -> None:
    """Two streams in two threads at once give the results each gives alone."""
    clips = {"hey_jarvis": speak("hey jarvis"), "alexa": speak("alexa", rate=130)}
    alone = {m: _detect(engine.open_stream(), pcm, 640) for m, pcm in clips.items()}
    together: dict[str, Any] = {}
    barrier = threading.Barrier(len(clips))

    def run(model_id: str, pcm: bytes) -> None:
        stream = engine.open_stream()
        barrier.wait()
        together[model_id] = _detect(stream, pcm, chunk=640)

    threads = [threading.Thread(target=run, args=item) for item in clips.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone
    assert all(d is not None and d.model_id == m for m, d in together.items())


def test_close_waits_for_a_running_process_and_stops_it(
    engine: WakeWordEngine,
) -> None:
    """close() from another thread waits for process(); process() after close: None."""
    stream = engine.open_stream()
    stream.feed(silence(3000))
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(stream.process()))
    worker.start()
    stream.close()  # serialised with process() by the stream's lock
    worker.join()
    assert done == [None]
    stream.feed(speak("hey jarvis"))
    assert stream.process() is None
    stream.close()  # idempotent


def test_engine_lists_models_and_rejects_unknown() -> None:
    """The bundled models are offered; unknown ids are refused up front."""
    assert {m.id for m in WakeWordEngine().models} >= {
        "okay_nabu",
        "hey_jarvis",
        "hey_mycroft",
        "alexa",
    }
    assert len(MODELS) == len({m.id for m in MODELS})
    with pytest.raises(ValueError, match="unknown"):
        WakeWordEngine(["hey_siri"])
    with pytest.raises(RuntimeError, match="warm_up"):
        WakeWordEngine().open_stream()


def test_missing_package_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the package, warm_up() raises WakeWordUnavailableError (why)."""
    monkeypatch.setitem(sys.modules, "pyopen_wakeword", None)  # import fails
    with pytest.raises(WakeWordUnavailableError, match="not installed"):
        WakeWordEngine().warm_up()


def test_library_that_cannot_load_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TFLite library built for another C library (musl) fails with OSError.

    Mocked: this machine has glibc, so the failing dlopen is simulated.
    """

    def fail(*_: Any, **__: Any) -> None:
        raise OSError("Error loading shared library libtensorflowlite_c.so")

    fake = SimpleNamespace(
        OpenWakeWordFeatures=SimpleNamespace(from_builtin=fail),
        OpenWakeWord=SimpleNamespace(from_builtin=fail),
        Model=str,
    )
    monkeypatch.setitem(sys.modules, "pyopen_wakeword", fake)
    engine = WakeWordEngine()
    with pytest.raises(WakeWordUnavailableError, match="cannot run on this system"):
        engine.warm_up()
    assert not engine.warm


def test_later_engines_reuse_the_warm_state(
    engine: WakeWordEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second engine (another entry, a reload) runs no warm-up models."""
    backend = wakeword.load_backend()
    built: list[str] = []
    real = backend.OpenWakeWordFeatures.from_builtin

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append("features")
        return real(*args, **kwargs)

    monkeypatch.setattr(backend.OpenWakeWordFeatures, "from_builtin", spy)
    again = WakeWordEngine()
    again.warm_up()
    assert built == []
    detection = _detect(again.open_stream(), speak("hey jarvis"))
    assert built == ["features"]  # the stream's own instance
    assert detection is not None
    assert detection.model_id == "hey_jarvis"
