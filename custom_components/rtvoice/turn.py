"""What Home Assistant told us about the current turn of a conversation.

Its own small module so the brains, the tool runner and the session layer can all
read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import intent


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


class Turns:
    """The latest ``TurnContext`` per child, shared by a brain's parts."""

    def __init__(self, hass: HomeAssistant) -> None:
        """Start with no turn."""
        self._hass = hass
        self._turns: dict[str, TurnContext] = {}
        # The delegated agent's last answer per child (its response type, error code).
        self.replies: dict[str, intent.IntentResponse] = {}

    def get(self, child_id: str | None) -> TurnContext:
        """Return the child's turn, or a neutral one (no user, HA's language)."""
        turn = self._turns.get(child_id) if child_id is not None else None
        if turn is None:
            turn = TurnContext(
                context=Context(),
                language=self._hass.config.language,
                conversation_id=child_id,
            )
        return turn

    def set(self, child_id: str, turn: TurnContext) -> None:
        """Remember the child's current turn; the agent has not answered it yet."""
        self._turns[child_id] = turn
        self.replies.pop(child_id, None)  # a new turn: no answer of the agent yet

    def pop(self, child_id: str) -> None:
        """Forget the child."""
        self._turns.pop(child_id, None)
        self.replies.pop(child_id, None)
