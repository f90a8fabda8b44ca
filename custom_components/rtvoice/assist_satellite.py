"""One ``assist_satellite`` entity per duplex ESPHome satellite (issue 10).

The entity sits on the satellite's own device (name and MAC from its device info,
so it joins the device HA's esphome integration made for the same board), is
available while the link is connected, and its state follows the duplex session:
idle (no conversation), listening, responding (the answer or an announcement
plays). What HA's satellite features need, as HA's esphome entity does it:

- the pipeline select on the same device (``select.py``) chooses the pipeline
  whose STT and TTS the duplex conversations use (``pipeline_entity_id``);
- announcements (``ANNOUNCE``) play on the device through its voice assistant
  (``VoiceAssistantAnnounceRequest``); one that arrives during a conversation
  closes that conversation first, as HA cancels a running pipeline;
- ``START_CONVERSATION``: the conversation opens (the announced text in its
  history as what the assistant said, the action's ``extra_system_prompt`` in its
  system prompt), the announcement plays, then the device listens and its start
  resumes that conversation;
- the wake word configuration is the device's own (read when the link connects);
- timers (``TIMERS``): HA's timer events for the satellite's device go to the
  device (``VoiceAssistantTimerEventResponse``), as HA's esphome satellite's
  ``handle_timer_event`` sends them, so its timer LED and sound work in duplex.

Announce and start_conversation are offered when the device's firmware reports
them (its voice assistant feature flags).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import contextlib
import logging
from typing import Any

from aioesphomeapi import (
    APIConnectionError,
    VoiceAssistantFeature,
    VoiceAssistantTimerEventType,
)

from homeassistant.components.assist_pipeline import PipelineEvent
from homeassistant.components.assist_satellite import (
    AssistSatelliteAnnouncement,
    AssistSatelliteConfiguration,
    AssistSatelliteEntity,
    AssistSatelliteEntityFeature,
    AssistSatelliteWakeWord,
)
from homeassistant.components.assist_satellite.entity import AssistSatelliteState
from homeassistant.components.intent import (
    TimerEventType,
    TimerInfo,
    async_register_timer_handler,
)
from homeassistant.const import Platform
from homeassistant.core import HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback

from .audio.wakeword import MODELS as WAKE_WORD_MODELS, MODELS_BY_ID as WAKE_WORD_IDS
from .const import CONF_WAKE_WORD, DOMAIN, SUBENTRY_ESPHOME, SUBENTRY_WYOMING
from .duplex import SessionState
from .duplex_ha import (
    SIGNAL_DUPLEX_UPDATE,
    TTS_OPTIONS,
    DuplexSatellites,
    satellite_device_info,
    satellite_unique_id,
)
from .runtime import RtVoiceConfigEntry
from .satellites.stored import subentry_ids
from .wyoming_ha import (
    SIGNAL_WYOMING_UPDATE,
    WAKE_WORD_SATELLITE,
    WyomingSatellites,
    wake_word_of,
    wyoming_device_info,
    wyoming_unique_id,
)

_LOGGER = logging.getLogger(__name__)

PARALLEL_UPDATES = 0

_STATES = {
    SessionState.LISTENING: AssistSatelliteState.LISTENING,
    SessionState.PAUSED: AssistSatelliteState.LISTENING,  # the user talks over
    SessionState.SPEAKING: AssistSatelliteState.RESPONDING,
    SessionState.RESUMING: AssistSatelliteState.RESPONDING,
}

_FEATURES = {
    VoiceAssistantFeature.ANNOUNCE: AssistSatelliteEntityFeature.ANNOUNCE,
    VoiceAssistantFeature.START_CONVERSATION: (
        AssistSatelliteEntityFeature.START_CONVERSATION
    ),
}


# HA's timer events as the device knows them (HA esphome's _TIMER_EVENT_TYPES).
_TIMER_EVENTS = {
    TimerEventType.STARTED: VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_STARTED,
    TimerEventType.UPDATED: VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_UPDATED,
    TimerEventType.CANCELLED: (
        VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_CANCELLED
    ),
    TimerEventType.FINISHED: (
        VoiceAssistantTimerEventType.VOICE_ASSISTANT_TIMER_FINISHED
    ),
}


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Add an entity per stored satellite, in its subentry (with its device)."""
    duplex = entry.runtime_data.duplex
    subentries = subentry_ids(entry, SUBENTRY_ESPHOME)
    for key in duplex.configs:
        async_add_entities(
            [DuplexSatelliteEntity(entry, duplex, key)],
            config_subentry_id=subentries.get(key),
        )
    wyoming = entry.runtime_data.wyoming
    subentries = subentry_ids(entry, SUBENTRY_WYOMING)
    for key in wyoming.configs:
        async_add_entities(
            [WyomingSatelliteEntity(entry, wyoming, key)],
            config_subentry_id=subentries.get(key),
        )


class DuplexSatelliteEntity(AssistSatelliteEntity):
    """A duplex ESPHome satellite owned by Realtime Voice."""

    _attr_has_entity_name = True
    _attr_should_poll = False
    _attr_name = None  # the device's name
    _attr_supported_features = AssistSatelliteEntityFeature(0)
    # Announcements as the duplex answers: 16 kHz mono WAV (every ESPHome media
    # player plays it; the link does not read the device's media formats).
    _attr_tts_options = dict(TTS_OPTIONS)

    def __init__(
        self, entry: RtVoiceConfigEntry, duplex: DuplexSatellites, key: str
    ) -> None:
        """Describe the satellite from what was stored when it was added."""
        self._duplex = duplex
        self._key = key
        self._entry = entry
        self._attr_unique_id = satellite_unique_id(entry.entry_id, key)
        self._attr_device_info = satellite_device_info(key, duplex.configs[key])
        self._attr_available = False
        # Placeholder until the device answers (as HA's esphome entity).
        self._configuration = AssistSatelliteConfiguration(
            available_wake_words=[], active_wake_words=[], max_active_wake_words=1
        )
        self._config_task: asyncio.Task[None] | None = None
        self._timers_unsubscribe: Callable[[], None] | None = None

    @property
    def pipeline_entity_id(self) -> str | None:
        """The pipeline select on the satellite's device."""
        return er.async_get(self.hass).async_get_entity_id(
            Platform.SELECT, DOMAIN, f"{self._attr_unique_id}-pipeline"
        )

    async def async_added_to_hass(self) -> None:
        """Follow the link; conversations render this satellite's prompt sections."""
        await super().async_added_to_hass()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                SIGNAL_DUPLEX_UPDATE.format(self._entry.entry_id, self._key),
                self._updated,
            )
        )
        self._duplex.set_prompt_scope(self._key, self.entity_id)
        self._updated()

    @callback
    def _updated(self) -> None:
        link = self._duplex.links.get(self._key)
        was_available = self._attr_available
        self._attr_available = link is not None and link.available
        if link is not None and self._attr_available:
            flags = link.voice_assistant_features
            features = AssistSatelliteEntityFeature(0)
            for flag, feature in _FEATURES.items():
                if flags & flag:
                    features |= feature
            self._attr_supported_features = features
            if not was_available:
                self._refresh_configuration()
            if flags & VoiceAssistantFeature.TIMERS:
                self._handle_timers()
        state = self._duplex.states.get(self._key)
        if state in _STATES:
            # A live session (after a start_conversation's announcement the
            # device may listen before HA's action has returned).
            new_state = _STATES[state]
        # HA's base class sets it around async_announce (read defensively: private).
        elif getattr(self, "_is_announcing", False):
            new_state = AssistSatelliteState.RESPONDING  # until it has played
        else:
            new_state = AssistSatelliteState.IDLE
        # Writes the state (called only once the entity is added).
        self._set_state(new_state)

    # --- timers -----------------------------------------------------------------------

    @callback
    def _handle_timers(self) -> None:
        """Receive the timer events of the satellite's device (once)."""
        entry = self.registry_entry
        if self._timers_unsubscribe is not None or entry is None or not entry.device_id:
            return
        self._timers_unsubscribe = async_register_timer_handler(
            self.hass, entry.device_id, self._handle_timer_event
        )
        self.async_on_remove(self._stop_timers)

    @callback
    def _stop_timers(self) -> None:
        if (unsubscribe := self._timers_unsubscribe) is not None:
            self._timers_unsubscribe = None
            unsubscribe()

    @callback
    def _handle_timer_event(
        self, event_type: TimerEventType, timer_info: TimerInfo
    ) -> None:
        """Send a timer event to the device (dropped while it is offline)."""
        native = _TIMER_EVENTS.get(event_type)
        link = self._duplex.links.get(self._key)
        if native is None or link is None:
            return
        link.send_timer_event(
            event_type=native,
            timer_id=timer_info.id,
            name=timer_info.name,
            total_seconds=timer_info.created_seconds,
            seconds_left=timer_info.seconds_left,
            is_active=timer_info.is_active,
        )

    # --- announcements --------------------------------------------------------------

    async def async_announce(self, announcement: AssistSatelliteAnnouncement) -> None:
        """Play the announcement on the device; return when it has played."""
        await self._duplex.async_announce(
            self._key,
            announcement.media_id,
            announcement.message,
            preannounce_media_id=announcement.preannounce_media_id,
        )

    async def async_internal_start_conversation(
        self, *args: Any, **kwargs: Any
    ) -> None:
        """Run HA's action, then show the session's state again.

        HA's base class sets the state to idle when the action returns; the
        device may be listening by then.
        """
        try:
            # Passed on as given: the arguments differ between HA versions.
            await super().async_internal_start_conversation(*args, **kwargs)
        finally:
            self._updated()

    async def async_start_conversation(
        self, start_announcement: AssistSatelliteAnnouncement
    ) -> None:
        """Announce, then the device listens; the reply lands in the conversation.

        The conversation opens before the announcement (with the message as what
        the assistant said, and HA's ``extra_system_prompt`` in its system
        prompt), unless ``rtvoice.start_conversation`` opened it already.
        """
        message = start_announcement.message
        # HA's base class keeps the action's extra_system_prompt here for the
        # pipeline it would run (the message itself when none was given; that
        # one is recorded as said instead). Read defensively: private.
        extra = getattr(self, "_extra_system_prompt", None)
        self._extra_system_prompt = None
        await self._duplex.async_start_conversation(
            self._key,
            start_announcement.media_id,
            message,
            preannounce_media_id=start_announcement.preannounce_media_id,
            extra_prompt=extra if isinstance(extra, str) and extra != message else None,
        )

    # --- wake word configuration ----------------------------------------------------

    @callback
    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        """Return the device's wake words, as last read from it."""
        return self._configuration

    async def async_set_configuration(
        self, config: AssistSatelliteConfiguration
    ) -> None:
        """Set the device's active wake words, then read its configuration back."""
        link = self._duplex.connected_link(self._key)
        try:
            await link.set_active_wake_words(config.active_wake_words)
        except APIConnectionError as err:
            raise self._duplex.unavailable(self._key) from err
        await self._async_read_configuration()

    @callback
    def _refresh_configuration(self) -> None:
        """Read the configuration in the background (the link just connected)."""
        self._cancel_config_task()
        self._config_task = self._entry.async_create_background_task(
            self.hass,
            self._async_read_configuration(),
            f"{DOMAIN} wake words {self._key}",
        )

    @callback
    def _cancel_config_task(self) -> None:
        task, self._config_task = self._config_task, None
        if task is not None and not task.done():
            task.cancel()

    async def _async_read_configuration(self) -> None:
        link = self._duplex.links.get(self._key)
        if link is None:
            return
        try:
            config = await link.voice_assistant_configuration()
        except (APIConnectionError, TimeoutError) as err:
            # The placeholder stays; the next connection reads it again.
            _LOGGER.debug(
                "No wake word configuration from %s: %s",
                self._key,
                type(err).__name__,
            )
            return
        self._configuration = AssistSatelliteConfiguration(
            available_wake_words=[
                AssistSatelliteWakeWord(
                    id=model.id,
                    wake_word=model.wake_word,
                    trained_languages=list(model.trained_languages),
                )
                for model in config.available_wake_words
            ],
            active_wake_words=list(config.active_wake_words),
            max_active_wake_words=config.max_active_wake_words,
        )

    async def async_will_remove_from_hass(self) -> None:
        """Stop reading the configuration."""
        task, self._config_task = self._config_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await super().async_will_remove_from_hass()

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """No Assist pipeline runs through this entity (duplex sessions do not)."""


class WyomingSatelliteEntity(AssistSatelliteEntity):
    """A Wyoming satellite owned by Realtime Voice (issue 8).

    On a device of its own (the satellite's name from its ``info``); available
    while the link is connected; the state follows the duplex session: idle (no
    session, waiting for the wake word), listening, responding. The pipeline
    select on the same device chooses the STT and TTS of its conversations; the
    wake word configuration offers the bundled openWakeWord models (detected on
    the server) or the satellite's own wake word service, one at a time.
    """

    _attr_has_entity_name = True
    _attr_should_poll = False
    _attr_name = None  # the device's name
    _attr_supported_features = AssistSatelliteEntityFeature(0)

    def __init__(
        self, entry: RtVoiceConfigEntry, wyoming: WyomingSatellites, key: str
    ) -> None:
        """Describe the satellite from what was stored when it was added."""
        self._wyoming = wyoming
        self._key = key
        self._entry_id = entry.entry_id
        self._attr_unique_id = wyoming_unique_id(entry.entry_id, key)
        self._attr_device_info = wyoming_device_info(key, wyoming.configs[key])
        self._attr_available = False

    @property
    def pipeline_entity_id(self) -> str | None:
        """The pipeline select on the satellite's device."""
        return er.async_get(self.hass).async_get_entity_id(
            Platform.SELECT, DOMAIN, f"{self._attr_unique_id}-pipeline"
        )

    async def async_added_to_hass(self) -> None:
        """Follow the link; conversations render this satellite's prompt sections."""
        await super().async_added_to_hass()
        self.async_on_remove(
            async_dispatcher_connect(
                self.hass,
                SIGNAL_WYOMING_UPDATE.format(self._entry_id, self._key),
                self._updated,
            )
        )
        self._wyoming.set_prompt_scope(self._key, self.entity_id)
        self._updated()

    @callback
    def _updated(self) -> None:
        link = self._wyoming.links.get(self._key)
        self._attr_available = link is not None and link.connected
        state = self._wyoming.states.get(self._key)
        self._set_state(
            _STATES.get(state, AssistSatelliteState.IDLE)
            if state is not None
            else AssistSatelliteState.IDLE
        )

    @callback
    def async_get_configuration(self) -> AssistSatelliteConfiguration:
        """Offer the bundled models (on the server) or the satellite's own wake word."""
        return AssistSatelliteConfiguration(
            available_wake_words=[
                *(
                    AssistSatelliteWakeWord(
                        id=model.id, wake_word=model.name, trained_languages=["en"]
                    )
                    for model in WAKE_WORD_MODELS
                ),
                AssistSatelliteWakeWord(
                    id=WAKE_WORD_SATELLITE,
                    wake_word="On the satellite",
                    trained_languages=[],
                ),
            ],
            active_wake_words=[wake_word_of(self._wyoming.configs[self._key])],
            max_active_wake_words=1,
        )

    async def async_set_configuration(
        self, config: AssistSatelliteConfiguration
    ) -> None:
        """Store the chosen wake word; the entry reloads and the link uses it."""
        wanted = config.active_wake_words[:1] or [WAKE_WORD_SATELLITE]
        wake_word = wanted[0]
        if wake_word != WAKE_WORD_SATELLITE and wake_word not in WAKE_WORD_IDS:
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="unknown_wake_word",
                translation_placeholders={"wake_word": wake_word},
            )
        if wake_word == wake_word_of(self._wyoming.configs[self._key]):
            return
        self._wyoming.async_store(self._key, **{CONF_WAKE_WORD: wake_word})

    def on_pipeline_event(self, event: PipelineEvent) -> None:
        """No Assist pipeline runs through this entity (duplex sessions do not)."""
