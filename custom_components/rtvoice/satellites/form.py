"""The settings every owned satellite has, as form fields (ESPHome and Wyoming).

Barge-in, server echo cancellation, end silence and end of turn; a Wyoming
satellite also chooses its wake word. Echo cancellation cannot be switched on
where no canceller can run (the form says why); ``vad`` without it is allowed (a
board with its own echo cancellation needs none) and the description warns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import voluptuous as vol

from homeassistant.helpers.selector import (
    BooleanSelector,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
)

from ..audio.wakeword import MODELS
from ..const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_TURN_EAGERNESS,
    CONF_WAKE_WORD,
    DEFAULT_BARGE_IN,
    DEFAULT_ECHO_CANCELLATION,
    DEFAULT_END_SILENCE,
    DEFAULT_TURN_EAGERNESS,
)
from ..duplex import BargeIn, echo as duplex_echo
from ..flow_fields import number_selector
from ..wyoming_ha import DEFAULT_WAKE_WORD, WAKE_WORD_SATELLITE

MIN_END_SILENCE: Final = 1  # seconds of silence after an answer before the session ends
MAX_END_SILENCE: Final = 120
TURN_EAGERNESS_OPTIONS: Final = ["auto", "low", "medium", "high", "off"]
SETTINGS: Final = (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_TURN_EAGERNESS,
)


def wake_word_selector() -> SelectSelector:
    """Return a choice of the satellite's own wake word or a bundled model."""
    return SelectSelector(
        SelectSelectorConfig(
            options=[
                SelectOptionDict(value=WAKE_WORD_SATELLITE, label="On the satellite"),
                *(SelectOptionDict(value=m.id, label=m.name) for m in MODELS),
            ],
            mode=SelectSelectorMode.DROPDOWN,
        )
    )


def settings_fields() -> dict[vol.Marker, Any]:
    """Return the fields of a satellite's settings (barge-in to end of turn)."""
    return {
        vol.Required(CONF_BARGE_IN, default=DEFAULT_BARGE_IN): SelectSelector(
            SelectSelectorConfig(
                options=[mode.value for mode in BargeIn],
                translation_key=CONF_BARGE_IN,
                mode=SelectSelectorMode.LIST,
            )
        ),
        vol.Required(
            CONF_ECHO_CANCELLATION, default=DEFAULT_ECHO_CANCELLATION
        ): BooleanSelector(),
        vol.Required(CONF_END_SILENCE, default=DEFAULT_END_SILENCE): number_selector(
            MIN_END_SILENCE, MAX_END_SILENCE, unit="s"
        ),
        vol.Required(
            CONF_TURN_EAGERNESS, default=DEFAULT_TURN_EAGERNESS
        ): SelectSelector(
            SelectSelectorConfig(
                options=TURN_EAGERNESS_OPTIONS,
                translation_key=CONF_TURN_EAGERNESS,
                mode=SelectSelectorMode.DROPDOWN,
            )
        ),
    }


def current_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
    """Return a satellite's stored settings, defaults for those never set."""
    return {
        CONF_BARGE_IN: conf.get(CONF_BARGE_IN, DEFAULT_BARGE_IN),
        CONF_ECHO_CANCELLATION: conf.get(
            CONF_ECHO_CANCELLATION, DEFAULT_ECHO_CANCELLATION
        ),
        CONF_END_SILENCE: conf.get(CONF_END_SILENCE, DEFAULT_END_SILENCE),
        CONF_TURN_EAGERNESS: conf.get(CONF_TURN_EAGERNESS, DEFAULT_TURN_EAGERNESS),
    }


def current_wake_word(conf: Mapping[str, Any]) -> str:
    """Return a Wyoming satellite's stored wake word choice."""
    return str(conf.get(CONF_WAKE_WORD, DEFAULT_WAKE_WORD))


def settings_from_input(
    user_input: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Return the typed settings of a submitted form and the form's errors."""
    echo = bool(user_input[CONF_ECHO_CANCELLATION])
    if echo and duplex_echo.unavailable_reason() is not None:
        return {}, {CONF_ECHO_CANCELLATION: "echo_cancellation_unavailable"}
    return {
        CONF_BARGE_IN: str(user_input[CONF_BARGE_IN]),
        CONF_ECHO_CANCELLATION: echo,
        CONF_END_SILENCE: int(user_input[CONF_END_SILENCE]),
        CONF_TURN_EAGERNESS: str(
            user_input.get(CONF_TURN_EAGERNESS, DEFAULT_TURN_EAGERNESS)
        ),
    }, {}


def echo_placeholder() -> str:
    """Say whether server echo cancellation can run here (a form placeholder)."""
    reason = duplex_echo.unavailable_reason()
    return "available" if reason is None else f"not available here: {reason}"
