"""The duplex core of Realtime Voice: pure asyncio and audio, no Home Assistant imports.

Mic frames in, the answer's sentences out as paced audio frames, barge-in by voice,
history acknowledged as heard. DESIGN §5.5; shared by the ESPHome and Wyoming
adapters, which bind the kernel child, STT, TTS and the transport::

    echo = EchoCanceller() if echo_unavailable_reason() is None else None
    segmenter = await hass.async_add_executor_job(UtteranceSegmenter)  # warms the VAD
    session = DuplexSession(
        KernelChild(kernel, child_id),   # push / interrupt / acknowledge
        stt=transcribe,                  # async (pcm) -> str, "" when no words
        tts=synthesise,                  # (sentence) -> AsyncIterator[bytes], 16 kHz s16le
        send=send_audio_frame,           # async (frame) -> None, to the device
        options=DuplexOptions(barge_in=BargeIn.VAD),
        segmenter=segmenter,
        echo=echo,
        on_end=return_to_wake_word,      # silence after the last answer
        dsp=DspWorker(),                 # one per stream: AEC/gate/VAD off the loop
    )
    # the kernel's output side (the round's seq with each delta, and its end):
    session.output_delta(seq, delta); session.output_end(seq)
    # the device:
    session.feed_mic(chunk)              # any size; DSP on the dsp= worker, else inline
    session.wake_word_detected()         # wake_word barge-in mode
    await session.aclose()               # no task left
"""

from __future__ import annotations

from .audio import BYTES_PER_MS, FRAME_BYTES, FRAME_MS, SAMPLE_RATE, FrameChunker
from .clock import Clock, LoopClock, VirtualClock
from .contracts import (
    BargeIn,
    ConversationChild,
    DuplexOptions,
    KernelChild,
    Recogniser,
    SendFrame,
    SpeechToText,
    TextToSpeech,
    TicketLike,
)
from .echo import (
    ENGINE_AEC3,
    ENGINE_NUMPY,
    EchoCanceller,
    unavailable_reason as echo_unavailable_reason,
)
from .gate import GateEvent, OnsetGate, RoomLevel
from .heard import HeardLedger
from .player import PacedPlayer, PlayerState
from .segmenter import (
    UtteranceEnded,
    UtteranceSegmenter,
    UtteranceStarted,
    VadUnavailableError,
    micro_vad_scorer,
)
from .sentences import Sentence, SentenceSplitter
from .session import DuplexSession, SessionState, SessionStats
from .turn import Eagerness, TurnVerdict, judge_turn
from .worker import DspWorker

__all__ = [
    "BYTES_PER_MS",
    "ENGINE_AEC3",
    "ENGINE_NUMPY",
    "FRAME_BYTES",
    "FRAME_MS",
    "SAMPLE_RATE",
    "BargeIn",
    "Clock",
    "ConversationChild",
    "DspWorker",
    "DuplexOptions",
    "DuplexSession",
    "Eagerness",
    "EchoCanceller",
    "FrameChunker",
    "GateEvent",
    "HeardLedger",
    "KernelChild",
    "LoopClock",
    "OnsetGate",
    "PacedPlayer",
    "PlayerState",
    "Recogniser",
    "RoomLevel",
    "SendFrame",
    "Sentence",
    "SentenceSplitter",
    "SessionState",
    "SessionStats",
    "SpeechToText",
    "TextToSpeech",
    "TicketLike",
    "TurnVerdict",
    "UtteranceEnded",
    "UtteranceSegmenter",
    "UtteranceStarted",
    "VadUnavailableError",
    "VirtualClock",
    "echo_unavailable_reason",
    "judge_turn",
    "micro_vad_scorer",
]
