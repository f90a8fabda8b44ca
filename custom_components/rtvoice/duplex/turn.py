"""End of turn by what was said: is the utterance so far a finished turn.

At a short silence inside an utterance (``UtterancePaused``, ~220 ms of no energy,
long before the VAD's tail and the segmenter's hangover end it) the session
transcribes what was said so far and asks ``judge_turn``:

- ``WAIT``: the words are unfinished ("turn on the", "and then", "um"): wait for the
  full hangover (and speculate on nothing);
- ``HOLD``: the words may be a whole turn: answer speculatively (the round runs,
  nothing plays) and let the hangover confirm it;
- ``END``: the words are a whole turn: end it now, and play the answer as soon as
  it comes. Until its first audio goes out, speech withdraws it (the session
  pushes it speculatively too), and its tool calls wait for the hangover.

How eager the rule is (``Eagerness``, as OpenAI's ``semantic_vad`` eagerness):

=========  ==========================================================================
low        END only for a command Home Assistant's own intent matching recognises
medium     also END for a complete sentence or question ("auto" is medium)
high       END for anything not unfinished
=========  ==========================================================================

A complete sentence: the STT closed it with ``.``, ``?`` or ``!``, or (STT engines
that do not punctuate) at least three words that end on a word that finishes a
phrase (not an article, preposition, conjunction, auxiliary, filler or number;
"on", "off", "up" and "down" finish one: "turn the lights off").
Unfinished text waits at every level; a recognised command ends at every level.
The rule is English-only in its word lists (other languages rely on punctuation
and the intent matcher); it runs in microseconds and needs no model.
"""

from __future__ import annotations

import enum
import re

__all__ = ["Eagerness", "TurnVerdict", "judge_turn", "same_words", "unfinished"]


class Eagerness(enum.StrEnum):
    """How soon a short silence may end the user's turn."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    AUTO = "auto"  # medium

    @property
    def level(self) -> Eagerness:
        """The level that applies (``auto`` is ``medium``)."""
        return Eagerness.MEDIUM if self is Eagerness.AUTO else self


class TurnVerdict(enum.StrEnum):
    """What a short silence means for the turn (see the module docstring)."""

    WAIT = "wait"
    HOLD = "hold"
    END = "end"


# Words after which an English phrase goes on: articles, possessives, prepositions,
# conjunctions and fillers, whatever the punctuation ("Turn on the." is a fragment).
_ALWAYS_OPEN = frozenset(
    """
    a an the my your his her its our their some any every to in of for at with from
    by into onto about over under than as like near and or but so because then if
    when while unless until whether whose um uh er erm hmm ah eh mm
    """.split()  # noqa: SIM905 - a word list reads best as words
)
# ... and words that end a phrase only when the STT closed it ("What is that?"):
# demonstratives, auxiliaries, the verbs and question words a command starts with.
_OPEN_UNLESS_CLOSED = frozenset(
    """
    this that these those which who no is are was were be been am do does did can
    could would should will shall may might must have has had not also just turn
    switch set make put open close lock unlock start play dim show tell give let
    what where how why whats
    """.split()  # noqa: SIM905 - a word list reads best as words
)
_NUMBERS = frozenset(
    """
    zero one two three four five six seven eight nine ten eleven twelve thirteen
    fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty
    sixty seventy eighty ninety hundred thousand half quarter
    """.split()  # noqa: SIM905 - a word list reads best as words
)
_WORD = re.compile(r"[\w']+")
_TRAILING_OPEN = ("...", "…", ",", ";", ":", "-", "–", "—")
_CLOSED = (".", "?", "!", "。", "？", "！")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def same_words(first: str, second: str) -> bool:
    """Return True when two transcripts say the same words (case, punctuation aside)."""
    return _words(first) == _words(second)


def unfinished(text: str) -> bool:
    """Return True when ``text`` plainly goes on (or holds no words)."""
    stripped = text.strip()
    words = _words(stripped)
    if not words:
        return True
    if stripped.endswith(_TRAILING_OPEN):
        return True
    last = words[-1]
    if last in _ALWAYS_OPEN:
        return True
    return last in _OPEN_UNLESS_CLOSED and not stripped.endswith(_CLOSED)


def _complete_sentence(text: str) -> bool:
    stripped = text.strip()
    if stripped.endswith(_CLOSED):
        return True
    words = _words(stripped)
    last = words[-1]
    return len(words) >= 3 and last not in _NUMBERS and not last.isdigit()


def judge_turn(
    text: str, eagerness: Eagerness = Eagerness.AUTO, *, recognised: bool = False
) -> TurnVerdict:
    """Judge the words said up to a short silence.

    ``recognised``: Home Assistant's intent matching recognised ``text`` as a whole
    command (the HA side asks it; False when it cannot be asked).
    """
    if unfinished(text):
        return TurnVerdict.WAIT
    if recognised:
        return TurnVerdict.END
    level = eagerness.level
    if level is Eagerness.HIGH:
        return TurnVerdict.END
    if level is Eagerness.MEDIUM and _complete_sentence(text):
        return TurnVerdict.END
    return TurnVerdict.HOLD
