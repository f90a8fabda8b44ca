"""Whether the brain answers: logged once when it stops, once when it is back.

One warning when a round fails after a working one (the error type and a short
message, the API key masked), one info line when a round completes again; failures
in between are logged at debug level. Cut rounds (interrupted, superseded) say
nothing either way. Never the user's words.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import callback

from .const import BRAIN_HA_AGENT, CONF_API_KEY
from .kernel import Outcome
from .redact import mask_secret

_LOGGER = logging.getLogger(__name__)

MAX_LOGGED_ERROR: Final = 200  # characters of an error message in the log


class BrainAvailability:
    """Follows the outcomes of an entry's rounds and logs outages once."""

    def __init__(self, entry: ConfigEntry, brain_kind: str) -> None:
        """Start as available."""
        self._entry = entry
        if brain_kind == BRAIN_HA_AGENT:
            self._name = f"The conversation agent of {entry.title}"
        else:
            self._name = f"The language model of {entry.title}"
        self._unavailable = False

    @callback
    def round_ended(self, future: asyncio.Future[Outcome]) -> None:
        """Take the outcome of a round (a done callback of its ticket)."""
        if future.cancelled():  # pragma: no cover - nobody cancels the outcome
            return
        outcome = future.result()
        if outcome.status == "failed":
            error = self._loggable_error(outcome)
            if self._unavailable:
                _LOGGER.debug("%s is still unavailable: %s", self._name, error)
                return
            self._unavailable = True
            _LOGGER.warning("%s is unavailable: %s", self._name, error)
        elif outcome.status == "completed" and self._unavailable:
            self._unavailable = False
            _LOGGER.info("%s is back", self._name)

    def _loggable_error(self, outcome: Outcome) -> str:
        """Error type and message, shortened, with the API key masked."""
        message = mask_secret(
            outcome.error or "no details", self._entry.data.get(CONF_API_KEY)
        )
        if len(message) > MAX_LOGGED_ERROR:
            message = message[: MAX_LOGGED_ERROR - 1] + "…"
        return f"{outcome.error_type or 'Error'}: {message}"
