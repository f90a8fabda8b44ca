"""openWakeWord as a wake word engine of Home Assistant, in-process, no add-on.

One ``wake_word`` entity per entry offers the models bundled with pyopen-wakeword
(okay nabu, hey jarvis, hey mycroft, alexa, hey rhasspy); any Assist pipeline can
pick it. The detection logic is HA-free (``audio/wakeword.py``); this module only
adapts it:

- Setup: the engine is warmed up once, in the executor, before the entity exists, so
  the first utterance does not pay the library's ~0.5 s first-chunk cost.
- Each audio stream gets its own detector state (``WakeWordEngine.open_stream``):
  pipelines detecting at once share nothing. Chunks are buffered on the loop into
  80 ms frames; model work runs in the executor, never on the loop.
- The audio stream is only ever iterated by the caller's task: a cancelled caller
  never leaves a half-read chunk (the stream continues into speech-to-text).

pyopen-wakeword is an optional dependency, not in the manifest: its wheels exist for
glibc only, and a manifest requirement that cannot install would fail the whole
integration on musl (Home Assistant OS, the container image). It is installed here,
where it can be; where it cannot, the entity is not created, and one log line and a
repair issue say why and what to do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable
import importlib
import logging
import platform
import sys
from typing import Final

from homeassistant import requirements
from homeassistant.components import wake_word
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import issue_registry as ir
from homeassistant.helpers.entity_platform import AddConfigEntryEntitiesCallback
from homeassistant.util.hass_dict import HassKey

from .audio.wakeword import (
    BACKEND_REQUIREMENT,
    MODELS_BY_ID,
    WakeWordEngine,
    WakeWordStream,
    WakeWordUnavailableError,
    load_backend,
)
from .const import DOMAIN
from .entity import RtVoiceEntity
from .runtime import RtVoiceConfigEntry

_LOGGER = logging.getLogger(__name__)

# Detection only reads the engine's snapshot; nothing to serialise.
PARALLEL_UPDATES = 0

ISSUE_UNAVAILABLE: Final = "openwakeword_unavailable"
DOCS_URL: Final = (
    "https://github.com/rtvoice/rtvoice/blob/main/docs/configuration.md"
    "#wake-word-engine-openwakeword"
)
# Set once the unavailability was logged in this run (one line, not one per entry).
_DATA_REPORTED: HassKey[bool] = HassKey(f"{DOMAIN}_openwakeword_reported")


async def async_setup_entry(
    hass: HomeAssistant,
    entry: RtVoiceConfigEntry,
    async_add_entities: AddConfigEntryEntitiesCallback,
) -> None:
    """Warm up the engine and add the entity, or report why it cannot run."""
    engine = WakeWordEngine()
    try:
        await _async_ensure_backend(hass)
        await hass.async_add_executor_job(engine.warm_up)
    except WakeWordUnavailableError as err:
        _async_report_unavailable(hass, str(err))
        return
    ir.async_delete_issue(hass, DOMAIN, ISSUE_UNAVAILABLE)
    async_add_entities([OpenWakeWordEntity(hass, entry, engine)])


async def _async_ensure_backend(hass: HomeAssistant) -> None:
    """Make pyopen-wakeword importable, installing it where a wheel exists."""
    if await hass.async_add_executor_job(_importable):
        return
    if why_not := await hass.async_add_executor_job(_no_wheel_reason):
        raise WakeWordUnavailableError(why_not)
    try:
        await requirements.async_process_requirements(
            hass, f"{DOMAIN}.wake_word", [BACKEND_REQUIREMENT]
        )
    except requirements.RequirementsNotFound as err:
        raise WakeWordUnavailableError(
            f"installing {BACKEND_REQUIREMENT} failed ({err})"
        ) from err
    importlib.invalidate_caches()


def _importable() -> bool:
    """Return True when pyopen-wakeword imports (blocking: touches the disk)."""
    try:
        load_backend()
    except WakeWordUnavailableError:
        return False
    return True


def _no_wheel_reason() -> str | None:
    """Say why no pyopen-wakeword wheel can exist here, or None (blocking)."""
    if sys.platform.startswith("linux") and platform.libc_ver()[0] != "glibc":
        return (
            "pyopen-wakeword has no build for this system: it needs the glibc C"
            " library, and this one uses another (musl, as in Home Assistant OS and"
            " the Home Assistant container image)"
        )
    return None


@callback
def _async_report_unavailable(hass: HomeAssistant, reason: str) -> None:
    """Log once per run and raise the repair issue."""
    if not hass.data.get(_DATA_REPORTED):
        hass.data[_DATA_REPORTED] = True
        _LOGGER.warning(
            "The openWakeWord wake word engine is not available: %s. Pipelines can"
            " still use wake words on the satellite or the openWakeWord add-on;"
            " see %s",
            reason,
            DOCS_URL,
        )
    ir.async_create_issue(
        hass,
        DOMAIN,
        ISSUE_UNAVAILABLE,
        is_fixable=False,
        is_persistent=False,
        severity=ir.IssueSeverity.WARNING,
        learn_more_url=DOCS_URL,
        translation_key=ISSUE_UNAVAILABLE,
        translation_placeholders={"reason": reason},
    )


class OpenWakeWordEntity(RtVoiceEntity, wake_word.WakeWordDetectionEntity):
    """Detects the bundled openWakeWord models in a pipeline's audio."""

    _attr_translation_key = "openwakeword"

    def __init__(
        self, hass: HomeAssistant, entry: RtVoiceConfigEntry, engine: WakeWordEngine
    ) -> None:
        """Offer the models of a warmed-up engine."""
        super().__init__(hass, entry)
        self._engine = engine
        self._attr_unique_id = f"{entry.entry_id}-wake_word"
        self._wake_words = [
            wake_word.WakeWord(id=model.id, name=model.name, phrase=model.phrase)
            for model in engine.models
        ]

    async def get_supported_wake_words(self) -> list[wake_word.WakeWord]:
        """Return the bundled models."""
        return self._wake_words

    async def _async_process_audio_stream(
        self, stream: AsyncIterable[tuple[bytes, int]], wake_word_id: str | None
    ) -> wake_word.DetectionResult | None:
        """Listen until a wake word is heard (result) or the stream ends (None).

        ``wake_word_id`` None listens for every model. Audio: 16 kHz, 16-bit mono
        PCM chunks of any size with millisecond timestamps.
        """
        if wake_word_id is not None and wake_word_id not in self._engine.model_ids:
            raise ValueError(
                f"openWakeWord has no wake word {wake_word_id!r};"
                f" it offers {', '.join(self._engine.model_ids)}"
            )
        model_ids = None if wake_word_id is None else [wake_word_id]
        opening = self.hass.async_add_executor_job(self._engine.open_stream, model_ids)
        try:
            detector: WakeWordStream = await asyncio.shield(opening)
        except asyncio.CancelledError:
            # The worker still opens it: close what it opens.
            opening.add_done_callback(self._close_opened)
            raise
        try:
            async for chunk, timestamp_ms in stream:
                if not detector.feed(chunk, timestamp_ms):
                    continue
                detection = await self.hass.async_add_executor_job(detector.process)
                if detection is not None:
                    return wake_word.DetectionResult(
                        wake_word_id=detection.model_id,
                        wake_word_phrase=MODELS_BY_ID[detection.model_id].phrase,
                        timestamp=detection.timestamp_ms,
                    )
            return None
        finally:
            # Not awaited: the caller may be cancelled here. close() waits in its
            # worker for a process() that a cancelled caller left running.
            self.hass.async_add_executor_job(detector.close)

    @callback
    def _close_opened(self, opening: asyncio.Future[WakeWordStream]) -> None:
        """Close a stream whose caller was cancelled while it was being opened."""
        if not opening.cancelled() and opening.exception() is None:
            self.hass.async_add_executor_job(opening.result().close)
