"""Errors of the Home Assistant side (the kernel has its own, in kernel.errors).

They are Home Assistant errors, not kernel errors: the actions and the control LLM
API turn them into messages that say what to do instead.
"""

from __future__ import annotations

from homeassistant.exceptions import HomeAssistantError


class RtVoiceError(HomeAssistantError):
    """Base of the errors of Realtime Voice's Home Assistant side."""


class UnknownSatelliteError(RtVoiceError):
    """The named satellite is not an ``assist_satellite`` this entry knows."""


class UnknownConversationError(RtVoiceError):
    """No live conversation has that id (unknown, closing or ended)."""


class EmptyInputError(RtVoiceError):
    """The text sent to a conversation is empty or blank."""
