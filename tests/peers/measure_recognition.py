"""Measure how well the speech rig recognises espeak-ng speech (the docs' figures).

    python -m tests.peers.measure_recognition

Speaks every home phrase in several espeak-ng voices and speeds (``speak()``, with
its silence around the speech) and counts exact recognitions:

- the shipped setup: the phrase grammar with the comfort-noise floor and the
  score floor;
- the grammar on the raw clips (no noise floor);
- pocketsphinx's default language model (no grammar), with and without the floor;
- out-of-grammar phrases: how many the grammar rejects (empty transcript) and how
  many it forces onto a declared phrase.

Prints a table; nothing is asserted. Takes ~2 min on 2 cores (the default language
model is the slow part; clips are cached).
"""

from __future__ import annotations

from collections.abc import Callable

from pocketsphinx import Config, Decoder

from tests.peers.phrase_recognizer import PhraseRecognizer, normalize
from tests.peers.speech import speak

HOME_PHRASES = [
    "turn on the kitchen lights",
    "turn off the kitchen lights",
    "turn on the bed light",
    "turn off the bed light",
    "what time is it",
    "what is the weather like",
    "set a timer for five minutes",
    "good morning",
    "cancel",
    "stop",
    "yes",
    "no",
]
OTHER_PHRASES = [
    "play some jazz music",
    "open the garage door",
    "how tall is mount everest",
    "lock the front door",
    "hello there",
    "tell me a joke",
    "what is the capital of france",
    "dim the lights",
]
VOICES = [  # (espeak-ng voice, words per minute)
    ("en-us", 160),
    ("en-us", 220),
    ("en-gb", 140),
    ("en-gb-x-rp", 130),
    ("en-gb-scotland", 170),
    ("en-us+f2", 150),
    ("en-us+f3", 180),
    ("en-us+m3", 160),
]


def _count(recognize: Callable[[bytes], str], phrases: list[str]) -> int:
    return sum(
        recognize(speak(phrase, voice=voice, rate=rate)) == phrase
        for voice, rate in VOICES
        for phrase in phrases
    )


def _language_model(noise: PhraseRecognizer) -> Callable[[bytes], str]:
    decoder = Decoder(Config(loglevel="FATAL"))

    def recognize(pcm: bytes) -> str:
        decoder.start_utt()
        decoder.process_raw(noise._with_noise(pcm), full_utt=True)  # noqa: SLF001
        decoder.end_utt()
        hyp = decoder.hyp()
        return normalize(hyp.hypstr) if hyp is not None else ""

    return recognize


def main() -> None:
    """Print the recognition figures."""
    total = len(HOME_PHRASES) * len(VOICES)
    grammar = PhraseRecognizer(HOME_PHRASES)
    raw = PhraseRecognizer(HOME_PHRASES, noise_amplitude=0)
    any_score = PhraseRecognizer(HOME_PHRASES, min_score=0)
    rows = [
        ("grammar + noise floor (shipped)", _count(lambda a: grammar.recognize(a).text, HOME_PHRASES)),
        ("grammar + noise, no score floor", _count(lambda a: any_score.recognize(a).text, HOME_PHRASES)),
        ("grammar, raw clips", _count(lambda a: raw.recognize(a).text, HOME_PHRASES)),
        ("default LM + noise floor", _count(_language_model(grammar), HOME_PHRASES)),
        ("default LM, raw clips", _count(_language_model(raw), HOME_PHRASES)),
    ]  # fmt: skip
    print(  # noqa: T201
        f"{len(HOME_PHRASES)} phrases x {len(VOICES)} voices/speeds = {total} clips"
    )
    for name, exact in rows:
        print(f"  {name:34} {exact:3}/{total} exact ({exact / total:.0%})")  # noqa: T201
    for name, recognizer in (("", grammar), (", no score floor", any_score)):
        answers = [
            recognizer.recognize(speak(phrase, voice=voice, rate=rate)).text
            for voice, rate in VOICES
            for phrase in OTHER_PHRASES
        ]
        rejected = answers.count("")
        print(  # noqa: T201
            f"out of grammar{name}: {len(answers)} clips, {rejected} rejected,"
            f" {len(answers) - rejected} forced onto a declared phrase"
        )


if __name__ == "__main__":
    main()
