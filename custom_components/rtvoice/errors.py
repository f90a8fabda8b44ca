"""Errors of the Home Assistant side (the kernel has its own, in kernel.errors).

They are Home Assistant errors, not kernel errors: the actions and the control LLM
API turn them into messages that say what to do instead.
"""

from __future__ import annotations

from homeassistant.core import Context
from homeassistant.exceptions import (
    HomeAssistantError,
    ServiceValidationError,
    Unauthorized,
)

from .const import DOMAIN


class RtVoiceError(HomeAssistantError):
    """Base of the errors of Realtime Voice's Home Assistant side."""


class UnknownSatelliteError(RtVoiceError):
    """The named satellite is not an ``assist_satellite`` this entry knows."""


class UnknownConversationError(RtVoiceError):
    """No live conversation has that id (unknown, closing or ended)."""


class EmptyInputError(RtVoiceError):
    """The text sent to a conversation is empty or blank."""


class NotAllowedError(Unauthorized, ServiceValidationError):
    """The caller may not do this (docs/actions.md, "Who may call what").

    An ``Unauthorized`` (REST answers 401, scripts see HA's own error type) that is
    also a ``ServiceValidationError``: HA 2025.4's websocket API logs every other
    error of an action as "Unexpected exception" with a traceback, but a validation
    error as one line. The message is translated (``exceptions`` in en.json).
    """

    def __init__(
        self,
        context: Context | None,
        translation_key: str,
        translation_placeholders: dict[str, str] | None = None,
    ) -> None:
        """Refuse the caller of ``context``; the message is ``translation_key``."""
        super().__init__(context=context)
        self.translation_domain = DOMAIN
        self.translation_key = translation_key
        self.translation_placeholders = translation_placeholders
        self.generate_message = True
        self.args = (translation_key,)
