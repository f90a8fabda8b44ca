"""The conversation entity of Realtime Voice (pipeline mode, DESIGN §5.3).

A thin shell: every turn goes to ``SessionManager.async_converse``, which routes it to
the conversation's kernel child, streams the answer into HA's chat log and turns a
cancelled call (a new pipeline run on the same satellite) into an interruption.
"""

from __future__ import annotations

from typing import Literal

from homeassistant.components import conversation
from homeassistant.const import MATCH_ALL
from homeassistant.core import HomeAssistant
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .entity import RtVoiceEntity
from .runtime import RtVoiceConfigEntry

# Turns are independent calls into the entry's sessions, which serialise what needs
# it themselves; Home Assistant need not serialise anything.
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the conversation entity of an entry."""
    async_add_entities([RtVoiceConversationEntity(entry)])


class RtVoiceConversationEntity(
    RtVoiceEntity,
    conversation.ConversationEntity,
    conversation.AbstractConversationAgent,
):
    """Realtime Voice as a conversation agent (named like its device)."""

    _attr_name = None

    def __init__(self, entry: RtVoiceConfigEntry) -> None:
        """Create the entity of an entry."""
        super().__init__(entry)
        self.entry = entry
        self._attr_unique_id = entry.entry_id
        if entry.runtime_data.tools is not None:
            self._attr_supported_features = (
                conversation.ConversationEntityFeature.CONTROL
            )
        # Newer HA streams the chat log into TTS when the entity says it streams.
        if hasattr(conversation.ConversationEntity, "_attr_supports_streaming"):
            self._attr_supports_streaming = True  # pragma: no cover - HA > 2025.4

    @property
    def supported_languages(self) -> list[str] | Literal["*"]:
        """Every language: the model answers in the user's language."""
        return MATCH_ALL

    async def async_added_to_hass(self) -> None:
        """Register as the agent of the entry."""
        await super().async_added_to_hass()
        conversation.async_set_agent(self.hass, self.entry, self)

    async def async_will_remove_from_hass(self) -> None:
        """Unregister the agent."""
        conversation.async_unset_agent(self.hass, self.entry)
        await super().async_will_remove_from_hass()

    async def _async_handle_message(
        self,
        user_input: conversation.ConversationInput,
        chat_log: conversation.ChatLog,
    ) -> conversation.ConversationResult:
        """Answer one turn through the entry's sessions."""
        return await self.entry.runtime_data.sessions.async_converse(
            user_input, chat_log, self.entity_id
        )
