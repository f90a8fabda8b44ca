"""Map played audio back to the characters of the round's text the user heard.

Each sentence's audio occupies a byte range of the player's stream. A position in
that stream is heard up to: every sentence whose audio was played entirely, plus a
proportional cut inside the sentence being played, moved forward to the end of the
word it falls in ("up to the word being played"). Characters count in the round's
text (all its deltas concatenated), as ``Kernel.acknowledge`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

from .sentences import Sentence


@dataclass(slots=True)
class _Span:
    sentence: Sentence
    audio_start: int
    audio_end: int


class HeardLedger:
    """The audio ranges of one round's sentences, in order."""

    def __init__(self, seq: int) -> None:
        """Track round ``seq``."""
        self.seq = seq
        self._spans: list[_Span] = []

    def add(self, sentence: Sentence, audio_start: int) -> None:
        """Record that a sentence's audio starts at ``audio_start`` (``extend`` grows it)."""
        self._spans.append(_Span(sentence, audio_start, audio_start))

    def extend(self, audio_end: int) -> None:
        """Record that the current sentence's audio now ends at ``audio_end``."""
        self._spans[-1].audio_end = audio_end

    def skip(self, sentence: Sentence) -> None:
        """Record a sentence that got no audio (its TTS failed): heard once reached."""
        if self._spans:
            end = self._spans[-1].audio_end
            self._spans.append(_Span(sentence, end, end))
        else:
            self._spans.append(_Span(sentence, -1, -1))

    def heard_chars(self, played: int) -> int:
        """Characters heard once the player has played up to position ``played``."""
        heard = 0
        for span in self._spans:
            if played >= span.audio_end:
                heard = span.sentence.end
                continue
            if played > span.audio_start:
                heard = _cut(
                    span.sentence,
                    (played - span.audio_start) / (span.audio_end - span.audio_start),
                )
            break
        return heard


def _cut(sentence: Sentence, fraction: float) -> int:
    """Round-text offset at ``fraction`` of the sentence, moved to its word's end."""
    text = sentence.text
    at = min(len(text), max(1, math.ceil(len(text) * fraction)))
    if at > 0 and at < len(text) and not text[at - 1].isspace():
        while at < len(text) and not text[at].isspace():
            at += 1
    at = len(text[:at].rstrip())
    return sentence.start + at
