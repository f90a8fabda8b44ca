"""Device profiles: the satellites people own, as test parameters.

Each profile is a ``DeviceConfig`` read from that device's firmware:

- ``s3-duplex``: ``firmware/satellite-s3-duplex.yaml`` (``packages/voice.yaml``:
  voice-assistant ``speaker:``, micro_wake_word + stop word, timer triggers;
  ``packages/full-duplex.yaml``; separate I2S buses; speaker ``buffer_duration:
  100ms``). Flags as ``VoiceAssistant::get_feature_flags()`` derives them
  (``voice_assistant.h``): VOICE_ASSISTANT | API_AUDIO | SPEAKER | TIMERS.
- ``atom-echo``: ``firmware/satellite-atom-echo.yaml`` (one I2S bus
  ``i2s_audio_bus`` for mic and speaker, ``buffer_duration: 60ms``,
  ``packages/half-duplex.yaml``). The mic (VA stream or micro_wake_word) holds the
  bus (``i2s_audio_microphone.cpp`` ``start_driver_``: ``parent_->try_lock()``), so
  the speaker starts only once both stopped (``i2s_audio_speaker.cpp``: "Parent bus
  is busy", retry after 1 s).
- ``voice-pe-stock``: Home Assistant Voice PE's stock ``home-assistant-voice.yaml``
  (esphome/home-assistant-voice-pe, the stored copy with ``min_version: 2025.9.0``):
  ``voice_assistant: media_player: external_media_player`` (so ANNOUNCE |
  START_CONVERSATION, never SPEAKER), ``micro_wake_word`` with the ``stop`` model,
  separate buses ``i2s_input``/``i2s_output``, the XMOS-processed mic
  ``i2s_mics`` channel 0 only (no ``microphone2``: that copy sends no second
  channel; the MULTI_CHANNEL_AUDIO variant is ``voice-pe-stock`` with
  ``second_channel="raw"``, assumed from the 2026.6 voice_assistant component).
  Wake word while the voice assistant runs: ``voice_assistant.stop`` only.
- ``linux-voice-assistant``: OHF-Voice/linux-voice-assistant ``satellite.py``: flags
  VOICE_ASSISTANT | API_AUDIO | ANNOUNCE | START_CONVERSATION | TIMERS (+
  MULTI_CHANNEL_AUDIO with a two-channel input: channel 2 is the echo reference),
  answers played from a URL by mpv, the mic stops on STT_VAD_END, STT_END and
  RUN_END (``handle_voice_event``), a wake word while a pipeline runs is ignored.

All speak API 1.19 (ESPHome 2026.x ``HelloResponse``); the ESPHome boards run
2026.10.0 and never answer the login; their DeviceInfo has no ``uses_password``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .config import DeviceConfig, Feature, MediaFormat, WakeWord

FIRMWARE = "2026.10.0"
API_1_19 = (1, 19)

_PROJECT_WAKE_WORDS = (WakeWord("okay_nabu", "Okay Nabu"),)  # the stop word is internal

PROFILES: dict[str, DeviceConfig] = {
    "s3-duplex": DeviceConfig(
        name="rtvoice-s3-duplex",
        friendly_name="Realtime Voice S3",
        esphome_version=FIRMWARE,
        api_version=API_1_19,
        project_name="rtvoice.full-duplex",
        project_version="1.0",
        features=Feature.VOICE_ASSISTANT
        | Feature.API_AUDIO
        | Feature.SPEAKER
        | Feature.TIMERS,
        wake_words=_PROJECT_WAKE_WORDS,
        switches=("Timer ringing",),
        firmware_speaker=True,
        speaker_buffer_ms=100,
        micro_wake_word=True,
        legacy_device_info=False,
        profile="s3-duplex",
    ),
    "atom-echo": DeviceConfig(
        name="rtvoice-atom-echo",
        friendly_name="Realtime Voice Atom Echo",
        model="m5stack-atom",
        esphome_version=FIRMWARE,
        api_version=API_1_19,
        project_name="rtvoice.half-duplex",
        project_version="1.0",
        features=Feature.VOICE_ASSISTANT
        | Feature.API_AUDIO
        | Feature.SPEAKER
        | Feature.TIMERS,
        wake_words=_PROJECT_WAKE_WORDS,
        switches=("Timer ringing",),
        firmware_speaker=True,
        speaker_buffer_ms=60,
        shared_bus=True,
        micro_wake_word=True,
        half_duplex_scripts=True,
        legacy_device_info=False,
        profile="atom-echo",
    ),
    "voice-pe-stock": DeviceConfig(
        name="home-assistant-voice-0a1b2c",
        friendly_name="Home Assistant Voice 0a1b2c",
        esphome_version=FIRMWARE,
        api_version=API_1_19,
        project_name="Nabu Casa.Home Assistant Voice PE",
        project_version="25.10.0",
        features=Feature.VOICE_ASSISTANT
        | Feature.API_AUDIO
        | Feature.TIMERS
        | Feature.ANNOUNCE
        | Feature.START_CONVERSATION,
        media_formats=(MediaFormat("flac", 48000, 1, 2, announcement=True),),
        wake_words=(
            WakeWord("okay_nabu", "Okay Nabu"),
            WakeWord("hey_jarvis", "Hey Jarvis"),
            WakeWord("hey_mycroft", "Hey Mycroft"),
        ),
        switches=("Mute", "Wake sound"),
        micro_wake_word=True,
        legacy_device_info=False,
        profile="voice-pe-stock",
    ),
    "linux-voice-assistant": DeviceConfig(
        name="linux-voice-assistant",
        friendly_name="Linux Voice Assistant",
        esphome_version="2025.9.0",
        api_version=API_1_19,
        model="Linux Voice Assistant",
        manufacturer="Open Home Foundation",
        project_name="Open Home Foundation.Linux Voice Assistant",
        features=Feature.VOICE_ASSISTANT
        | Feature.API_AUDIO
        | Feature.ANNOUNCE
        | Feature.START_CONVERSATION
        | Feature.TIMERS
        | Feature.MULTI_CHANNEL_AUDIO,
        switches=("Mute",),
        mic_stop_events=(4, 2),  # STT_END, RUN_END (STT_VAD_END as every device)
        second_channel="echo",
        profile="linux-voice-assistant",
    ),
}

PROFILE_NAMES = tuple(PROFILES)


def profile(name: str, **overrides: Any) -> DeviceConfig:
    """Return the ``DeviceConfig`` of profile ``name``, with ``overrides``."""
    try:
        config = PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown device profile {name!r} ({', '.join(PROFILES)})"
        ) from None
    return replace(config, **overrides)
