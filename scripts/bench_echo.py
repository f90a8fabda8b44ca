"""Echo cancellation benchmark (issue 19 §3): ours vs AEC3 vs none, one run, one table.

Every condition is a room of tests/duplex/room.py (image-source impulse responses,
a small speaker that distorts as it gets loud, playback and capture clocks up to
±50 ppm apart, the device's own output latency) at an echo-to-user ratio; the
answer and the user are espeak-ng speech. Per ratio and canceller:

- ERLE (dB) over far-end-only speech, open loop, after 8 s of learning, and the
  near-end distortion in double talk (the canceller's output minus the user, over
  the user; lower is better);
- self-interruptions per 100 answers: the product's chain (canceller → onset gate →
  pymicro-vad → a fake STT that hears words in anything) plays answers with no user;
  every push is a self-interruption;
- onset → pause p50/p99 over barge-ins at +10 dB (and misses: no pause at all);
- false barge-ins per hour of answers with the TV on (pauses with no user), and
  barge-ins with the TV on (a user 5 dB over it);
- CPU per stream: the canceller's own time per second of audio, and the whole
  mic DSP (canceller + gate + VAD) per second.

Our canceller keeps what it learned from one answer to the next in the same room
(as the product does per satellite); the first answer in each room is cold. AEC3
starts fresh each answer (as the product makes one per conversation). The onset
gate's room level (how loud the room gets by itself) is kept across the answers of
a room, as the satellite keeps it. Run from the repository root:

    .venv/bin/python scripts/bench_echo.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import replace
import os
from pathlib import Path
import sys
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.duplex.echo import EchoCanceller, unavailable_reason
from custom_components.rtvoice.duplex.fdaf import FdafCanceller
from custom_components.rtvoice.duplex.gate import RoomLevel
from tests.duplex.echo_sim import SENTENCES, run_answer
from tests.duplex.room import STEP, RealRoom, RoomSpec, background_signal, grid
from tests.peers.speech import speak

RATIOS = (-10.0, 0.0, 5.0, 10.0, 15.0)
# Ours with the device's own echo reference (MULTI_CHANNEL_AUDIO: the second
# channel, sample-aligned, on the mic's clock) instead of the placed time line.
REFERENCED = "numpy, device reference"
USERS = (
    ("no wait, turn it off", "en-gb+f3"),
    ("stop", "en-us+m3"),
    ("what about the bedroom", "en-us+f2"),
    ("actually make it warmer", "en-gb"),
)


def pct(values: list[float], q: float) -> float:
    """Return the q-quantile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def db(x: np.ndarray) -> float:
    """Mean power in dB."""
    return 10 * float(np.log10(np.mean(x**2) + 1e-9))


def samples(pcm: bytes) -> np.ndarray:
    """Return s16le PCM as floats."""
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def open_loop(
    spec: RoomSpec, engine: str, far: np.ndarray, near: np.ndarray
) -> tuple[float, float, float]:
    """ERLE after learning, near-end distortion in double talk, canceller ms per s."""
    room = RealRoom(spec)
    aec = EchoCanceller(engine=engine) if engine != "none" else None
    start = len(far) // STEP - len(near) // STEP - 30
    outs = []
    spent = 0.0
    for i in range(len(far) // STEP):
        played = far[i * STEP : (i + 1) * STEP]
        j = i - start
        voice = near[j * STEP : (j + 1) * STEP] if 0 <= j < len(near) // STEP else None
        mic = room.mic_step(played, voice)
        if aec is None:
            outs.append(samples(mic))
            continue
        began = time.perf_counter()
        aec.far_end(played.astype("<i2").tobytes(), at_sample=i * STEP)
        outs.append(samples(aec.process(mic)))
        spent += time.perf_counter() - began
    out = np.concatenate(outs)
    echo = np.concatenate(room.echo_part)
    user = np.concatenate(room.user_part)
    learnt = slice(8 * 16000, start * STEP)
    erle = db(echo[learnt]) - db(out[learnt])
    s0, s1 = start * STEP, (start + len(near) // STEP) * STEP
    lag = 32 if engine == "numpy" else 0  # the suppressor's 2 ms
    best = min(
        db(out[s0 + k : s1] - user[s0 : s1 - k]) for k in {0, lag, 160, 320}
    )  # AEC3 delays by up to a frame
    distortion = best - db(user[s0:s1])
    return erle, distortion, spent / (len(far) / 16000) * 1000


def make_echo(engine: str, learned: list[FdafCanceller]) -> EchoCanceller | None:
    """Return a canceller for one answer; ours goes on from the room's last one."""
    if engine == "none":
        return None
    if engine.startswith("numpy"):
        echo = EchoCanceller(learned=learned[0] if learned else None)
        learned[:] = [echo.fdaf] if echo.fdaf is not None else []
        return echo
    return EchoCanceller(engine=engine)


async def answers(
    specs: list[RoomSpec], engine: str, clips, per_room: int, **kwargs
) -> list:
    """Play ``per_room`` answers in each room; return the runs."""
    runs = []
    device_reference = engine == REFERENCED
    for spec in specs:
        if device_reference:  # the device's reference: one clock with its mic
            spec = replace(spec, skew_ppm=0.0)
        learned: list[FdafCanceller] = []
        room_level = RoomLevel()  # the satellite's, across its conversations
        for k in range(per_room):
            background = None
            if spec.background is not None:
                background = background_signal(spec.background, 30.0, seed=k)
            room = RealRoom(spec, background=background)
            echo = make_echo(engine, learned)
            run = await run_answer(
                clips,
                aec=echo is not None,
                echo=echo,
                delay_ms=0,
                seed=k,
                room=room,
                device_reference=device_reference,
                room_level=room_level,
                **{key: (v(k) if callable(v) else v) for key, v in kwargs.items()},
            )
            runs.append(run)
    return runs


def barge_figures(runs: list) -> str:
    """Onset → pause p50 | p90 | p99 | missed, as table cells."""
    latencies = [r.onset_to_pause_ms for r in runs if r.onset_to_pause_ms]
    missed = sum(r.onset_to_pause_ms is None for r in runs)
    cells = [
        f"{pct(latencies, q):.0f} ms" if latencies else "–" for q in (0.5, 0.9, 0.99)
    ]
    return " | ".join([*cells, str(missed)])


async def main(quick: bool, smoke: bool) -> None:
    """Print the table."""
    engines = ["numpy", "none"]
    if unavailable_reason("aec3") is None:
        engines.insert(1, "aec3")
    rooms = 1 if smoke else 2
    per_room = 1 if smoke else 2
    barge_per_room = 1 if smoke else 6 if quick else 25
    tv_per_room = 1 if smoke else 4
    ratios = (10.0,) if smoke else RATIOS
    clips = {s: speak(s, lead_ms=0, tail_ms=150) for s in SENTENCES}
    users = [speak(t, voice=v, lead_ms=0, tail_ms=300) for t, v in USERS]
    far = samples(speak(" ".join(SENTENCES * 2), lead_ms=0, tail_ms=0))
    near = samples(speak(USERS[0][0] + ", " + USERS[2][0], voice="en-gb+f3"))
    started = time.perf_counter()
    load = os.getloadavg()[0]
    print(
        f"rooms: {rooms} (RT60 0.2–0.8 s), answers per room and ratio: {per_room},"
        f" barge-ins per engine at +10 dB: {rooms * barge_per_room};"
        f" load average at start {load:.1f} on {os.cpu_count()} cores"
    )
    print()
    print(
        "| ratio | canceller | ERLE far end | near-end distortion (DT)"
        " | self-interruptions /100 answers (cold first) |"
    )
    print("|---|---|---|---|---|")
    cpu: dict[str, list[float]] = {e: [] for e in engines}
    dsp: dict[str, list[float]] = {e: [] for e in engines}
    for ratio in ratios:
        specs = grid((ratio,), rooms=rooms)
        for engine in [*engines, REFERENCED]:
            erles, dists = [], []
            for spec in specs if engine != REFERENCED else ():
                erle, dist, ms = open_loop(spec, engine, far, near)
                erles.append(erle)
                dists.append(dist)
                if engine != "none":
                    cpu[engine].append(ms)
            runs = await answers(specs, engine, clips, per_room)
            pushes = [run.pushes for run in runs]
            cold = [pushes[i] for i in range(0, len(pushes), per_room)]
            for run in runs:
                dsp.setdefault(engine, []).append(
                    run.dsp_seconds / run.mic_seconds * 1000
                )
            erle = f"{np.mean(erles):.1f} dB" if erles else "–"
            dist = f"{np.mean(dists):+.1f} dB" if dists else "–"
            print(
                f"| {ratio:+.0f} dB | {engine} | {erle} | {dist}"
                f" | {100 * sum(p > 0 for p in pushes) / len(pushes):.0f}"
                f" ({sum(p > 0 for p in cold)} of {len(cold)} cold) |"
            )
    print()
    print(
        "| canceller | barge-ins at +10 dB | onset → pause p50 | p90 | p99 | missed |"
    )
    print("|---|---|---|---|---|---|")
    specs = grid((10.0,), rooms=rooms)
    for engine in [*(e for e in engines if e != "none"), REFERENCED]:
        runs = await answers(
            specs,
            engine,
            clips,
            barge_per_room,
            user=lambda k: users[k % len(users)],
            user_at_ms=lambda k: 1500 + 130 * (k % 11),
        )
        print(f"| {engine} | {len(runs)} | {barge_figures(runs)} |")
    print()
    print(
        "| canceller | TV on (0 dB, TV −5 dB under the user), no user"
        " | false barge-ins per hour |"
    )
    print("|---|---|---|")
    specs = [
        replace(s, background="tv", background_db=-5.0)
        for s in grid((0.0,), rooms=rooms)
    ]
    for engine in engines:
        runs = await answers(specs, engine, clips, tv_per_room)
        seconds = sum(r.mic_seconds for r in runs)
        false = sum(r.pauses + r.pushes for r in runs)
        cold = sum(
            runs[i].pauses + runs[i].pushes for i in range(0, len(runs), tv_per_room)
        )
        print(
            f"| {engine} | {len(runs)} answers, {seconds:.0f} s"
            f" | {3600 * false / seconds:.0f} ({false} pauses or pushes,"
            f" {cold} in the first answer of a room) |"
        )
    print()
    print(
        "| canceller | barge-ins with the TV on (0 dB, TV −5 dB under the user)"
        " | onset → pause p50 | p90 | p99 | missed |"
    )
    print("|---|---|---|---|---|---|")
    for engine in [e for e in engines if e != "none"]:
        runs = await answers(
            specs,
            engine,
            clips,
            barge_per_room // 2 if not smoke else 1,
            user=lambda k: users[k % len(users)],
            user_at_ms=lambda k: 1500 + 130 * (k % 11),
        )
        print(f"| {engine} | {len(runs)} | {barge_figures(runs)} |")
    print()
    print(
        "| canceller | canceller CPU per stream | whole mic DSP per stream | 20 streams |"
    )
    print("|---|---|---|---|")
    for engine in engines:
        own = f"{np.mean(cpu[engine]):.1f} ms/s" if cpu[engine] else "–"
        whole = float(np.mean(dsp[engine]))
        print(
            f"| {engine} | {own} | {whole:.1f} ms/s | {20 * whole / 1000:.2f} cores |"
        )
    print()
    print(
        f"wall {time.perf_counter() - started:.0f} s,"
        f" load average at the end {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer barge-ins")
    parser.add_argument("--smoke", action="store_true", help="one of each")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.smoke))
