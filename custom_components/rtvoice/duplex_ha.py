"""Duplex ESPHome satellites in Home Assistant: probing, STT/TTS binding, the links.

- ``async_probe_satellite`` tests a satellite before the options flow stores it
  (distinct reasons for the form's errors);
- ``pipeline_stt`` / ``pipeline_tts`` bind the duplex session's speech to the STT
  and TTS engines of the satellite's Assist pipeline (its pipeline select; the
  preferred pipeline when none is chosen), read at every use: a change applies to
  the next utterance;
- ``satellite_binding`` builds one ``DuplexBinding`` per satellite from its stored
  settings (barge-in mode, server-side echo cancellation, end silence);
- ``DuplexSatellites`` runs one ``EsphomeLink`` per stored satellite on the entry's
  kernel, tells the satellite entities (a dispatcher signal) when a link's
  availability or session state changes, plays announcements, and records the
  announcement of a ``start_conversation`` in the conversation it opens.
  ``async_stop`` leaves no task.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
import dataclasses
import functools
import io
import ipaddress
import logging
from typing import Any, Final
import wave

from aioesphomeapi import (
    APIClient,
    APIConnectionError,
    DeviceInfo,
    EncryptionPlaintextAPIError,
    InvalidEncryptionKeyAPIError,
    RequiresEncryptionAPIError,
)

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import async_get_pipeline
from homeassistant.components.assist_pipeline.select import get_chosen_pipeline
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import device_registry as dr
from homeassistant.helpers.device_registry import format_mac
from homeassistant.helpers.dispatcher import async_dispatcher_send

from .compat import tts_synthesise
from .const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_NOISE_PSK,
    DEFAULT_BARGE_IN,
    DEFAULT_ECHO_CANCELLATION,
    DEFAULT_END_SILENCE,
    DEFAULT_ESPHOME_PORT,
    DOMAIN,
)
from .duplex import (
    BargeIn,
    DuplexOptions,
    EchoCanceller,
    SessionState,
    echo_unavailable_reason,
)
from .duplex_link import DuplexBinding, DuplexConversation, RoundEnds
from .duplex_stream import async_stream_registry
from .esphome_link import CLIENT_INFO, EsphomeLink, LinkConfig
from .kernel import Kernel

_LOGGER = logging.getLogger(__name__)

PROBE_TIMEOUT: Final = 15.0  # seconds for connect + device info
# Dispatcher signal (format with entry id and satellite key): a link changed.
SIGNAL_DUPLEX_UPDATE: Final = "rtvoice_duplex_update_{}_{}"
SAMPLE_RATE: Final = 16000
CHUNK_BYTES: Final = 3200  # 100 ms of 16 kHz mono s16le
STT_METADATA_RATE: Final = stt.AudioSampleRates.SAMPLERATE_16000
TTS_OPTIONS: Final = {
    tts.ATTR_PREFERRED_FORMAT: "wav",
    tts.ATTR_PREFERRED_SAMPLE_RATE: SAMPLE_RATE,
    tts.ATTR_PREFERRED_SAMPLE_CHANNELS: 1,
    tts.ATTR_PREFERRED_SAMPLE_BYTES: 2,
}
VOICE_ASSISTANT_FLAG: Final = 1  # VoiceAssistantFeature.VOICE_ASSISTANT

type PipelineChoice = Callable[[], str | None]
"""Return the id of the pipeline to use now (None: the preferred one)."""


class ProbeError(Exception):
    """The satellite cannot be added; ``reason`` is the form's error key."""

    def __init__(self, reason: str) -> None:
        """Keep the reason (a translation key of the options flow)."""
        super().__init__(reason)
        self.reason = reason


async def async_probe_satellite(
    hass: HomeAssistant, host: str, port: int, noise_psk: str | None
) -> DeviceInfo:
    """Connect once, read the device info, disconnect; raise ``ProbeError``.

    Reasons: ``cannot_connect``, ``invalid_key``, ``requires_encryption`` (no key
    given, the device wants one), ``encryption_not_offered`` (a key given, the
    device speaks plaintext), ``not_voice_satellite``. No login is sent (as HA's
    esphome flow): every firmware answers the device info without one.
    """
    client = APIClient(
        host,
        port,
        None,
        client_info=CLIENT_INFO,
        noise_psk=noise_psk or None,
        zeroconf_instance=await _zeroconf(hass, host),
    )
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            await client.connect(login=False)
            info = await client.device_info()
            api_version = client.api_version
    except RequiresEncryptionAPIError as err:
        raise ProbeError("requires_encryption") from err
    except EncryptionPlaintextAPIError as err:
        raise ProbeError("encryption_not_offered") from err
    except InvalidEncryptionKeyAPIError as err:
        raise ProbeError("invalid_key") from err
    except (APIConnectionError, OSError, TimeoutError) as err:
        _LOGGER.debug("Probing %s failed: %s", host, type(err).__name__)
        raise ProbeError("cannot_connect") from err
    finally:
        await client.disconnect(force=True)
    flags = (
        info.voice_assistant_feature_flags_compat(api_version)
        if api_version is not None
        else 0
    )
    if not flags & VOICE_ASSISTANT_FLAG:
        raise ProbeError("not_voice_satellite")
    return info


async def _zeroconf(hass: HomeAssistant, host: str) -> Any:
    """HA's zeroconf instance for a name to resolve (``.local``); None for an address."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        from homeassistant.components import zeroconf  # noqa: PLC0415 - names only

        return await zeroconf.async_get_async_instance(hass)
    return None


def _skips_login(version: object) -> bool:
    """Whether this ESPHome version never answers ``login=True`` (>= 2026.1)."""
    try:
        year = int(str(version).split(".", 1)[0])
    except ValueError:
        return False
    return year >= 2026


def satellite_key(conf: Mapping[str, Any]) -> str:
    """Return the stable key of a stored satellite (its MAC, else host:port)."""
    if conf.get(CONF_MAC):
        return format_mac(str(conf[CONF_MAC]))
    return f"{conf[CONF_HOST]}:{conf.get(CONF_PORT, DEFAULT_ESPHOME_PORT)}"


def satellite_unique_id(entry_id: str, key: str) -> str:
    """Return the satellite entity's unique id (its selects' id prefix)."""
    return f"{entry_id}-duplex-{key}"


def satellite_device_info(key: str, conf: Mapping[str, Any]) -> dr.DeviceInfo:
    """Describe the satellite's device (its MAC joins HA esphome's device)."""
    connections = set()
    if conf.get(CONF_MAC):
        connections.add((dr.CONNECTION_NETWORK_MAC, format_mac(str(conf[CONF_MAC]))))
    return dr.DeviceInfo(
        identifiers={(DOMAIN, f"duplex-{key}")},
        connections=connections,
        name=str(conf.get("name") or conf[CONF_HOST]),
        manufacturer="ESPHome",
        model="Duplex satellite",
    )


@callback
def chosen_pipeline(hass: HomeAssistant, entry_id: str, key: str) -> str | None:
    """Pipeline id chosen in the satellite's pipeline select (None: preferred)."""
    return get_chosen_pipeline(hass, DOMAIN, satellite_unique_id(entry_id, key))


def satellite_options(conf: Mapping[str, Any]) -> DuplexOptions:
    """Return the duplex session's options from a satellite's settings."""
    try:
        barge_in = BargeIn(conf.get(CONF_BARGE_IN, DEFAULT_BARGE_IN))
    except ValueError:
        barge_in = BargeIn(DEFAULT_BARGE_IN)
    try:
        end_silence = float(conf.get(CONF_END_SILENCE, DEFAULT_END_SILENCE))
    except (TypeError, ValueError):
        end_silence = DEFAULT_END_SILENCE
    return DuplexOptions(
        barge_in=barge_in, end_silence_ms=max(0, round(end_silence * 1000))
    )


def satellite_echo(
    name: str, conf: Mapping[str, Any]
) -> Callable[[], EchoCanceller | None] | None:
    """Return the echo canceller factory when asked for and able to run.

    Asked for but unavailable here (no ``livekit`` wheel): one warning saying why
    (each time the entry loads), and the satellite runs without it.
    """
    if not conf.get(CONF_ECHO_CANCELLATION, DEFAULT_ECHO_CANCELLATION):
        return None
    if (reason := echo_unavailable_reason()) is not None:
        _LOGGER.warning(
            "Echo cancellation is turned on for %s but cannot run here: %s",
            name,
            reason,
        )
        return None
    return EchoCanceller


# --------------------------------------------------------------------------- speech


def pipeline_stt(hass: HomeAssistant, choice: PipelineChoice | None = None) -> Any:
    """Transcribe an utterance with the chosen (else preferred) pipeline's STT."""

    async def transcribe(pcm: bytes) -> str:
        pipeline = async_get_pipeline(hass, choice() if choice else None)
        engine = pipeline.stt_engine
        if not engine:
            raise RuntimeError(
                f"the Assist pipeline {pipeline.name!r} has no speech-to-text"
            )
        provider: Any = stt.async_get_speech_to_text_entity(hass, engine)
        if provider is None:
            provider = stt.async_get_provider(hass, engine)  # legacy platform
        if provider is None:
            raise RuntimeError(f"speech-to-text {engine} is not available")
        metadata = stt.SpeechMetadata(
            language=pipeline.stt_language or hass.config.language,
            format=stt.AudioFormats.WAV,
            codec=stt.AudioCodecs.PCM,
            bit_rate=stt.AudioBitRates.BITRATE_16,
            sample_rate=STT_METADATA_RATE,
            channel=stt.AudioChannels.CHANNEL_MONO,
        )

        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(pcm), CHUNK_BYTES):
                yield pcm[start : start + CHUNK_BYTES]

        result = await provider.async_process_audio_stream(metadata, chunks())
        if result.result != stt.SpeechResultState.SUCCESS:
            return ""
        return str(result.text or "")

    return transcribe


def pipeline_tts(hass: HomeAssistant, choice: PipelineChoice | None = None) -> Any:
    """Speak a sentence with the chosen (else preferred) pipeline's TTS, as 16 kHz PCM."""

    async def synthesise(text: str) -> AsyncIterator[bytes]:
        pipeline = async_get_pipeline(hass, choice() if choice else None)
        engine = pipeline.tts_engine
        if not engine:
            raise RuntimeError(
                f"the Assist pipeline {pipeline.name!r} has no text-to-speech"
            )
        options: dict[str, Any] = dict(TTS_OPTIONS)
        if pipeline.tts_voice is not None:
            options[tts.ATTR_VOICE] = pipeline.tts_voice
        extension, audio = await tts_synthesise(
            hass, engine, pipeline.tts_language, options, text
        )
        pcm = _wav_pcm(extension, audio)
        for start in range(0, len(pcm), CHUNK_BYTES):
            yield pcm[start : start + CHUNK_BYTES]

    return synthesise


def _wav_pcm(extension: str, audio: bytes) -> bytes:
    """Return the frames of a 16 kHz mono 16-bit WAV (what the TTS options ask for)."""
    if extension != "wav":
        raise ValueError(f"text-to-speech returned {extension}, not wav")
    with wave.open(io.BytesIO(audio), "rb") as wav:
        if (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) != (
            SAMPLE_RATE,
            1,
            2,
        ):
            raise ValueError("text-to-speech audio is not 16 kHz mono 16-bit")
        return wav.readframes(wav.getnframes())


# --------------------------------------------------------------------------- links


class DuplexSatellites:
    """The duplex satellites of one entry: one ``EsphomeLink`` and binding each."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry_id: str,
        kernel: Kernel,
        round_ends: RoundEnds,
        satellites: Sequence[Mapping[str, Any]],
    ) -> None:
        """Bind the stored satellites to the entry's kernel (nothing runs yet)."""
        self.hass = hass
        self.entry_id = entry_id
        self.kernel = kernel
        self.configs: dict[str, Mapping[str, Any]] = {
            satellite_key(conf): conf for conf in satellites
        }
        self.bindings: dict[str, DuplexBinding] = {
            key: self._binding(key, conf, round_ends)
            for key, conf in self.configs.items()
        }
        self.links: dict[str, EsphomeLink] = {}
        self.states: dict[str, SessionState | None] = {}
        # What a start_conversation announced, for the conversation it opens next.
        self._openings: dict[str, str] = {}

    def _binding(
        self, key: str, conf: Mapping[str, Any], round_ends: RoundEnds
    ) -> DuplexBinding:
        """Build the satellite's own binding: its pipeline's speech, its settings."""
        choice = functools.partial(chosen_pipeline, self.hass, self.entry_id, key)
        return DuplexBinding(
            kernel=self.kernel,
            stt=pipeline_stt(self.hass, choice),
            tts=pipeline_tts(self.hass, choice),
            options=satellite_options(conf),
            round_ends=round_ends,
            echo=satellite_echo(str(conf.get("name") or conf[CONF_HOST]), conf),
        )

    async def async_start(self) -> None:
        """Start connecting every satellite (in the background).

        A failure (or cancel) part-way closes the links already started.
        """
        try:
            for key, conf in self.configs.items():
                await self._async_start_link(key, conf)
        except BaseException:
            await self.async_stop()
            raise

    async def _async_start_link(self, key: str, conf: Mapping[str, Any]) -> None:
        host = str(conf[CONF_HOST])
        link = EsphomeLink(
            LinkConfig(
                host=host,
                port=int(conf.get(CONF_PORT, DEFAULT_ESPHOME_PORT)),
                noise_psk=conf.get(CONF_NOISE_PSK) or None,
            ),
            self.bindings[key],
            zeroconf_instance=await _zeroconf(self.hass, host),
            on_available=functools.partial(self._available, key),
            on_conversation=functools.partial(self._conversation, key),
            on_state=functools.partial(self._state, key),
            streams=async_stream_registry(self.hass),  # firmware before 2026.9
        )
        if _skips_login(conf.get(CONF_ESPHOME_VERSION)):
            link.login = False  # never answered: no wait for the fallback
        self.links[key] = link
        link.start()

    async def async_stop(self) -> None:
        """Close every link (conversations handed off); no task is left."""
        links = list(self.links.values())
        self.links.clear()
        self._openings.clear()
        await asyncio.gather(*(link.aclose() for link in links))

    @callback
    def set_prompt_scope(self, key: str, scope: str | None) -> None:
        """Render the satellite's prompt sections (its entity id) in its conversations.

        Applies to conversations opened from now on.
        """
        binding = dataclasses.replace(self.bindings[key], prompt_scope=scope)
        self.bindings[key] = binding
        if (link := self.links.get(key)) is not None:
            link.binding = binding

    def connected_link(self, key: str) -> EsphomeLink:
        """Return the satellite's link if connected; else raise ``HomeAssistantError``."""
        link = self.links.get(key)
        if link is None or not link.available:
            raise self.unavailable(key)
        return link

    def unavailable(self, key: str) -> HomeAssistantError:
        """Return the error for an action on a satellite that is not connected."""
        return HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="satellite_unavailable",
            translation_placeholders={
                "satellite": str(self.configs[key].get("name") or key)
            },
        )

    async def async_announce(
        self,
        key: str,
        media_id: str,
        message: str,
        *,
        preannounce_media_id: str | None = None,
        start_conversation: bool = False,
    ) -> None:
        """Play an announcement on the satellite; return when it has played.

        A conversation running on the satellite is closed first (what was heard
        stays in its transcript), as Home Assistant cancels a running pipeline for
        an announcement. With ``start_conversation`` the satellite listens
        afterwards and the conversation that opens has ``message`` in its history
        as what the assistant said.
        """
        link = self.connected_link(key)
        if start_conversation and message:
            self._openings[key] = message
        else:
            self._openings.pop(key, None)
        try:
            await link.announce(
                media_id,
                message,
                preannounce_media_id=preannounce_media_id or "",
                start_conversation=start_conversation,
            )
        except BaseException as err:
            self._openings.pop(key, None)
            if isinstance(err, (APIConnectionError, TimeoutError)):
                raise HomeAssistantError(
                    translation_domain=DOMAIN,
                    translation_key="announce_failed",
                    translation_placeholders={"error": type(err).__name__},
                ) from err
            raise

    @callback
    def _available(self, key: str, available: bool) -> None:
        if not available:
            self._openings.pop(key, None)  # the device forgot it too
        self._changed(key)

    @callback
    def _conversation(self, key: str, conversation: DuplexConversation | None) -> None:
        if conversation is None:
            self.states[key] = None
        else:
            self.states[key] = conversation.session.state  # listening, at first
            if opening := self._openings.pop(key, None):
                # Opened by the device's start after a start_conversation
                # announcement: the model must know what it asked.
                self.kernel.record_said(conversation.child_id, opening)
        self._changed(key)

    @callback
    def _state(self, key: str, state: SessionState) -> None:
        self.states[key] = state
        self._changed(key)

    @callback
    def _changed(self, key: str) -> None:
        async_dispatcher_send(
            self.hass, SIGNAL_DUPLEX_UPDATE.format(self.entry_id, key)
        )
