"""Split a round's streamed text deltas into sentences for text-to-speech.

A sentence ends at ``!`` or ``?`` followed by white space, at ``.``/``…`` followed by
white space and then a character that is not lower case (so "e.g. this", "wait... what"
and "3.5" stay whole), or before a line break (lists, paragraphs). A period after a
known abbreviation ("Dr.", "e.g.", "approx."), after a single capital (an initial) or
after a bare list number at the start ("1. Turn ...") does not end a sentence.

A period is only judged once the next non-space character has arrived, so a sentence
ending a delta waits for the next delta (milliseconds) or for ``flush`` at round end.

Latency: the *first* sentence of a round may be released early at a clause boundary
(``,``, ``;``, ``:`` or a dash followed by white space) once it has ``early_min_chars``
characters (default 24), so speech starts before a long first sentence is complete;
later sentences are never split at clauses (the first one buys the time). A sentence
with no boundary at all is cut at the last space before ``max_chars``.

Each sentence carries its character span in the round's text (all deltas concatenated),
which is what playback acknowledgement counts in.
"""

from __future__ import annotations

from dataclasses import dataclass

_CLOSERS = "\"')]}»”’"
_CLAUSE = ",;:—–"
_ABBREVIATIONS = frozenset(
    {
        "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "etc.",
        "e.g", "i.e", "eg", "ie", "cf", "approx", "ca", "no", "nr", "fig", "vol",
        "inc", "ltd", "co", "dept", "min", "max", "temp", "avg", "est", "jan", "feb",
        "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence: its text and its span ``[start, end)`` in the round's text."""

    text: str
    start: int
    end: int


class SentenceSplitter:
    """Turns the text deltas of one round into sentences, in order."""

    def __init__(self, *, early_min_chars: int = 24, max_chars: int = 250) -> None:
        """Release a first clause from ``early_min_chars`` (0: never); cut at ``max_chars``."""
        self.early_min_chars = early_min_chars
        self.max_chars = max_chars
        self._pending = ""
        self._base = 0  # offset of _pending[0] in the round's text
        self._emitted = 0

    @property
    def length(self) -> int:
        """Characters received so far (the round's text length)."""
        return self._base + len(self._pending)

    def feed(self, delta: str) -> list[Sentence]:
        """Add a delta; return the sentences it completes."""
        self._pending += delta
        out: list[Sentence] = []
        while (cut := self._find_cut()) is not None:
            out.append(self._take(cut))
        return out

    def flush(self) -> list[Sentence]:
        """End of round: return what is left as a last sentence (if any words)."""
        if not self._pending.strip():
            self._base += len(self._pending)
            self._pending = ""
            return []
        return [self._take(len(self._pending))]

    def _take(self, cut: int) -> Sentence:
        raw = self._pending[:cut]
        lead = len(raw) - len(raw.lstrip())
        text = raw.strip()
        sentence = Sentence(text, self._base + lead, self._base + len(raw.rstrip()))
        rest = self._pending[cut:]
        skipped = len(rest) - len(rest.lstrip())
        self._base += cut + skipped
        self._pending = rest[skipped:]
        self._emitted += 1
        return sentence

    def _find_cut(self) -> int | None:
        text = self._pending
        size = len(text)
        first = self._emitted == 0
        for i, ch in enumerate(text):
            if ch == "\n":
                if text[:i].strip():
                    return i
                continue
            if ch in "!?":
                j = _skip_closers(text, i + 1, "!?")
                if j == size:
                    return None
                if text[j].isspace():
                    return j
                continue
            if ch in ".…":
                j = _skip_closers(text, i + 1, ".…")
                if j == size:
                    return None
                if not text[j].isspace():
                    continue  # 3.5, e.g. inside a token, example.com
                k = j
                while k < size and text[k].isspace():
                    if text[k] == "\n":
                        return j
                    k += 1
                if k == size:
                    return None  # judge once the next character is here
                if text[k].islower():
                    continue
                if j == i + 1 and ch == "." and _not_an_end(text, i):
                    continue
                return j
            if (
                first
                and self.early_min_chars
                and ch in _CLAUSE
                and i + 1 >= self.early_min_chars
                and i + 1 < size
                and text[i + 1].isspace()
            ):
                return i + 1
            if i >= self.max_chars:
                space = text.rfind(" ", 0, i)
                if space > 0 and text[:space].strip():
                    return space
        return None


def _skip_closers(text: str, j: int, repeats: str) -> int:
    while j < len(text) and (text[j] in repeats or text[j] in _CLOSERS):
        j += 1
    return j


def _not_an_end(text: str, dot: int) -> bool:
    """Return True when the period at ``dot`` ends an abbreviation, initial or list number."""
    start = dot
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:dot].lstrip("\"'([{«“‘")
    if not word:
        return False
    if word.lower() in _ABBREVIATIONS:
        return True
    if len(word) == 1 and word.isalpha() and word.isupper():
        return True  # an initial: "J. R. R. Tolkien"
    return word.isdigit() and not text[:start].strip()  # "1. Turn it on"
