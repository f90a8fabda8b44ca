"""Spoken text: split an answer into deltas, join the parts of one answer.

No Home Assistant import: plain text in, plain text out.
"""

from __future__ import annotations

from collections.abc import Iterable
import re
from typing import Final

# Longest piece of a spoken answer sent as one delta (split at word boundaries).
SPEECH_PIECE_CHARS: Final = 24
_SENTENCE_END: Final = re.compile(r"[.!?…。！？]+[\"')\]]*$")
_WORD: Final = re.compile(r"\S+\s*")
# Scripts written without spaces between sentences (CJK).
_NO_SPACE_SCRIPT: Final = re.compile(
    r"[\u3000-\u30ff\u3400-\u9fff\uac00-\ud7af\uff00-\uffef]$"
)


def split_speech(text: str, limit: int = SPEECH_PIECE_CHARS) -> list[str]:
    """Split a spoken answer into a few deltas at sentence and word boundaries.

    Joining the pieces gives back ``text`` exactly.
    """
    pieces: list[str] = []
    current = ""
    lead = text[: len(text) - len(text.lstrip())]
    for match in _WORD.finditer(text):
        word = match.group()
        if current and len(current) + len(word.rstrip()) > limit:
            pieces.append(current)
            current = ""
        current += word
        if _SENTENCE_END.search(word.rstrip()):
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    if lead:
        if pieces:
            pieces[0] = lead + pieces[0]
        else:
            pieces.append(lead)
    return pieces


def join_parts(parts: Iterable[str]) -> str:
    """Join the texts of one answer's model calls as a person would read them.

    The text before a tool call and the text after it are two utterances: they are
    separated by a space, and a part that stopped mid-sentence ends with a full
    stop first ("Let me check" + "It is on." -> "Let me check. It is on."). Text in
    a script without spaces (CJK) is joined without one. Empty parts vanish.
    """
    joined = ""
    for part in parts:
        text = part.strip()
        if not text:
            continue
        if not joined:
            joined = text
            continue
        no_space = _NO_SPACE_SCRIPT.search(joined) is not None
        if not _SENTENCE_END.search(joined) and joined[-1].isalnum():
            joined += "。" if no_space else "."
        joined += ("" if no_space else " ") + text
    return joined


_COMPLETE_SENTENCE: Final = re.compile(r"[.!?…。！？]+[\"')\]]*(?:\s|$)")


def complete_sentences_end(text: str) -> int:
    """Return how many leading characters of ``text`` form complete sentences.

    A sentence is complete once its closing punctuation is followed by whitespace
    (or, for scripts without spaces, by anything): a streaming TTS speaks it
    while the rest is still being generated. 0 when no sentence is complete yet.
    """
    end = 0
    for match in _COMPLETE_SENTENCE.finditer(text):
        if match.end() < len(text) or _NO_SPACE_SCRIPT.search(text[: match.start()]):
            end = match.end()
    return end
