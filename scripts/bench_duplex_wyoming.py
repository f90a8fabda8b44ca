"""Wyoming duplex benchmark (issue 8 §4): row 19 of ``scripts/bench``. Printed, not asserted.

``WyomingSatelliteLink`` (the product's link, a Wyoming TCP client) against an
in-process Wyoming satellite on 127.0.0.1, not the real ``wyoming-satellite``
program: the real program reads its mic from a ``--mic-command`` pipe and buffers
it, so when a sample was "spoken" is not known to the bench; the in-process
satellite streams its mic as ``audio-chunk`` events of 32 ms at the mic clock's pace
(always-streaming mode, as ``wyoming-satellite`` without ``--vad``) and so knows the
loop time of every sample. The wake word is the satellite's ``detection`` event. The
kernel is real (HTTP to the loopback OpenAI peer, answering at once); STT and TTS
are the instant in-process callables of ``bench_duplex_esphome.py``.

- 19: speech onset in the mic stream -> the last ``audio-chunk`` of the answer the
  satellite receives (``vad`` barge-in, no echo), over a chain of barge-ins in one
  conversation. The answer's ``audio-stop`` (sent at the cut) delimits it.

Run: ``.venv/bin/python scripts/bench_duplex_wyoming.py [--quick] [--only 19]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
import random
import sys
from typing import Any, Self

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import async_read_event, async_write_event
from wyoming.wake import Detection

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions
from custom_components.rtvoice.duplex_link import DuplexBinding
from custom_components.rtvoice.wyoming_link import WyomingSatelliteLink
from scripts.bench_duplex_esphome import (
    ANSWER,
    ASK,
    USERS,
    InstantSpeech,
    answer_clips,
    kernel_and_peer,
    loud_span,
    ms,
)
from scripts.bench_kernel import Row
from tests.peers.speech import speak

SAFETY = 60.0  # seconds: a safety net against hangs, never a synchronisation
RATE = 16000
CHUNK_SAMPLES = 512  # 32 ms
CHUNK_SECONDS = CHUNK_SAMPLES / RATE


@dataclass
class Spoken:
    """A clip said into the satellite's mic, with its loud span in loop time."""

    onset_at: float
    end_at: float


@dataclass
class Received:
    """What the satellite's speaker side got: (kind, loop time)."""

    events: list[tuple[str, float]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, kind: str, at: float) -> None:
        """Record an event."""
        self.events.append((kind, at))
        self.changed.set()

    def mark(self) -> int:
        """Index of the next event."""
        return len(self.events)

    async def wait_for(self, kind: str, after: int = 0) -> int:
        """Index of the first ``kind`` at ``after`` or later."""
        async with asyncio.timeout(SAFETY):
            while True:
                for index in range(after, len(self.events)):
                    if self.events[index][0] == kind:
                        return index
                self.changed.clear()
                await self.changed.wait()


class FakeSatellite:
    """An always-streaming Wyoming satellite on 127.0.0.1 that knows its mic's time."""

    def __init__(self) -> None:
        """Not serving yet."""
        self.host = "127.0.0.1"
        self.port = 0
        self.received = Received()
        self._pending = bytearray()
        self._writer: asyncio.StreamWriter | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_chunk = 0
        self._origin = 0.0
        self.connected = asyncio.Event()

    async def __aenter__(self) -> Self:
        """Listen on a free port."""
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop serving; end every task."""
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._writer = writer
        mic = asyncio.get_running_loop().create_task(self._mic(writer))
        self._tasks.add(mic)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connected.set()
        loop = asyncio.get_running_loop()
        try:
            while (event := await async_read_event(reader)) is not None:
                now = loop.time()
                if AudioChunk.is_type(event.type):
                    self.received.add("chunk", now)
                elif AudioStart.is_type(event.type):
                    self.received.add("start", now)
                elif AudioStop.is_type(event.type):
                    self.received.add("stop", now)
        finally:
            mic.cancel()

    async def _mic(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        self._origin = loop.time()
        self._next_chunk = 0
        await async_write_event(
            AudioStart(rate=RATE, width=2, channels=1).event(), writer
        )
        while True:
            due = self._origin + (self._next_chunk + 1) * CHUNK_SECONDS
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)  # the mic's pace
            pcm = bytes(self._pending[: CHUNK_SAMPLES * 2])
            del self._pending[: CHUNK_SAMPLES * 2]
            pcm += bytes(CHUNK_SAMPLES * 2 - len(pcm))
            self._next_chunk += 1
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm)
            await async_write_event(chunk.event(), writer)

    def wake(self) -> None:
        """Send a detection: the satellite's own wake word fired."""
        assert self._writer is not None
        task = asyncio.get_running_loop().create_task(
            async_write_event(Detection(name="hey_jarvis").event(), self._writer)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def say(self, pcm: bytes) -> Spoken:
        """Queue a clip (nothing else queued); its loud span on the mic's clock."""
        if self._pending:
            raise RuntimeError("the mic is still saying something")
        onset, end = loud_span(pcm)
        first = self._next_chunk * CHUNK_SAMPLES  # the next chunk starts the clip
        self._pending += pcm
        return Spoken(
            self._origin + (first + onset) / RATE, self._origin + (first + end) / RATE
        )

    @property
    def saying(self) -> bool:
        """True while queued speech is left."""
        return bool(self._pending)


@contextlib.asynccontextmanager
async def wyoming_link(host: str, port: int, binding: DuplexBinding) -> Any:
    """Yield the product's link on ``binding`` (its conversations, its kernel)."""
    link = WyomingSatelliteLink(host, port, binding, name="bench")
    link.start()
    try:
        yield link
    finally:
        await link.aclose()


async def barge_chain(trials: int, seed: int) -> tuple[list[float], int]:
    """One conversation, ``trials`` barge-ins: onset -> last chunk (s), misses."""
    rng = random.Random(seed)
    clips = await asyncio.to_thread(answer_clips)
    users = [
        await asyncio.to_thread(speak, text, voice=voice, lead_ms=0, tail_ms=300)
        for text, voice in USERS
    ]
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    speech = InstantSpeech(clips)
    options = DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=0)
    latencies: list[float] = []
    misses = 0
    async with (
        kernel_and_peer(speech, options, echo=False, answer=ANSWER) as (binding, _),
        FakeSatellite() as sat,
        wyoming_link(sat.host, sat.port, binding) as link,
    ):
        await asyncio.wait_for(link.wait_connected(), SAFETY)
        mark = sat.received.mark()
        sat.wake()
        await asyncio.sleep(0.1)  # the link opens its session
        sat.say(ask)
        await sat.received.wait_for("chunk", mark)
        for trial in range(-1, trials):
            await asyncio.sleep(rng.uniform(0.8, 1.6))  # into the answer
            mark = sat.received.mark()
            spoken = sat.say(users[trial % len(users)])
            stop = await sat.received.wait_for("stop", mark)
            chunks = [
                at for kind, at in sat.received.events[mark:stop] if kind == "chunk"
            ]
            start = await sat.received.wait_for("start", stop)
            await sat.received.wait_for("chunk", start)
            if trial < 0:
                continue
            if chunks:
                latencies.append(chunks[-1] - spoken.onset_at)
            else:
                misses += 1  # the answer had paused before the user spoke
    return latencies, misses


def show(row: Row) -> None:
    """Print one row of the table at once."""
    print(f"{row.name} | {row.measured} | {row.target}", flush=True)


async def main(args: argparse.Namespace) -> None:
    """Run row 19."""
    if args.only and "19" not in {r.strip() for r in args.only.split(",")}:
        return
    latencies, misses = await barge_chain(args.trials, seed=5)
    show(
        Row(
            "19 Wyoming duplex: speech onset in the mic stream → last audio chunk of"
            " the answer at the satellite (WyomingSatelliteLink, in-process satellite"
            " on 127.0.0.1, vad, no echo)",
            f"{ms(latencies)}; {misses} answers already silent at the onset",
            "p99 ≤ 50 ms",
        )
    )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50, help="barge-ins")
    parser.add_argument("--quick", action="store_true", help="8 barge-ins")
    parser.add_argument("--only", help="comma-separated row numbers (19)")
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.trials = 8
    return parsed


if __name__ == "__main__":
    asyncio.run(main(_parse()))
