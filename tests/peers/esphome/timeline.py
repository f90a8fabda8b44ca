"""A scriptable timeline: what the device does, and when.

Steps run in order; ``at`` is seconds after the script started (loop clock), so
``Say(clip, at=0.0), Wake(at=3.0), Drop(at=3.5)`` means "speak, 3 s later a second wake
word, half a second later the Wi-Fi drops". A step without ``at`` runs as soon as the
previous one is done; ``WaitEvent`` waits for the client (event-driven) instead of a time::

    result = await run_script(device, [
        Say(clip, end=True),
        WaitEvent(EventType.STT_END),
        Wake(),                      # barge in right after the transcript
        WaitEvent(EventType.RUN_END),
        Drop(),
    ])
    result.started_at, result.steps  # loop times at which each step ran
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .device import EmulatedDevice
from .record import Entry
from .runs import Interrupt, Run


@dataclass(frozen=True)
class Say:
    """Wake word + speech (see ``EmulatedDevice.say``)."""

    pcm: bytes
    at: float | None = None
    wake_word: str | None = "Okay Nabu"
    end: bool = False
    interrupt: Interrupt = Interrupt.FIRMWARE


@dataclass(frozen=True)
class Wake:
    """A wake word with nothing said after it."""

    at: float | None = None
    wake_word: str = "Okay Nabu"
    interrupt: Interrupt = Interrupt.FIRMWARE


@dataclass(frozen=True)
class EndUtterance:
    """``VoiceAssistantAudio(end=True)``."""

    at: float | None = None


@dataclass(frozen=True)
class Abort:
    """``VoiceAssistantRequest(start=False)``."""

    at: float | None = None


@dataclass(frozen=True)
class Drop:
    """Drop every API connection."""

    at: float | None = None


@dataclass(frozen=True)
class WaitEvent:
    """Wait for a voice event (newer than the script start) before going on."""

    event_type: int
    at: float | None = None


type Step = Say | Wake | EndUtterance | Abort | Drop | WaitEvent


@dataclass
class ScriptResult:
    """When each step ran, and what it produced."""

    started_at: float
    steps: list[tuple[float, Step, Run | Entry | None]] = field(default_factory=list)

    @property
    def runs(self) -> list[Run]:
        """Runs started by the script's steps."""
        return [out for _, _, out in self.steps if isinstance(out, Run)]


async def run_script(device: EmulatedDevice, steps: list[Step]) -> ScriptResult:
    """Run ``steps`` against ``device``; returns when the last step ran."""
    loop = asyncio.get_running_loop()
    since = device.mark()
    result = ScriptResult(started_at=loop.time())
    for step in steps:
        if step.at is not None:
            delay = result.started_at + step.at - loop.time()
            if delay > 0:
                await asyncio.sleep(
                    delay
                )  # the script's own clock, not synchronisation
        out: Run | Entry | None = None
        match step:
            case Say():
                out = device.say(
                    step.pcm,
                    wake_word=step.wake_word,
                    end=step.end,
                    interrupt=step.interrupt,
                )
            case Wake():
                out = device.wake(step.wake_word, interrupt=step.interrupt)
            case EndUtterance():
                device.end_utterance()
            case Abort():
                device.abort()
            case Drop():
                device.drop_connection()
            case WaitEvent():
                out = await device.wait_for_event(step.event_type, since)
                since = out.index + 1
        result.steps.append((loop.time(), step, out))
    return result
