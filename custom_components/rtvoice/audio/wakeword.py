"""openWakeWord detection on a 16 kHz mono PCM stream, with pyopen-wakeword.

pyopen-wakeword bundles the openWakeWord models and a TensorFlow Lite C library (it
needs only numpy; wheels exist for glibc Linux, not musl). Its pipeline has two
stages: ``OpenWakeWordFeatures`` turns PCM into speech embeddings (melspectrogram
and embedding models, one embedding per 80 ms) and ``OpenWakeWord`` turns the
embeddings into one probability per 80 ms for one wake word. A fresh (or reset)
feature extractor pretends that 8 s of silence precede the stream, so that a wake
word can be heard within the first second; the first chunk therefore runs the models
over those 8 s, ~0.5 s of CPU.

This module pays that cost once:

- ``WakeWordEngine.warm_up()`` runs the silence once and keeps the state it leaves
  (feature buffers and each model's embedding window) as a snapshot.
- ``WakeWordEngine.open_stream()`` gives every audio stream its own TFLite instances
  with that state copied in (about a millisecond), so concurrent streams share
  nothing and none pays the warm-up again.
- The library lets TensorFlow Lite pick its thread count, and TFLite's worker
  threads spin: measured, twice the CPU of one thread for the same audio. Each
  interpreter is rebuilt with one thread (a stream is ~35 ms of CPU per second of
  audio that way); streams run in parallel on the executor's threads instead.
- ``WakeWordStream.feed()`` takes chunks of any size (odd byte counts included) and
  buffers them into the 80 ms frames the models want; ``process()`` runs the models
  over the complete frames. ``process()`` and ``close()`` block (model work): call
  them from a worker thread. They hold the stream's lock, so a ``close()`` that
  arrives while a cancelled caller's ``process()`` still runs waits for it.

No Home Assistant import here; ``wake_word.py`` adapts this to Home Assistant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
import copy
import ctypes
from dataclasses import dataclass
import importlib
import logging
import threading
from types import ModuleType
from typing import Any, Final

_LOGGER = logging.getLogger(__name__)

BACKEND_MODULE: Final = "pyopen_wakeword"
BACKEND_REQUIREMENT: Final = "pyopen-wakeword>=1.1.0,<2"

SAMPLE_RATE: Final = 16000
SAMPLE_WIDTH: Final = 2
FRAME_SAMPLES: Final = 1280  # 80 ms: one embedding, one probability per model
FRAME_BYTES: Final = FRAME_SAMPLES * SAMPLE_WIDTH
BYTES_PER_MS: Final = SAMPLE_RATE * SAMPLE_WIDTH // 1000

DEFAULT_THRESHOLD: Final = 0.5  # openWakeWord's own default

# State the library leaves after the warm-up: plain attributes of its objects.
_FEATURE_STATE: Final = ("audio", "new_audio_samples", "mels", "new_mels")
_MODEL_STATE: Final = ("embeddings", "new_embeddings")

# Interpreters of the library's objects: (interpreter, model, input tensor, output
# tensor, input shape to resize to or None). Shapes as pyopen-wakeword 1.x sets them.
_FEATURE_INTERPRETERS: Final = (
    (
        "mel_interpreter",
        "mel_model",
        "mel_input_tensor",
        "mel_output_tensor",
        (1, 1760),
    ),
    (
        "emb_interpreter",
        "emb_model",
        "emb_input_tensor",
        "emb_output_tensor",
        (1, 76, 32, 1),
    ),
)
_MODEL_INTERPRETERS: Final = (
    ("interpreter", "model", "input_tensor", "output_tensor", None),
)
TFLITE_THREADS: Final = 1

# Warmed state per (library module, models): the same for every engine, so entries,
# reloads and tests of one process warm up once. Values are only read.
_WARM_CACHE: dict[
    tuple[int, tuple[str, ...]],
    tuple[dict[str, Any] | None, dict[str, dict[str, Any] | None], bool],
] = {}


@dataclass(frozen=True)
class WakeWordModel:
    """A wake word model bundled with pyopen-wakeword."""

    id: str
    name: str
    phrase: str


MODELS: Final[tuple[WakeWordModel, ...]] = (
    WakeWordModel("okay_nabu", "Okay Nabu", "okay nabu"),
    WakeWordModel("hey_jarvis", "Hey Jarvis", "hey jarvis"),
    WakeWordModel("hey_mycroft", "Hey Mycroft", "hey mycroft"),
    WakeWordModel("alexa", "Alexa", "alexa"),
    WakeWordModel("hey_rhasspy", "Hey Rhasspy", "hey rhasspy"),
)
MODELS_BY_ID: Final = {model.id: model for model in MODELS}


class WakeWordUnavailableError(RuntimeError):
    """pyopen-wakeword cannot be used here; the message says why."""


@dataclass(frozen=True)
class Detection:
    """A wake word heard in a stream."""

    model_id: str
    probability: float
    timestamp_ms: int | None  # timestamp of the chunk that completed the frame
    audio_ms: int  # end of the detecting frame, in ms of audio fed to the stream


def load_backend() -> ModuleType:
    """Import pyopen-wakeword, or raise ``WakeWordUnavailableError`` saying why.

    The import loads the TFLite C library only when a model is created; that is
    where a library built for another C library (musl) fails, so callers should
    treat ``OSError`` from ``warm_up`` the same way (the engine does).
    """
    try:
        return importlib.import_module(BACKEND_MODULE)
    except ImportError as err:
        raise WakeWordUnavailableError(
            f"the Python package pyopen-wakeword is not installed ({err})"
        ) from err


def _single_threaded(
    obj: Any, interpreters: Sequence[tuple[str, str, str, str, tuple[int, ...] | None]]
) -> bool:
    """Rebuild the interpreters of a library object with ``TFLITE_THREADS`` threads.

    Returns False (object untouched) when the library lacks what this needs.
    """
    lib = getattr(obj, "lib", None)
    names = [name for spec in interpreters for name in spec[:4]]
    if lib is None or not all(hasattr(obj, name) for name in names):
        return False
    try:
        create_options = lib.TfLiteInterpreterOptionsCreate
        set_threads = lib.TfLiteInterpreterOptionsSetNumThreads
        delete_options = lib.TfLiteInterpreterOptionsDelete
    except AttributeError:
        return False
    create_options.restype = ctypes.c_void_p
    set_threads.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    delete_options.argtypes = [ctypes.c_void_p]
    options = create_options()
    set_threads(options, TFLITE_THREADS)
    try:
        for (
            interpreter_name,
            model_name,
            input_name,
            output_name,
            shape,
        ) in interpreters:
            interpreter = lib.TfLiteInterpreterCreate(getattr(obj, model_name), options)
            if not interpreter:
                raise OSError("TfLiteInterpreterCreate failed")
            if shape is not None:
                dims = (ctypes.c_int32 * len(shape))(*shape)
                lib.TfLiteInterpreterResizeInputTensor(
                    interpreter, ctypes.c_int32(0), dims, ctypes.c_int32(len(shape))
                )
            lib.TfLiteInterpreterAllocateTensors(interpreter)
            lib.TfLiteInterpreterDelete(getattr(obj, interpreter_name))
            setattr(obj, interpreter_name, interpreter)
            setattr(
                obj,
                input_name,
                lib.TfLiteInterpreterGetInputTensor(interpreter, ctypes.c_int32(0)),
            )
            setattr(
                obj,
                output_name,
                lib.TfLiteInterpreterGetOutputTensor(interpreter, ctypes.c_int32(0)),
            )
    finally:
        delete_options(options)
    return True


def _snapshot(obj: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """Copy the named attributes of ``obj``; None when the library lacks one."""
    if not all(hasattr(obj, name) for name in names):
        return None
    return {name: copy.deepcopy(getattr(obj, name)) for name in names}


def _restore(obj: Any, state: dict[str, Any] | None) -> None:
    """Put a copy of a snapshot into ``obj`` (a no-op without a snapshot)."""
    if state is None:
        return
    for name, value in state.items():
        setattr(obj, name, copy.deepcopy(value))


class WakeWordEngine:
    """The models of one engine and their warmed-up state; makes streams.

    Thread-safe after ``warm_up()``: the snapshot is only read.
    """

    def __init__(
        self,
        model_ids: Iterable[str] | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
    ) -> None:
        """Prepare an engine for ``model_ids`` (default: every bundled model)."""
        ids = list(model_ids) if model_ids is not None else [m.id for m in MODELS]
        unknown = [model_id for model_id in ids if model_id not in MODELS_BY_ID]
        if unknown:
            raise ValueError(f"unknown wake word models: {unknown}")
        if not ids:
            raise ValueError("a wake word engine needs at least one model")
        self.model_ids: tuple[str, ...] = tuple(ids)
        self.threshold = threshold
        self._backend: ModuleType | None = None
        self._feature_state: dict[str, Any] | None = None
        self._model_states: dict[str, dict[str, Any] | None] = {}
        self._single = False  # interpreters rebuilt with TFLITE_THREADS threads

    @property
    def models(self) -> list[WakeWordModel]:
        """The wake words this engine detects."""
        return [MODELS_BY_ID[model_id] for model_id in self.model_ids]

    @property
    def warm(self) -> bool:
        """Return True once ``warm_up()`` has succeeded."""
        return self._backend is not None

    def warm_up(self) -> None:
        """Load the library and models, run the silence once, keep the state.

        Blocking (~0.5 s of CPU the first time in a process; later engines with the
        same models reuse the state): run it in a worker thread. Raises
        ``WakeWordUnavailableError`` when the library is missing or cannot load.
        """
        backend = load_backend()
        key = (id(backend), self.model_ids)
        if (cached := _WARM_CACHE.get(key)) is not None:
            self._feature_state, self._model_states, self._single = cached
            self._backend = backend
            return
        try:
            features = backend.OpenWakeWordFeatures.from_builtin()
            self._single = _single_threaded(features, _FEATURE_INTERPRETERS)
            embeddings = list(features.process_streaming(bytes(FRAME_BYTES)))
            feature_state = _snapshot(features, _FEATURE_STATE)
            features.close()
            model_states: dict[str, dict[str, Any] | None] = {}
            for model_id in self.model_ids:
                model = backend.OpenWakeWord.from_builtin(backend.Model(model_id))
                self._single = self._single and _single_threaded(
                    model, _MODEL_INTERPRETERS
                )
                for embedding in embeddings:
                    for _ in model.process_streaming(embedding):
                        pass
                model_states[model_id] = _snapshot(model, _MODEL_STATE)
                model.close()
        except (OSError, ValueError) as err:
            # OSError: the bundled TFLite library does not load (another C library,
            # another CPU); ValueError: no library for this platform / no model.
            raise WakeWordUnavailableError(
                f"pyopen-wakeword cannot run on this system ({err})"
            ) from err
        if not self._single:
            _LOGGER.info(
                "pyopen-wakeword interpreters keep TensorFlow Lite's default threads"
            )
        if feature_state is None or None in model_states.values():
            _LOGGER.warning(
                "This pyopen-wakeword version keeps its state elsewhere; every"
                " wake word stream will pay the ~0.5 s warm-up on its first chunk"
            )
        self._feature_state = feature_state
        self._model_states = model_states
        self._backend = backend
        _WARM_CACHE[key] = (feature_state, model_states, self._single)

    def open_stream(self, model_ids: Iterable[str] | None = None) -> WakeWordStream:
        """Return a new stream detecting ``model_ids`` (default: all of them).

        Cheap (about a millisecond: fresh TFLite instances plus a state copy), but it
        touches the disk: call it from a worker thread.
        """
        backend = self._backend
        if backend is None:
            raise RuntimeError("warm_up() the engine before opening streams")
        ids = list(model_ids) if model_ids is not None else list(self.model_ids)
        unknown = [model_id for model_id in ids if model_id not in self.model_ids]
        if unknown or not ids:
            raise ValueError(f"not a model of this engine: {unknown or ids}")
        features = backend.OpenWakeWordFeatures.from_builtin()
        if self._single:
            _single_threaded(features, _FEATURE_INTERPRETERS)
        _restore(features, self._feature_state)
        models: list[tuple[str, Any]] = []
        for model_id in ids:
            model = backend.OpenWakeWord.from_builtin(backend.Model(model_id))
            if self._single:
                _single_threaded(model, _MODEL_INTERPRETERS)
            _restore(model, self._model_states.get(model_id))
            models.append((model_id, model))
        return WakeWordStream(features, models, self.threshold)


class WakeWordStream:
    """The detection state of one audio stream: its own features and models."""

    def __init__(
        self, features: Any, models: list[tuple[str, Any]], threshold: float
    ) -> None:
        """Wrap library objects made by ``WakeWordEngine.open_stream``."""
        self._features = features
        self._models = models
        self._threshold = threshold
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._fed = 0  # bytes fed
        self._processed = 0  # bytes run through the models
        self._marks: deque[tuple[int, int | None]] = deque()  # (end offset, ts)
        self._closed = False
        self.best: dict[str, float] = dict.fromkeys(
            (model_id for model_id, _ in models), 0.0
        )

    @property
    def frames_ready(self) -> int:
        """Complete 80 ms frames waiting for ``process()``."""
        return len(self._pending) // FRAME_BYTES

    @property
    def audio_ms(self) -> int:
        """Milliseconds of audio run through the models so far."""
        return self._processed // BYTES_PER_MS

    def feed(self, pcm: bytes, timestamp_ms: int | None = None) -> int:
        """Buffer a chunk (16 kHz, 16-bit, mono; any size); return frames ready.

        No model work: cheap enough for the event loop. Not to be called while
        ``process()`` runs in another thread.
        """
        if pcm:
            self._pending += pcm
            self._fed += len(pcm)
            self._marks.append((self._fed, timestamp_ms))
        return self.frames_ready

    def process(self) -> Detection | None:
        """Run the models over every complete frame; the first detection wins.

        Blocking (a few ms per frame): call it from a worker thread. Frames after a
        detecting frame stay buffered. Returns None when nothing was detected (or
        the stream is closed).
        """
        with self._lock:
            while not self._closed and len(self._pending) >= FRAME_BYTES:
                frame = bytes(self._pending[:FRAME_BYTES])
                del self._pending[:FRAME_BYTES]
                self._processed += FRAME_BYTES
                if (detection := self._run(frame)) is not None:
                    return detection
        return None

    def _run(self, frame: bytes) -> Detection | None:
        """Run one frame through features and models (lock held)."""
        heard: tuple[str, float] | None = None
        for embedding in self._features.process_streaming(frame):
            for model_id, model in self._models:
                for probability in model.process_streaming(embedding):
                    self.best[model_id] = max(self.best[model_id], probability)
                    if probability >= self._threshold and (
                        heard is None or probability > heard[1]
                    ):
                        heard = (model_id, float(probability))
        if heard is None:
            return None
        return Detection(
            model_id=heard[0],
            probability=heard[1],
            timestamp_ms=self._timestamp_at(self._processed),
            audio_ms=self.audio_ms,
        )

    def _timestamp_at(self, offset: int) -> int | None:
        """Timestamp of the chunk holding the byte just before ``offset``."""
        while self._marks and self._marks[0][0] < offset:
            self._marks.popleft()
        return self._marks[0][1] if self._marks else None

    def close(self) -> None:
        """Free the TFLite instances (waits for a running ``process()``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._features.close()
            for _, model in self._models:
                model.close()
