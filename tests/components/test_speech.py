"""Spoken text: splitting an answer into deltas and joining its parts."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.speech import join_parts, split_speech


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Done",
        "  leading space kept. Second sentence!",
        "Sorry, Bed Light is not exposed",
        "One. Two? Three! Four… Five。",
        "Averyveryveryveryveryverylongwordwithoutbreaks and more",
        "Trailing spaces   ",
        "   ",
    ],
)
def test_split_speech_keeps_every_character(text: str) -> None:
    """Joining the pieces gives the text back exactly; pieces stay short."""
    pieces = split_speech(text)
    assert "".join(pieces) == text
    assert all(pieces)
    for piece in pieces:
        if " " in piece.strip():
            assert len(piece.strip()) <= 24


def test_split_speech_breaks_at_sentences() -> None:
    """Each sentence ends a piece."""
    assert split_speech("Yes. It is on. Done!") == ["Yes. ", "It is on. ", "Done!"]
    assert split_speech("Turned on the lights in the kitchen and the hall") == [
        "Turned on the lights in ",
        "the kitchen and the hall",
    ]


@pytest.mark.parametrize(
    ("parts", "spoken"),
    [
        (["Let me check.", "The light is on."], "Let me check. The light is on."),
        (["Let me check", "The light is on."], "Let me check. The light is on."),
        (["One moment:", "done."], "One moment: done."),
        (["Okay! ", " It is on."], "Okay! It is on."),
        (["", "Only after the tool.", "  "], "Only after the tool."),
        (
            ["少々お待ちください", "電気をつけました。"],
            "少々お待ちください。電気をつけました。",
        ),
        (["好的。", "灯开了。"], "好的。灯开了。"),
        ([], ""),
    ],
)
def test_join_parts_reads_as_one_answer(parts: list[str], spoken: str) -> None:
    """The parts before and after a tool call are separate sentences."""
    assert join_parts(parts) == spoken
