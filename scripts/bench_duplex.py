"""Duplex benchmark (issue 10 §4, simulated): prints a table, writes nothing.

Everything runs in a simulated room (tests/duplex/echo_sim.py): the device plays
what the paced player sends, its mic hears the echo (delay 50–400 ms drifting
slowly, attenuation, a diffuse tail) plus the user (espeak) or a noise burst, in
ESPHome's 32 ms mic chunks. Times are on the simulation's clock (mic audio time),
so they are the algorithm's latencies; the DSP's own CPU time per mic chunk is
printed apart. Run from the repository root:

    .venv/bin/python scripts/bench_duplex.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
import random
import sys
import time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.duplex import (
    DuplexSession,
    EchoCanceller,
    OnsetGate,
    UtteranceSegmenter,
    echo_unavailable_reason,
)
from tests.duplex.conftest import noise
from tests.duplex.echo_sim import (
    SENTENCES,
    Device,
    Drive,
    Room,
    SteppedClock,
    pcm_steps,
    run_answer,
)
from tests.duplex.fakes import FakeChild
from tests.peers.speech import speak

USER_PHRASES = (
    ("no wait, turn it off", "en-gb+f3"),
    ("stop", "en-us+m3"),
    ("what about the bedroom", "en-us+f2"),
    ("actually make it warmer", "en-gb"),
)


def pct(values: list[float], q: float) -> float:
    """Return the q-quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def row(name: str, values: list[float], unit: str = "ms") -> None:
    """Print p50/p99/max of ``values``."""
    if not values:
        print(f"| {name} | n=0 | – | – | – |")
        return
    print(
        f"| {name} | n={len(values)} | {pct(values, 0.5):.0f} {unit}"
        f" | {pct(values, 0.99):.0f} {unit} | {max(values):.0f} {unit} |"
    )


async def barge_ins(
    clips, users, n: int, *, aec: bool, gain_db: float, echo_gate: bool = False
) -> tuple[list[float], list[float], int]:
    """Run ``n`` answers the user talks over; return latencies and missed count."""
    rng = random.Random(1)
    last_frame: list[float] = []
    dsp_per_chunk: list[float] = []
    missed = 0
    for i in range(n):
        user = users[i % len(users)]
        run = await run_answer(
            clips,
            aec=aec,
            delay_ms=rng.uniform(50, 400),
            seed=i,
            user=user,
            user_at_ms=rng.randrange(600, 3500),
            gain_db=gain_db,
            echo_gate=echo_gate,
        )
        if run.onset_to_last_frame_ms is None:
            missed += 1
            continue
        last_frame.append(run.onset_to_last_frame_ms)
        dsp_per_chunk.append(run.dsp_seconds / (run.mic_seconds / 0.032) * 1000)
    return last_frame, dsp_per_chunk, missed


class InstantChild(FakeChild):
    """A kernel child whose model answers at once (the integration's own cost only)."""

    def __init__(self) -> None:
        """No session yet."""
        super().__init__()
        self.session: DuplexSession | None = None

    def push(self, text: str):
        """Answer the pushed words at once with one sentence."""
        ticket = super().push(text)
        assert self.session is not None
        asyncio.get_running_loop().call_soon(
            self.session.output_delta, ticket.seq, "Sure. "
        )
        asyncio.get_running_loop().call_soon(self.session.output_end, ticket.seq)
        return ticket


async def end_to_first_frame(users: list[bytes], n: int) -> list[float]:
    """End of the user's speech in the mic -> first answer frame sent, instant peers."""
    out: list[float] = []
    for i in range(n):
        clock = SteppedClock()
        device = Device(clock=clock)
        child = InstantChild()

        async def stt(pcm: bytes) -> str:
            return "words"

        async def tts(text: str):
            yield bytes(3200)

        session = DuplexSession(child, stt=stt, tts=tts, send=device.send, clock=clock)
        child.session = session
        drive = Drive(session, device, Room(delay_ms=100, gain_db=-70, seed=i), clock)
        for _ in range(50 + i % 7):
            await drive.step()
        user = users[i % len(users)]
        speech_end = (
            drive.steps * 10 + (len(user) - 300 * 32) / 32
        ) / 1000  # tail: 300 ms
        for step in pcm_steps(user):
            await drive.step(step)
        while not device.sent and drive.steps < 500:
            await drive.step()
        out.append((device.sent[0][0] - speech_end) * 1000)
        await session.aclose()
    return out


async def main(quick: bool) -> None:
    """Print the table."""
    if (reason := echo_unavailable_reason()) is not None:
        print(f"server AEC unavailable: {reason}")
        return
    n_barge = 20 if quick else 50
    n_answers = 20 if quick else 100
    clips = {s: speak(s, lead_ms=0, tail_ms=150) for s in SENTENCES}
    users = [
        speak(text, voice=voice, lead_ms=0, tail_ms=300) for text, voice in USER_PHRASES
    ]

    print("| measure | n | p50 | p99 | max |")
    print("|---|---|---|---|---|")
    # 1. Onset in the mic stream -> last answer frame sent.
    for label, aec, gain in (
        ("barge-in, no echo (board AEC), no server AEC", False, -70.0),
        ("barge-in over echo -8 dB, server AEC", True, -8.0),
        ("barge-in over echo -20 dB, server AEC", True, -20.0),
    ):
        latencies, dsp, missed = await barge_ins(
            clips, users, n_barge, aec=aec, gain_db=gain
        )
        row(f"{label}: onset → last frame sent", latencies)
        print(
            f"|   DSP per 32 ms chunk p99 {pct(dsp, 0.99) * 1000:.0f} µs; missed {missed} |||||"
        )
    latencies, _, missed = await barge_ins(
        clips, users, n_barge, aec=True, gain_db=-20.0, echo_gate=True
    )
    row("barge-in over echo -20 dB, server AEC + echo-aware gate", latencies)

    # 2. End of utterance -> first answer frame, instant STT/LLM/TTS.
    row(
        "end of speech → first answer frame (instant peers; VAD tail + 250 ms hangover)",
        await end_to_first_frame(users, n_barge),
    )

    # 3. False barge-in: a noise burst during playback, STT hears no words.
    gaps: list[float] = []
    rng = random.Random(2)
    for i in range(n_barge):
        burst = noise(rng.randrange(80, 250), -15, seed=i)
        run = await run_answer(
            clips,
            aec=False,
            delay_ms=100,
            seed=i,
            user=burst,
            user_at_ms=rng.randrange(600, 3500),
            gain_db=-70.0,
            stt_text="",
        )
        gaps += run.pause_gaps_ms
    row("false barge-in (noise burst): pause → resume", gaps)

    # 5. Self-interruptions per 100 answers with echo, vad barge-in.
    for aec in (False, True):
        rng = random.Random(3)
        pushes = pauses = 0
        for i in range(n_answers):
            run = await run_answer(
                clips,
                aec=aec,
                delay_ms=rng.uniform(50, 400),
                seed=1000 + i,
                gain_db=rng.uniform(-14, -6),
            )
            pushes += run.pushes
            pauses += run.pauses
        scale = 100 / n_answers
        print(
            f"| echo, {'with' if aec else 'without'} server AEC: per 100 answers |"
            f" n={n_answers} | self-interruptions {pushes * scale:.0f}"
            f" | pauses {pauses * scale:.0f} | |"
        )

    # 4. CPU per stream: VAD + gate + AEC over 10 s of speech with echo, 20 streams.
    pcm = b"".join(users) * 4
    pcm = pcm[: 10 * 32000]
    streams = [
        (UtteranceSegmenter(), OnsetGate(), EchoCanceller(engine="aec3"))
        for _ in range(20)
    ]
    started = time.process_time()
    for segmenter, gate, aec in streams:
        aec.far_end(pcm, at_sample=0)
        for i in range(0, len(pcm), 320):
            frame = aec.process(pcm[i : i + 320])
            gate.process(frame)
            segmenter.process_frame(frame)
    cpu = time.process_time() - started
    per_stream = cpu / 20 / 10
    print(
        f"| CPU per stream (VAD + gate + AEC) | 20 streams × 10 s |"
        f" {per_stream * 1000:.1f} ms per s of audio | 20 streams: {per_stream * 20 * 100:.0f} %"
        f" of one core | ({per_stream * 20 * 50:.0f} % of 2 cores) |"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    asyncio.run(main(parser.parse_args().quick))
