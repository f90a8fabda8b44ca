"""What the duplex session needs from the outside: the kernel's child, STT, TTS, transport.

The adapter (ESPHome, Wyoming) binds them; tests use fakes. ``KernelChild`` binds a
child of the realtime kernel (``Kernel.push/interrupt/acknowledge`` with a child id).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
import enum
from typing import Any, Protocol

from .turn import Eagerness


class TicketLike(Protocol):
    """What ``push`` returns: the round's sequence number and its outcome."""

    seq: int
    outcome: asyncio.Future[Any]


class ConversationChild(Protocol):
    """The kernel child a session talks to (acknowledged delivery)."""

    def push(self, text: str, *, speculative: bool = False) -> TicketLike:
        """Push the user's words; the running round is cancelled (latest wins).

        ``speculative``: answered but held (no tool, no history) until ``confirm``.
        """

    def confirm(self, seq: int) -> bool:
        """Confirm the speculative input ``seq``; False when too late (push again)."""

    def withdraw(self, seq: int) -> object:
        """Take input ``seq`` back (a speculation the user talked on over)."""

    def interrupt(self) -> object:
        """Cancel the running round without new input."""

    def acknowledge(self, seq: int, chars: int, *, final: bool = False) -> object:
        """Report that the first ``chars`` characters of round ``seq`` reached the user."""


class KernelLike(Protocol):
    """The three kernel methods a ``KernelChild`` forwards to."""

    def push(
        self, child_id: str, text: str, *, speculative: bool = False
    ) -> TicketLike:
        """See ``Kernel.push``."""

    def confirm(self, child_id: str, seq: int) -> bool:
        """See ``Kernel.confirm``."""

    def withdraw(self, child_id: str, seq: int) -> object:
        """See ``Kernel.withdraw``."""

    def interrupt(self, child_id: str) -> object:
        """See ``Kernel.interrupt``."""

    def acknowledge(
        self, child_id: str, seq: int, chars: int, *, final: bool = False
    ) -> object:
        """See ``Kernel.acknowledge``."""


@dataclass(frozen=True, slots=True)
class KernelChild:
    """A kernel child bound to its id, as a ``ConversationChild``."""

    kernel: KernelLike
    child_id: str

    def push(self, text: str, *, speculative: bool = False) -> TicketLike:
        """Push into the child."""
        return self.kernel.push(self.child_id, text, speculative=speculative)

    def confirm(self, seq: int) -> bool:
        """Confirm a speculative input."""
        return self.kernel.confirm(self.child_id, seq)

    def withdraw(self, seq: int) -> object:
        """Withdraw an input."""
        return self.kernel.withdraw(self.child_id, seq)

    def interrupt(self) -> object:
        """Interrupt the child's round."""
        return self.kernel.interrupt(self.child_id)

    def acknowledge(self, seq: int, chars: int, *, final: bool = False) -> object:
        """Acknowledge heard text of round ``seq``."""
        return self.kernel.acknowledge(self.child_id, seq, chars, final=final)


SpeechToText = Callable[[bytes], Awaitable[str]]
"""Transcribe one utterance (16 kHz mono s16le PCM); "" when it holds no words."""

TextToSpeech = Callable[[str], AsyncIterator[bytes]]
"""Synthesise one sentence as 16 kHz mono s16le PCM chunks."""

SendFrame = Callable[[bytes], Awaitable[None]]
"""Send one frame of answer audio to the device."""

Recogniser = Callable[[str], Awaitable[bool]]
"""Whether a transcript is a whole command (HA: its own intent matching, not run)."""


class BargeIn(enum.StrEnum):
    """What may interrupt an answer while it plays."""

    VAD = "vad"  # speech onset pauses, words cancel (needs echo cancellation)
    WAKE_WORD = "wake_word"  # only the wake word interrupts (safe without AEC)
    OFF = "off"  # nothing interrupts while speaking


@dataclass(frozen=True, slots=True)
class DuplexOptions:
    """How a duplex session behaves."""

    barge_in: BargeIn = BargeIn.VAD
    # The session ends after this much mic silence following an answer (0: never).
    end_silence_ms: int = 8000
    # After an onset pause, resume when the VAD has found no speech by then
    # (pymicro-vad finds speech 110-350 ms after its onset; the pause comes ~40 ms in).
    confirm_ms: int = 400
    # ... but not while the gate is still open (sound goes on), up to this long.
    max_pause_ms: int = 1500
    stt_timeout_s: float = 15.0  # a transcription that takes longer is a failure
    tts_chunk_timeout_s: float = 15.0  # so is a TTS stream that stalls this long
    lead_ms: int = 100  # audio kept queued on the device
    frame_ms: int = 10  # answer audio frame size sent to the device
    early_first_clause_chars: int = 24  # see sentences.SentenceSplitter (0: off)
    # End of turn by what was said (turn.py): None ends turns by silence alone.
    # At a short silence of ``turn_pause_ms`` the words so far are transcribed and
    # judged: the turn ends at once, or is answered speculatively (held until the
    # hangover confirms it), or waits.
    eagerness: Eagerness | None = None
    turn_pause_ms: int = 220
