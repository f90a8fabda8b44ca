"""The end-of-turn rule by what was said (duplex/turn.py), without hass."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.duplex.turn import (
    Eagerness,
    TurnVerdict,
    judge_turn,
    same_words,
    unfinished,
)

END, HOLD, WAIT = TurnVerdict.END, TurnVerdict.HOLD, TurnVerdict.WAIT


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "turn on the",
        "Turn on the.",  # an STT that closes every fragment
        "and then",
        "set a timer for",
        "what is the weather in",
        "um",
        "turn on the kitchen lights and",
        "I think,",
        "so...",
        "what is",
        "can you tell",
    ],
)
def test_unfinished_words_wait_at_every_level(text: str) -> None:
    """Unfinished words wait at every level."""
    assert unfinished(text)
    for eagerness in Eagerness:
        assert judge_turn(text, eagerness) is WAIT
        # ... even when something recognised them (a recogniser's false match)
        assert judge_turn(text, eagerness, recognised=True) is WAIT


@pytest.mark.parametrize(
    "text",
    [
        "turn on the kitchen lights",
        "Turn the lights off.",
        "What is that?",
        "stop",
        "turn the lights on please",
    ],
)
def test_finished_words_are_not_unfinished(text: str) -> None:
    """Finished words are not unfinished."""
    assert not unfinished(text)


def test_a_recognised_command_ends_the_turn_at_every_level() -> None:
    """A recognised command ends the turn at every level."""
    for eagerness in Eagerness:
        assert judge_turn("kitchen lights on", eagerness, recognised=True) is END


@pytest.mark.parametrize(
    ("text", "low", "medium", "high"),
    [
        # a complete sentence: punctuated, or three words on a closing word
        ("What time is it?", HOLD, END, END),
        ("turn off the kitchen lights", HOLD, END, END),
        ("Tell me a joke.", HOLD, END, END),
        # too short or ending on a number: maybe not over ("ten ... minutes")
        ("lights on", HOLD, HOLD, END),
        ("set a timer for ten", HOLD, HOLD, END),
        ("set it to 21", HOLD, HOLD, END),
        ("stop", HOLD, HOLD, END),
    ],
)
def test_eagerness_levels(text: str, low, medium, high) -> None:
    """Eagerness levels."""
    assert judge_turn(text, Eagerness.LOW) is low
    assert judge_turn(text, Eagerness.MEDIUM) is medium
    assert judge_turn(text, Eagerness.HIGH) is high
    assert judge_turn(text, Eagerness.AUTO) is medium


def test_auto_is_medium() -> None:
    """Auto is medium."""
    assert Eagerness.AUTO.level is Eagerness.MEDIUM
    assert Eagerness.LOW.level is Eagerness.LOW


def test_same_words_ignore_case_and_punctuation() -> None:
    """A heard early end stands when the whole utterance says the same words."""
    assert same_words("turn off the lights", "Turn off the lights.")
    assert not same_words("turn off the lights", "turn off the lights in the hall")
    assert not same_words("turn off the lights", "")
