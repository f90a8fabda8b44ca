"""Recognition of known phrases: pocketsphinx constrained by a JSGF grammar.

``PhraseRecognizer(phrases)`` turns 16 kHz mono s16le PCM into one of the declared
phrases, or ``""`` when the decoder did not reach the end of any of them or its
hypothesis score is below ``min_score``. It is a recognition rig for the phrases a
test declares, not general speech recognition: speech outside the grammar is mostly
rejected (``""``) but can be forced onto the closest declared phrase.

Three things make espeak-ng clips recognisable (measured, see docs/development.md):

- the grammar: pocketsphinx's default language model gets short commands wrong;
  a grammar of the declared phrases gets them right;
- comfort noise: espeak-ng and ``speak()`` put *digital* silence (exact zeros)
  between and around words, which derails pocketsphinx's features (it then drops
  final words: "what time is it" → "what time"). A fixed, low-level noise floor
  (±80 of 32767, about -52 dBFS) is added to the audio before decoding;
- a floor on pocketsphinx's hypothesis score (0 … 1, higher is a better match):
  declared phrases score ≥ 0.47 in the measured voices, out-of-grammar speech
  forced onto a phrase mostly lower; 0.45 rejects about 40 % of those forced
  matches and no declared phrase.

Decoding blocks for ~10-30 ms per phrase: call ``recognize`` from a thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
import re
import threading

import numpy as np
from pocketsphinx import Config, Decoder

__all__ = [
    "MIN_SCORE",
    "NOISE_AMPLITUDE",
    "SAMPLE_RATE",
    "PhraseRecognizer",
    "Recognition",
    "UnknownWordsError",
    "normalize",
]

SAMPLE_RATE = 16000
NOISE_AMPLITUDE = 80  # uniform ±80 (int16): fills espeak-ng's digital silence
MIN_SCORE = 0.45  # below: a forced match of out-of-grammar speech, rejected
_NOISE_SEED = 0  # fixed: the same clip always decodes the same way
_SEARCH = "phrases"
_WORD = re.compile(r"[a-z0-9']+")

# Loading the acoustic model is most of a recognizer's start-up (~0.8 s): closed
# recognizers hand their decoder back for the next one (tests start many servers).
_idle_decoders: list[Decoder] = []
_idle_lock = threading.Lock()


def _take_decoder() -> Decoder:
    with _idle_lock:
        if _idle_decoders:
            return _idle_decoders.pop()
    return Decoder(Config(loglevel="FATAL"))


class UnknownWordsError(ValueError):
    """A phrase uses words the bundled pronunciation dictionary does not know."""


@dataclass(frozen=True, slots=True)
class Recognition:
    """What the decoder made of one utterance."""

    text: str
    """A declared phrase as declared, or "" when nothing was recognised."""

    hypothesis: str
    """The decoder's raw best path (may be a phrase prefix when rejected)."""

    score: float
    """pocketsphinx's score of that path (0 … 1; 0 without a path)."""


def normalize(phrase: str) -> str:
    """Return the phrase as grammar words: lower case, punctuation dropped."""
    return " ".join(_WORD.findall(phrase.lower()))


class PhraseRecognizer:
    """A pocketsphinx decoder whose grammar is the declared phrases.

    Thread-safe: calls are serialised on one decoder (one utterance at a time).
    Creating one may load the bundled English model (~0.8 s): do it off the loop.
    ``close`` hands the decoder back for reuse.
    """

    def __init__(
        self,
        phrases: Iterable[str],
        *,
        noise_amplitude: int = NOISE_AMPLITUDE,
        min_score: float = MIN_SCORE,
    ) -> None:
        """Load the model and build the grammar; raise on unusable phrases."""
        self._lock = threading.Lock()
        self._noise_amplitude = noise_amplitude
        self._min_score = min_score
        self._decoder: Decoder | None = _take_decoder()
        self._phrases: dict[str, str] = {}
        try:
            self.set_phrases(phrases)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Give the decoder back for reuse; the recognizer is unusable after."""
        with self._lock:
            decoder, self._decoder = self._decoder, None
        if decoder is not None:
            with _idle_lock:
                _idle_decoders.append(decoder)

    @property
    def phrases(self) -> list[str]:
        """The declared phrases, as declared."""
        return list(self._phrases.values())

    def set_phrases(self, phrases: Iterable[str]) -> None:
        """Replace the grammar with these phrases.

        Raises ``ValueError`` for an empty list or an empty phrase and
        ``UnknownWordsError`` for words the dictionary lacks (the grammar is left
        unchanged then).
        """
        declared: dict[str, str] = {}
        for phrase in phrases:
            words = normalize(phrase)
            if not words:
                raise ValueError(f"phrase without words: {phrase!r}")
            declared.setdefault(words, phrase)
        if not declared:
            raise ValueError("at least one phrase is needed")
        with self._lock:
            decoder = self._live_decoder()
            unknown = sorted(
                {
                    word
                    for words in declared
                    for word in words.split()
                    if decoder.lookup_word(word) is None
                }
            )
            if unknown:
                raise UnknownWordsError(
                    "not in the pronunciation dictionary: " + ", ".join(unknown)
                )
            decoder.add_jsgf_string(_SEARCH, _grammar(declared))
            decoder.activate_search(_SEARCH)
            self._phrases = declared

    def recognize(self, pcm: bytes) -> Recognition:
        """Decode one utterance of 16 kHz mono s16le PCM (blocking)."""
        audio = self._with_noise(pcm[: len(pcm) - len(pcm) % 2])
        if not audio:
            return Recognition(text="", hypothesis="", score=0.0)
        with self._lock:
            decoder = self._live_decoder()
            decoder.start_utt()
            decoder.process_raw(audio, full_utt=True)
            decoder.end_utt()
            hyp = decoder.hyp()
            phrases = self._phrases
        if hyp is None:
            return Recognition(text="", hypothesis="", score=0.0)
        text = phrases.get(hyp.hypstr, "") if hyp.score >= self._min_score else ""
        return Recognition(text=text, hypothesis=hyp.hypstr, score=hyp.score)

    def _live_decoder(self) -> Decoder:
        if self._decoder is None:
            raise RuntimeError("the recognizer is closed")
        return self._decoder

    def _with_noise(self, pcm: bytes) -> bytes:
        if not self._noise_amplitude:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2")
        noise = np.random.default_rng(_NOISE_SEED).integers(
            -self._noise_amplitude, self._noise_amplitude + 1, samples.size
        )
        mixed = np.clip(samples.astype(np.int32) + noise, -32768, 32767)
        return mixed.astype("<i2").tobytes()


def _grammar(phrases: Iterable[str]) -> str:
    alternatives = " | ".join(phrases)
    return f"#JSGF V1.0;\ngrammar rig;\npublic <utterance> = {alternatives};\n"
