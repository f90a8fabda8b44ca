"""Sentence splitting of streamed deltas."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.duplex.sentences import Sentence, SentenceSplitter


def split(text: str, *, chunk: int = 1, **options) -> list[str]:
    """Feed ``text`` in ``chunk``-sized deltas, flush, return the sentence texts."""
    splitter = SentenceSplitter(early_min_chars=0, **options)
    out: list[Sentence] = []
    for i in range(0, len(text), chunk):
        out += splitter.feed(text[i : i + chunk])
    out += splitter.flush()
    for sentence in out:
        assert text[sentence.start : sentence.end] == sentence.text
    return [s.text for s in out]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there. How are you?", ["Hello there.", "How are you?"]),
        ("It is 3.5 degrees. Nice.", ["It is 3.5 degrees.", "Nice."]),
        ("It costs 1,250.75 euros! Wow", ["It costs 1,250.75 euros!", "Wow"]),
        ("Use e.g. the kitchen. Done.", ["Use e.g. the kitchen.", "Done."]),
        ("Ask Dr. Smith now. Ok.", ["Ask Dr. Smith now.", "Ok."]),
        ("J. R. R. Tolkien wrote it.", ["J. R. R. Tolkien wrote it."]),
        ("Wait... what was that?", ["Wait... what was that?"]),
        ("Hmm... Let me see.", ["Hmm...", "Let me see."]),
        ("Well… Fine.", ["Well…", "Fine."]),
        ("Lights:\n1. Kitchen\n2. Hall", ["Lights:", "1. Kitchen", "2. Hall"]),
        ("Para one\n\nPara two.", ["Para one", "Para two."]),
        ('He said "stop." Then left.', ['He said "stop."', "Then left."]),
        ("Really?! Yes.", ["Really?!", "Yes."]),
        ("See example.com for more.", ["See example.com for more."]),
        ("It is 10 a.m. now.", ["It is 10 a.m. now."]),
        ("Version 2.0.1 is out", ["Version 2.0.1 is out"]),
        ("   ", []),
        ("", []),
    ],
)
def test_sentences(text: str, expected: list[str], chunk: int) -> None:
    """Boundaries are the same however the text is cut into deltas."""
    assert split(text, chunk=chunk) == expected


def test_period_waits_for_the_next_character() -> None:
    """A period at the end of a delta is judged when the next character arrives."""
    splitter = SentenceSplitter(early_min_chars=0)
    assert splitter.feed("It is done.") == []
    assert splitter.feed(" ") == []
    assert [s.text for s in splitter.feed("Next")] == ["It is done."]
    assert [s.text for s in splitter.flush()] == ["Next"]


def test_question_mark_needs_only_the_space() -> None:
    """'?' and '!' end a sentence as soon as white space follows."""
    splitter = SentenceSplitter(early_min_chars=0)
    assert [s.text for s in splitter.feed("Is it on? ")] == ["Is it on?"]


def test_spans_count_in_the_rounds_text() -> None:
    """Spans index the concatenated deltas, white space included."""
    text = "  First one.   Second one!\nThird"
    splitter = SentenceSplitter(early_min_chars=0)
    out = splitter.feed(text) + splitter.flush()
    assert [(s.start, s.end) for s in out] == [(2, 12), (15, 26), (27, 32)]
    assert splitter.length == len(text)


def test_first_clause_is_released_early() -> None:
    """Only the first sentence of a round is cut at a clause, and only when long enough."""
    splitter = SentenceSplitter(early_min_chars=24)
    out = splitter.feed("Sure, ")  # too short to release
    out += splitter.feed("I have turned on the kitchen light, and the hall light, ")
    out += splitter.feed("too. Anything else, maybe the porch? ")
    assert [s.text for s in out] == [
        "Sure, I have turned on the kitchen light,",
        "and the hall light, too.",
        "Anything else, maybe the porch?",
    ]


def test_long_run_without_boundary_is_cut_at_a_space() -> None:
    """A sentence that never ends is cut at the last space before max_chars."""
    words = "word " * 40
    out = split(words, max_chars=50)
    assert all(len(s) <= 50 for s in out)
    assert " ".join(out) == words.strip()


def test_flush_ends_the_round() -> None:
    """Flush returns the tail; a new splitter is used per round."""
    splitter = SentenceSplitter(early_min_chars=0)
    splitter.feed("No period at the end")
    (last,) = splitter.flush()
    assert last == Sentence("No period at the end", 0, 20)
    assert splitter.flush() == []
