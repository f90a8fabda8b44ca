"""Duplex ESPHome satellites in Home Assistant: probing, STT/TTS binding, the links.

- ``async_probe_satellite`` tests a satellite before a flow stores it (its
  subentry flow, or a discovery; distinct reasons for the form's errors);
- ``pipeline_stt`` / ``pipeline_tts`` bind the duplex session's speech to the STT
  and TTS engines of the satellite's Assist pipeline (its pipeline select; the
  preferred pipeline when none is chosen), read at every use: a change applies to
  the next utterance;
- ``satellite_binding`` builds the ``DuplexBinding`` of every duplex satellite
  (ESPHome here, Wyoming in ``wyoming_ha``): the satellite's stored settings
  (barge-in mode, server-side echo cancellation, end silence) and the entry's
  conversation settings (the prompt template, rendered at every conversation
  open; context window, tool turns, idle timeout, carry-over), and the hooks that
  prepare the brain's turn (tools, LLM API prompt) at every session as for a
  pipeline turn (the satellite's entity and device, its pipeline's language);
  ``with_entry_settings`` applies changed entry settings to a binding;
- ``DuplexSatellites`` runs one ``EsphomeLink`` per stored satellite on the entry's
  kernel, indexes every conversation a link opens with the ``SessionManager`` (so
  the control plane lists, sends to, stops and reads it like any other), tells the
  satellite entities (a dispatcher signal) when a link's availability or session
  state changes, plays announcements, and opens the conversation of a
  ``start_conversation`` before the device listens (what it says recorded as said).
  A repair issue says when a satellite's voice assistant listens for another API
  client (the link saw a start it never got: ``ISSUE_VOICE_ASSISTANT_REFUSED``).
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
    VoiceAssistantFeature,
)

from homeassistant.components import stt, tts
from homeassistant.components.assist_pipeline import async_get_pipeline
from homeassistant.components.assist_pipeline.select import get_chosen_pipeline
from homeassistant.const import CONF_HOST, CONF_PORT, MATCH_ALL
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import (
    device_registry as dr,
    entity_registry as er,
    issue_registry as ir,
)
from homeassistant.helpers.device_registry import format_mac
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.util import slugify

from .compat import intent_recogniser, tts_synthesise
from .const import (
    CONF_BARGE_IN,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_ESPHOME_VERSION,
    CONF_MAC,
    CONF_TURN_EAGERNESS,
    DEFAULT_BARGE_IN,
    DEFAULT_ECHO_CANCELLATION,
    DEFAULT_END_SILENCE,
    DEFAULT_ESPHOME_PORT,
    DEFAULT_TURN_EAGERNESS,
    DOMAIN,
    TURN_EAGERNESS_OFF,
)
from .duplex import (
    ENGINE_AEC3,
    BargeIn,
    DuplexOptions,
    Eagerness,
    EchoCanceller,
    SessionState,
    echo_unavailable_reason,
)
from .duplex_link import DuplexBinding, DuplexConversation, RoundEnds
from .duplex_stream import async_stream_registry
from .esphome_link import CLIENT_INFO, EsphomeLink
from .kernel import Kernel
from .link_settings import LinkSettingsError, esphome_settings
from .sessions import ConversationSettings, SessionManager

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
# Repair (not fixable here): the satellite's voice assistant serves another client.
ISSUE_VOICE_ASSISTANT_REFUSED: Final = "voice_assistant_refused"

type PipelineChoice = Callable[[], str | None]
"""Return the id of the pipeline to use now (None: the preferred one)."""


class ProbeError(Exception):
    """The satellite cannot be added; ``reason`` is the form's error key."""

    def __init__(self, reason: str) -> None:
        """Keep the reason (a translation key of the satellite's flow)."""
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
    """Describe the satellite's device (its MAC joins HA esphome's device).

    No manufacturer or model: on a device shared with HA's esphome integration they
    would replace the board's own ("Duplex satellite by ESPHome" over "Home
    Assistant Voice PE by Nabu Casa").
    """
    connections = set()
    if conf.get(CONF_MAC):
        connections.add((dr.CONNECTION_NETWORK_MAC, format_mac(str(conf[CONF_MAC]))))
    return dr.DeviceInfo(
        identifiers={(DOMAIN, f"duplex-{key}")},
        connections=connections,
        name=str(conf.get("name") or conf[CONF_HOST]),
    )


@callback
def chosen_pipeline(hass: HomeAssistant, entry_id: str, key: str) -> str | None:
    """Pipeline id chosen in the satellite's pipeline select (None: preferred)."""
    return get_chosen_pipeline(hass, DOMAIN, satellite_unique_id(entry_id, key))


# A satellite in vad mode without echo cancellation whose mic hears its answers.
ISSUE_HEARS_ITSELF: Final = "satellite_hears_itself"


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
        barge_in=barge_in,
        end_silence_ms=max(0, round(end_silence * 1000)),
        eagerness=satellite_eagerness(conf),
    )


def satellite_eagerness(conf: Mapping[str, Any]) -> Eagerness | None:
    """Return how eagerly the satellite ends a turn by its words (None: off)."""
    value = conf.get(CONF_TURN_EAGERNESS, DEFAULT_TURN_EAGERNESS)
    if value == TURN_EAGERNESS_OFF:
        return None
    try:
        return Eagerness(value)
    except ValueError:
        return None  # an unknown stored value: the rule stays off


def satellite_echo(
    name: str, conf: Mapping[str, Any]
) -> Callable[[], EchoCanceller | None] | None:
    """Return the echo canceller factory of a satellite, when it is asked for.

    WebRTC AEC3 where its wheel runs (glibc: it measured better in the same rooms,
    docs/benchmarks.md), else the numpy canceller, which runs on every install (HA
    OS and the containers are musl), so nothing is refused for a missing wheel.
    Each numpy canceller goes on from the echo path the last one learned (the
    device has not moved): only the first answer a satellite ever plays waits for
    it to learn. On a board that cancels its own echo it finds none and passes the
    mic through.
    """
    if not conf.get(CONF_ECHO_CANCELLATION, DEFAULT_ECHO_CANCELLATION):
        return None
    if (reason := echo_unavailable_reason()) is not None:  # pragma: no cover
        _LOGGER.warning(
            "Echo cancellation is turned on for %s but cannot run here: %s",
            name,
            reason,
        )
        return None
    if echo_unavailable_reason(ENGINE_AEC3) is None:
        return functools.partial(EchoCanceller, engine=ENGINE_AEC3)
    last: list[EchoCanceller] = []

    def factory() -> EchoCanceller:
        learned = last[0].fdaf if last else None
        echo = EchoCanceller(learned=learned)
        last[:] = [echo]
        return echo

    return factory


def satellite_binding(
    hass: HomeAssistant,
    sessions: SessionManager,
    kernel: Kernel,
    round_ends: RoundEnds,
    *,
    name: str,
    conf: Mapping[str, Any],
    choice: PipelineChoice | None = None,
) -> DuplexBinding:
    """Build a duplex satellite's binding: its settings and the entry's.

    The entry's prompt template is rendered at every conversation open (as for
    pipeline-mode conversations); its other settings are read now
    (``with_entry_settings`` when they change). ``choice``: the satellite's
    pipeline (None: the preferred one) for speech and the turn's language.
    Every session prepares the brain's turn (its tools and LLM API prompt) for
    the satellite's entity (the prompt scope) and device, as a pipeline turn of
    that satellite would; the child's turn is forgotten when it closes.
    """

    async def prepare(child_id: str, scope: str | None) -> None:
        await sessions.async_prepare_turn(
            child_id,
            context=Context(),
            language=pipeline_language(hass, choice),
            device_id=satellite_device_id(hass, scope),
            satellite=scope,
            prompt_scope=scope,
        )

    hearing_issue = f"{ISSUE_HEARS_ITSELF}_{slugify(name)}"
    options = satellite_options(conf)
    echo = satellite_echo(name, conf)
    if echo is not None or options.barge_in is not BargeIn.VAD:
        ir.async_delete_issue(hass, DOMAIN, hearing_issue)  # settings changed

    @callback
    def hears_itself() -> None:
        ir.async_create_issue(
            hass,
            DOMAIN,
            hearing_issue,
            is_fixable=False,
            is_persistent=False,
            severity=ir.IssueSeverity.WARNING,
            translation_key=ISSUE_HEARS_ITSELF,
            translation_placeholders={"satellite": name},
        )

    return with_entry_settings(
        DuplexBinding(
            kernel=kernel,
            stt=pipeline_stt(hass, choice),
            tts=pipeline_tts(hass, choice),
            options=options,
            round_ends=round_ends,
            echo=echo,
            render_prompt=sessions.render_prompt,
            prepare=prepare,
            forget=sessions.forget_turn,
            recognise=intent_recogniser(hass, lambda: pipeline_language(hass, choice)),
            on_hears_itself=hears_itself,
        ),
        sessions.settings,
    )


def with_entry_settings(
    binding: DuplexBinding, settings: ConversationSettings
) -> DuplexBinding:
    """Return ``binding`` with the entry's conversation settings."""
    return dataclasses.replace(
        binding,
        context_window=settings.context_window,
        max_tool_turns=settings.max_tool_turns,
        max_answer_chars=settings.max_answer_chars,
        idle_timeout_s=settings.idle_timeout,
        carry_over=settings.carry_over,
    )


def satellite_device_id(hass: HomeAssistant, entity_id: str | None) -> str | None:
    """Return the device of a satellite entity (None: unknown)."""
    if entity_id is None:
        return None
    entry = er.async_get(hass).async_get(entity_id)
    return entry.device_id if entry is not None else None


# --------------------------------------------------------------------------- speech


def pipeline_language(hass: HomeAssistant, choice: PipelineChoice | None) -> str:
    """Return the language the chosen (else preferred) pipeline converses in.

    As the pipeline's intent stage picks it: an agent for every language ("*")
    takes the speech languages; an unknown pipeline: HA's language.
    """
    try:
        pipeline = async_get_pipeline(hass, choice() if choice else None)
    except HomeAssistantError:
        return hass.config.language
    if pipeline.conversation_language == MATCH_ALL:
        return (
            pipeline.stt_language
            or pipeline.tts_language
            or pipeline.language
            or hass.config.language
        )
    return pipeline.conversation_language or hass.config.language


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
        *,
        sessions: SessionManager,
    ) -> None:
        """Bind the stored satellites to the entry's kernel (nothing runs yet)."""
        self.hass = hass
        self.entry_id = entry_id
        self.kernel = kernel
        self.sessions = sessions
        self.configs: dict[str, Mapping[str, Any]] = {
            satellite_key(conf): conf for conf in satellites
        }
        self.bindings: dict[str, DuplexBinding] = {
            key: satellite_binding(
                hass,
                sessions,
                kernel,
                round_ends,
                name=str(conf.get("name") or conf[CONF_HOST]),
                conf=conf,
                choice=functools.partial(chosen_pipeline, hass, entry_id, key),
            )
            for key, conf in self.configs.items()
        }
        self.links: dict[str, EsphomeLink] = {}
        self.states: dict[str, SessionState | None] = {}
        self.entity_ids: dict[str, str] = {}  # satellite key → its entity id
        # A conversation opened for a start_conversation, for the device's start
        # (or the satellite's next start_conversation) to continue.
        self._waiting: dict[str, DuplexConversation] = {}

    def configure(self) -> None:
        """Apply the entry's conversation settings (changed options, no reload).

        Conversations opened from now on use them; running ones keep theirs.
        """
        for key, binding in self.bindings.items():
            self._set_binding(key, with_entry_settings(binding, self.sessions.settings))

    def _set_binding(self, key: str, binding: DuplexBinding) -> None:
        self.bindings[key] = binding
        if (link := self.links.get(key)) is not None:
            link.binding = binding

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
        try:
            settings = esphome_settings(conf)  # the key as a SecretStr
        except LinkSettingsError as err:
            _LOGGER.error("Duplex satellite %s: unusable settings (%s)", key, err)
            return
        host = settings.host
        link = EsphomeLink(
            settings.link_config(),
            self.bindings[key],
            zeroconf_instance=await _zeroconf(self.hass, host),
            on_available=functools.partial(self._available, key),
            on_conversation=functools.partial(self._conversation, key),
            on_state=functools.partial(self._state, key),
            streams=async_stream_registry(self.hass),  # firmware before 2026.9
            on_refused=functools.partial(self._refused, key),
        )
        if _skips_login(conf.get(CONF_ESPHOME_VERSION)):
            link.login = False  # never answered: no wait for the fallback
        self.links[key] = link
        link.start()

    async def async_stop(self) -> None:
        """Close every link (conversations handed off); no task is left."""
        links = list(self.links.values())
        self.links.clear()
        self._waiting.clear()
        await asyncio.gather(*(link.aclose() for link in links))
        for key in self.configs:
            ir.async_delete_issue(self.hass, DOMAIN, self.refused_issue_id(key))

    @callback
    def set_prompt_scope(self, key: str, scope: str | None) -> None:
        """Render the satellite's prompt sections (its entity id) in its conversations.

        Applies to conversations opened from now on; the entity id also names
        the satellite of its conversations in the control plane.
        """
        if scope is not None:
            self.entity_ids[key] = scope
        self._set_binding(
            key, dataclasses.replace(self.bindings[key], prompt_scope=scope)
        )

    def key_for(self, entity_id: str) -> str | None:
        """Return the key of the satellite whose entity is ``entity_id`` (None: none)."""
        for key, known in self.entity_ids.items():
            if known == entity_id:
                return key
        return None

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

    # --- start_conversation -----------------------------------------------------------

    async def async_open(
        self,
        key: str,
        *,
        system_prompt: str | None = None,
        extra_prompt: str | None = None,
        said: str | None = None,
        owner: str | None = None,
    ) -> str:
        """Open the satellite's conversation for a ``start_conversation``; its id.

        A conversation running on the satellite closes first (hand-off). The new
        one waits, idle, for the device: the announcement's start (or the next
        wake word) resumes it, so the user's reply lands in it. ``said`` (the
        opening message) is in its history as what the assistant said;
        ``system_prompt`` replaces the entry's prompt, ``extra_prompt`` is added
        to it (as for pipeline-mode conversations). ``owner`` may send to and
        stop it. Raises ``HomeAssistantError`` when the satellite is not
        connected.
        """
        link = self.connected_link(key)
        binding = self.bindings[key]
        prompt = system_prompt if system_prompt is not None else binding.prompt()
        if extra_prompt:
            prompt = "\n\n".join(p for p in (prompt, extra_prompt) if p)
        one_off = dataclasses.replace(binding, system_prompt=prompt, render_prompt=None)
        self._waiting.pop(key, None)
        try:
            conversation = await link.open_waiting(one_off)
        except APIConnectionError as err:
            raise self.unavailable(key) from err
        self._attach(key, link, conversation, owner)
        if said:
            self.kernel.record_said(conversation.child_id, said)
        self._waiting[key] = conversation
        return conversation.child_id

    def _waiting_conversation(self, key: str) -> DuplexConversation | None:
        """Return the conversation waiting for the device's start, if it still can."""
        conversation = self._waiting.get(key)
        link = self.links.get(key)
        if (
            conversation is None
            or link is None
            or link.conversation is not conversation
            or conversation.closing
        ):
            self._waiting.pop(key, None)
            return None
        return conversation

    async def async_start_conversation(
        self,
        key: str,
        media_id: str,
        message: str,
        *,
        preannounce_media_id: str | None = None,
        extra_prompt: str | None = None,
    ) -> None:
        """Announce, then the device listens; return when the announcement played.

        The conversation the reply lands in: the one opened for it
        (``async_open``, ``continue_conversation``), else a new one (the running
        one closes first) with ``message`` recorded as said and ``extra_prompt``
        added to its system prompt.
        """
        if self._waiting_conversation(key) is None:
            await self.async_open(key, extra_prompt=extra_prompt, said=message)
        await self._async_announce(
            key,
            media_id,
            message,
            preannounce_media_id=preannounce_media_id,
            start_conversation=True,
            keep_conversation=True,
        )

    def continue_conversation(self, key: str, conversation: DuplexConversation) -> bool:
        """Let the satellite's next ``start_conversation`` continue ``conversation``.

        False when the satellite cannot start conversations or the conversation
        is not its current one.
        """
        link = self.links.get(key)
        if (
            link is None
            or link.conversation is not conversation
            or conversation.closing
            or not link.voice_assistant_features
            & VoiceAssistantFeature.START_CONVERSATION
        ):
            return False
        self._waiting[key] = conversation
        return True

    # --- announcements ----------------------------------------------------------------

    async def async_announce(
        self,
        key: str,
        media_id: str,
        message: str,
        *,
        preannounce_media_id: str | None = None,
    ) -> None:
        """Play an announcement on the satellite; return when it has played.

        A conversation running on the satellite is closed first (what was heard
        stays in its transcript), as Home Assistant cancels a running pipeline for
        an announcement; one opened for a ``start_conversation`` stays (idle: the
        next wake word continues it).
        """
        await self._async_announce(
            key,
            media_id,
            message,
            preannounce_media_id=preannounce_media_id,
            start_conversation=False,
            keep_conversation=self._waiting_conversation(key) is not None,
        )

    async def _async_announce(
        self,
        key: str,
        media_id: str,
        message: str,
        *,
        preannounce_media_id: str | None,
        start_conversation: bool,
        keep_conversation: bool,
    ) -> None:
        link = self.connected_link(key)
        try:
            await link.announce(
                media_id,
                message,
                preannounce_media_id=preannounce_media_id or "",
                start_conversation=start_conversation,
                keep_conversation=keep_conversation,
            )
        except (APIConnectionError, TimeoutError) as err:
            raise HomeAssistantError(
                translation_domain=DOMAIN,
                translation_key="announce_failed",
                translation_placeholders={"error": type(err).__name__},
            ) from err

    # --- link changes --------------------------------------------------------------

    @callback
    def _available(self, key: str, available: bool) -> None:
        self._changed(key)

    @callback
    def _conversation(self, key: str, conversation: DuplexConversation | None) -> None:
        if conversation is None:
            self.states[key] = None
        else:
            self.states[key] = conversation.session.state  # listening, at first
            if (link := self.links.get(key)) is not None:
                self._attach(key, link, conversation, None)
            if self._waiting.get(key) is conversation and not conversation.ended:
                del self._waiting[key]  # the device started: it is answered now
        self._changed(key)

    def _attach(
        self,
        key: str,
        link: EsphomeLink,
        conversation: DuplexConversation,
        owner: str | None,
    ) -> None:
        """Index the conversation with the sessions (once; owner: the opener)."""
        entity_id = self.entity_ids.get(key)
        self.sessions.attach_duplex(
            conversation.child_id,
            _EsphomeHandle(self, key, link, conversation),
            satellite=entity_id,
            device_id=satellite_device_id(self.hass, entity_id),
            owner=owner,
        )

    def refused_issue_id(self, key: str) -> str:
        """Return the issue id of a satellite whose voice assistant serves another client."""
        return f"{ISSUE_VOICE_ASSISTANT_REFUSED}_{self.entry_id}_{key}"

    @callback
    def _refused(self, key: str, refused: bool) -> None:
        """Raise (or clear) the repair: the device listens for another API client."""
        issue_id = self.refused_issue_id(key)
        if not refused:
            ir.async_delete_issue(self.hass, DOMAIN, issue_id)
            return
        ir.async_create_issue(
            self.hass,
            DOMAIN,
            issue_id,
            is_fixable=False,
            is_persistent=False,
            severity=ir.IssueSeverity.WARNING,
            translation_key=ISSUE_VOICE_ASSISTANT_REFUSED,
            translation_placeholders={
                "satellite": str(self.configs[key].get("name") or key)
            },
        )

    @callback
    def _state(self, key: str, state: SessionState) -> None:
        self.states[key] = state
        self._changed(key)

    @callback
    def _changed(self, key: str) -> None:
        async_dispatcher_send(
            self.hass, SIGNAL_DUPLEX_UPDATE.format(self.entry_id, key)
        )


class _EsphomeHandle:
    """The sessions' handle of one ESPHome duplex conversation (``DuplexHandle``)."""

    def __init__(
        self,
        satellites: DuplexSatellites,
        key: str,
        link: EsphomeLink,
        conversation: DuplexConversation,
    ) -> None:
        self._satellites = satellites
        self._key = key
        self._link = link
        self._conversation = conversation

    @property
    def live(self) -> bool:
        """Whether a session listens (an answer is spoken on the satellite)."""
        return not self._conversation.ended

    async def aclose(self) -> None:
        """Close through the link: the device stops listening if it did."""
        await self._link.close_conversation(self._conversation)

    def continue_next_start(self) -> bool:
        """Let the satellite's next start_conversation continue this conversation."""
        return self._satellites.continue_conversation(self._key, self._conversation)
