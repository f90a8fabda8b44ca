"""The conversation entity of Realtime Voice (pipeline mode, DESIGN §5.3).

A thin shell: every turn goes to ``SessionManager.async_converse``, which routes it to
the conversation's kernel child, streams the answer into HA's chat log and turns a
cancelled call (a new pipeline run on the same satellite) into an interruption.

A satellite's turn also ends when a newer run of that satellite starts listening
while the turn is answered: its caller (the old pipeline) is cancelled, as Home
Assistant itself does when it still knows that pipeline. HA 2025.4's esphome
satellite can lose track of a running pipeline when starts and aborts come back to
back (``_pipeline_task`` is written by the start handler, by
``async_accept_pipeline_from_satellite`` and cleared by an older run's ``finally``;
docs/benchmarks.md, row 10), and the stale answer then went on until the next words
closed the conversation, or until the model server's read timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
import contextlib
import logging
from typing import Literal

from homeassistant.components import conversation
from homeassistant.components.assist_satellite.entity import AssistSatelliteState
from homeassistant.const import EVENT_STATE_CHANGED, MATCH_ALL
from homeassistant.core import Event, EventStateChangedData, HomeAssistant, callback
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .entity import RtVoiceEntity
from .runtime import RtVoiceConfigEntry
from .sessions.routing import route_key

_LOGGER = logging.getLogger(__name__)

# Turns are independent calls into the entry's sessions, which serialise what needs
# it themselves; Home Assistant need not serialise anything.
PARALLEL_UPDATES = 0


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Set up the conversation entity of an entry."""
    async_add_entities([RtVoiceConversationEntity(hass, entry)])


class RtVoiceConversationEntity(
    RtVoiceEntity,
    conversation.ConversationEntity,
    conversation.AbstractConversationAgent,
):
    """Realtime Voice as a conversation agent (named like its device)."""

    _attr_name = None

    def __init__(self, hass: HomeAssistant, entry: RtVoiceConfigEntry) -> None:
        """Create the entity of an entry."""
        super().__init__(hass, entry)
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
        runtime = self.entry.runtime_data
        satellite, _key = route_key(user_input, runtime.satellites)
        try:
            with self._ended_by_a_new_run(satellite):
                return await runtime.sessions.async_converse(
                    user_input, chat_log, self.entity_id
                )
        except asyncio.CancelledError:
            # A barge-in (a new pipeline run) cancels the caller; the sessions cut
            # the round. Logged to tell a missing cancel from a lost one.
            _LOGGER.debug(
                "Turn on %s cancelled (conversation %s)",
                satellite or user_input.device_id or "no satellite",
                chat_log.conversation_id,
            )
            raise

    @contextlib.contextmanager
    def _ended_by_a_new_run(self, satellite: str | None) -> Iterator[None]:
        """Cancel the calling pipeline when a newer run of its satellite listens.

        Only for a caller that is the satellite's own run: the satellite is
        processing (this run's intent stage) when the turn starts. A later switch
        to listening is a newer run's STT start (HA emits it as a run begins), so
        the user is speaking again and this answer is stale. When HA cancelled the
        old pipeline itself, as it normally does, the turn has ended before that.
        """
        task = asyncio.current_task()
        state = self.hass.states.get(satellite) if satellite else None
        if (
            satellite is None
            or task is None
            or state is None
            or state.state != AssistSatelliteState.PROCESSING
        ):
            yield
            return

        @callback
        def _is_satellite(event_data: EventStateChangedData) -> bool:
            return event_data["entity_id"] == satellite

        @callback
        def _on_state(event: Event[EventStateChangedData]) -> None:
            new = event.data["new_state"]
            if new is None or new.state != AssistSatelliteState.LISTENING:
                return
            if task.done() or task.cancelling():
                return
            _LOGGER.debug(
                "A new run listens on %s while its previous turn is answered:"
                " cancelling that turn's pipeline (Home Assistant did not)",
                satellite,
            )
            task.cancel()

        # Straight from the bus, not async_track_state_change_event (which
        # dispatches a loop iteration later): the turn is cancelled before the new
        # run can reach the agent, so the new words continue this conversation.
        unsubscribe = self.hass.bus.async_listen(
            EVENT_STATE_CHANGED, _on_state, event_filter=_is_satellite
        )
        try:
            yield
        finally:
            unsubscribe()
