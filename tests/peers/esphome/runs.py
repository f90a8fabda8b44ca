"""The voice assistant's vocabulary: event types, states, and the record of one run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
import enum
from typing import Protocol

from google.protobuf.message import Message

from .record import Entry

USE_VAD = 1 << 0
USE_WAKE_WORD = 1 << 1


class EventType(enum.IntEnum):
    """``VoiceAssistantEventType`` values, including those 29.9.0 lacks."""

    ERROR = 0
    RUN_START = 1
    RUN_END = 2
    STT_START = 3
    STT_END = 4
    INTENT_START = 5
    INTENT_END = 6
    TTS_START = 7
    TTS_END = 8
    WAKE_WORD_START = 9
    WAKE_WORD_END = 10
    STT_VAD_START = 11
    STT_VAD_END = 12
    TTS_STREAM_START = 98
    TTS_STREAM_END = 99
    INTENT_PROGRESS = 100


IGNORED_ERRORS = {"wake-word-timeout", "wake_word_detection_aborted", "no_wake_word"}
STOPPING_ERRORS = {"wake-provider-missing", "wake-engine-missing"}


class Interrupt(enum.StrEnum):
    """What a wake word does while a run is going (see ``VoiceAssistant.wake``)."""

    FIRMWARE = "firmware"
    RESTART = "restart"
    STOP_FIRST = "stop_first"


class State(enum.StrEnum):
    """Firmware states that matter on the wire."""

    IDLE = "idle"
    STARTING_PIPELINE = "starting_pipeline"
    STREAMING_MICROPHONE = "streaming_microphone"
    AWAITING_RESPONSE = "awaiting_response"
    STREAMING_RESPONSE = "streaming_response"


class Client(Protocol):
    """An API connection as the voice assistant sees it."""

    number: int

    def send(self, message: Message) -> None:
        """Send one message to this client."""


@dataclass
class Run:
    """One pipeline run the device started."""

    number: int
    wake_word_phrase: str
    conversation_id: str
    flags: int
    requested_at: float
    continued: bool = False
    """Started by ``continue_conversation`` / ``start_conversation``, not a wake word."""
    streaming_at: float | None = None
    """When the client's ``VoiceAssistantResponse`` (port 0) arrived."""
    streaming: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    """Set when the mic began streaming to the client (after its response)."""
    failed: bool = False
    """The client answered ``error=True``."""
    frames_sent: int = 0
    speech_frames_sent: int = 0
    frames_lost: int = 0
    """Captured while the ring buffer was full, before the response."""
    last_speech_frame_at: float | None = None
    mic_stopped_at: float | None = None
    mic_stop_reason: str = ""
    events: list[Entry] = field(default_factory=list)
    ended_at: float | None = None
    end_reason: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def event_types(self) -> list[int]:
        """Types of the events this run received, in order."""
        return [entry.detail["type"] for entry in self.events]
