"""What Home Assistant told us about the current turn of a conversation.

Its own small module so the brains, the tool runner and the session layer can all
read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeassistant.core import Context


@dataclass
class TurnContext:
    """What HA told us about the current turn of a session.

    ``prompt_scope`` is the kernel prompt scope of the conversation: the satellite's
    entity id, or the conversation's own id when it has no satellite. Prompt sections
    that hold for this conversation only (HA's LLM API prompt names the device's
    area) are declared in it.
    """

    context: Context  # homeassistant.core.Context of the caller
    language: str
    device_id: str | None = None
    satellite_id: str | None = None  # assist_satellite entity id, if known
    conversation_id: str | None = None  # the session id (= kernel child id)
    prompt_scope: str | None = None
