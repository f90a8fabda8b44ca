"""The end-of-turn setting of a duplex satellite maps onto the session's options."""

from __future__ import annotations

import pytest

from custom_components.rtvoice.const import CONF_TURN_EAGERNESS
from custom_components.rtvoice.duplex import Eagerness
from custom_components.rtvoice.duplex_ha import satellite_eagerness, satellite_options


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (None, Eagerness.AUTO),  # not stored: the default (auto)
        ("auto", Eagerness.AUTO),
        ("low", Eagerness.LOW),
        ("medium", Eagerness.MEDIUM),
        ("high", Eagerness.HIGH),
        ("off", None),
        ("bogus", None),  # a bad stored value: off
    ],
)
def test_stored_eagerness_becomes_the_option(
    stored: str | None, expected: Eagerness | None
) -> None:
    """Each stored value gives its level; off turns the rule off."""
    conf = {} if stored is None else {CONF_TURN_EAGERNESS: stored}
    assert satellite_eagerness(conf) is expected
    assert satellite_options(conf).eagerness is expected
