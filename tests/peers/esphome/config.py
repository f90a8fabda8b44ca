"""What the emulated device is: identity, firmware version, features, entities."""

from __future__ import annotations

from dataclasses import dataclass
import enum


class Feature(enum.IntFlag):
    """``VoiceAssistantFeature`` bits of ``DeviceInfoResponse.voice_assistant_feature_flags``."""

    VOICE_ASSISTANT = 1 << 0
    SPEAKER = 1 << 1
    """Speaker component: TTS is streamed as API audio, not fetched from a URL."""
    API_AUDIO = 1 << 2
    TIMERS = 1 << 3
    ANNOUNCE = 1 << 4
    START_CONVERSATION = 1 << 5
    MULTI_CHANNEL_AUDIO = 1 << 6
    """A second mic channel (``data2``): ``microphone2`` (ESPHome 2026.6+) or LVA's echo reference."""


VOICE_PE_FEATURES = (
    Feature.VOICE_ASSISTANT
    | Feature.API_AUDIO
    | Feature.TIMERS
    | Feature.ANNOUNCE
    | Feature.START_CONVERSATION
)
"""Home Assistant Voice PE: media player output (TTS fetched over HTTP)."""

ATOM_ECHO_FEATURES = Feature.VOICE_ASSISTANT | Feature.SPEAKER | Feature.API_AUDIO
"""M5Stack Atom Echo: a plain speaker, TTS streamed as API audio."""


@dataclass(frozen=True)
class MediaFormat:
    """One ``MediaPlayerSupportedFormat`` of the media player entity."""

    format: str = "wav"
    sample_rate: int = 16000
    num_channels: int = 1
    sample_bytes: int = 2
    announcement: bool = True
    """Purpose ANNOUNCEMENT (HA picks the first one for TTS); else DEFAULT."""


DEFAULT_FORMATS = (MediaFormat(),)


@dataclass(frozen=True)
class WakeWord:
    """One wake word the device offers (``VoiceAssistantWakeWord``)."""

    id: str
    wake_word: str
    trained_languages: tuple[str, ...] = ("en",)


DEFAULT_WAKE_WORDS = (
    WakeWord("okay_nabu", "Okay Nabu"),
    WakeWord("hey_jarvis", "Hey Jarvis"),
)


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


@dataclass(frozen=True)
class DeviceConfig:
    """Everything configurable about one emulated device.

    ``answer_login=None`` follows the firmware version: ESPHome >= 2026.1 never answers
    ``ConnectRequest`` (password-less devices authenticate at hello).
    """

    name: str = "satellite"
    friendly_name: str = "Satellite"
    mac_address: str = "AA:BB:CC:DD:EE:01"
    esphome_version: str = "2025.4.0"
    model: str = "esp32-s3-devkitc-1"
    manufacturer: str = "Espressif"
    project_name: str = ""
    project_version: str = ""
    suggested_area: str = ""
    api_version: tuple[int, int] = (1, 10)
    encryption_key: str | None = None
    """Base64 32-byte Noise PSK; None = plaintext. ``EmulatedDevice(encrypted=True)`` makes one."""
    answer_login: bool | None = None
    features: Feature = VOICE_PE_FEATURES
    media_formats: tuple[MediaFormat, ...] = DEFAULT_FORMATS
    wake_words: tuple[WakeWord, ...] = DEFAULT_WAKE_WORDS
    active_wake_words: tuple[str, ...] = ("okay_nabu",)
    max_active_wake_words: int = 1
    switches: tuple[str, ...] = ("Mute",)
    """Names of switch entities (object ids are derived)."""
    speed: float = 1.0
    """Real-time factor of the mic and playback clocks; > 1 only where a test says so."""
    mic_buffer_ms: int = 512
    """Ring buffer between mic and API (firmware: 512 ms); frames beyond it are lost."""
    use_wake_word: bool = False
    """``use_wake_word`` of the firmware: the client detects the wake word (flag
    ``USE_WAKE_WORD``). Voice PE detects it on the device (False) and sends the phrase."""
    silence_detection: bool = True
    """``USE_VAD`` flag in the start request (firmware: ``silence_detection``)."""
    echo_gain: float = 0.0
    """The mic hears the raw API audio the speaker plays, times this (0: no echo)."""
    echo_delay_ms: int = 120
    """Speaker-to-mic delay of that echo (on top of the client's lead)."""
    profile: str = ""
    """The device profile this configuration came from (``profiles.PROFILES``)."""
    firmware_speaker: bool = False
    """Model the voice assistant's speaker path as the firmware does (``i2s.SpeakerPath``):
    16 KiB buffer, fed on message arrival, I2S ring, DMA, start latency, idle stop."""
    speaker_buffer_ms: int = 100
    """The I2S speaker's ``buffer_duration`` (its ring holds max(50 ms, this))."""
    shared_bus: bool = False
    """Mic and speaker on one I2S bus: the speaker cannot start while the mic holds it."""
    micro_wake_word: bool = False
    """micro_wake_word runs on the mic from client connect (``on_client_connected``)."""
    half_duplex_scripts: bool = False
    """``packages/half-duplex.yaml``: STT_VAD_END stops micro_wake_word
    (``before_reply``); the run's end starts it once the speaker stopped (``after_run``)."""
    mic_stop_events: tuple[int, ...] = ()
    """Extra events that stop the mic stream (linux-voice-assistant: STT_END, RUN_END)."""
    second_channel: str = ""
    """What ``data2`` carries: ``""`` none, ``raw`` (the unprocessed mic), ``echo`` (the
    speaker's reference, linux-voice-assistant)."""
    legacy_device_info: bool = True
    """DeviceInfo sets ``uses_password`` and ``legacy_voice_assistant_version`` (before 2026)."""

    @property
    def version(self) -> tuple[int, ...]:
        """The ESPHome version as a comparable tuple."""
        return _version_tuple(self.esphome_version)

    @property
    def answers_login(self) -> bool:
        """Whether ``ConnectRequest`` gets a ``ConnectResponse``."""
        if self.answer_login is not None:
            return self.answer_login
        return self.version < (2026, 1)

    @property
    def plays_api_audio(self) -> bool:
        """Whether raw API speaker audio reaches a speaker: only with SPEAKER.

        ``VoiceAssistant::on_audio`` (``voice_assistant.cpp``) copies API audio into
        ``speaker_buffer_`` only when the voice assistant has a ``speaker_``; with a
        ``media_player:`` it is dropped on every version.
        """
        return bool(self.features & Feature.SPEAKER)

    @property
    def uses_media_player(self) -> bool:
        """TTS is fetched over HTTP by a media player (no SPEAKER feature)."""
        return not self.features & Feature.SPEAKER
