"""Event-loop time per 32 ms mic chunk: the DSP inline vs on the stream's worker.

Prints figures (run with ``-s``); asserts only behaviour (both paths reach the same
decisions), never timings. The mic hears an espeak answer as echo (the simulated
room of echo_sim.py) with the user talking over it; the session runs the real
pymicro-vad, the onset gate and, when livekit is installed, AEC3.

"Loop CPU" is the main thread's CPU time (``time.thread_time``) per chunk over the
whole run, the loop's own overhead included; "feed + apply" is the wall time of
``feed_mic`` plus the applying callback (worker mode) per chunk.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from custom_components.rtvoice.duplex import (
    DspWorker,
    DuplexOptions,
    DuplexSession,
    EchoCanceller,
    echo_unavailable_reason,
)
from tests.duplex.echo_sim import SENTENCES, Room, pcm_steps
from tests.duplex.fakes import FakeChild, FakeStt, FakeTransport, FakeTts

CHUNK = 32 * 32  # 32 ms of 16 kHz s16le


def mic_audio(clip) -> bytes:
    """~6 s at the mic: the answer's echo, the user over it from 2 s on."""
    answer = clip(" ".join(SENTENCES), lead_ms=0, tail_ms=0)
    user = pcm_steps(clip("no wait, turn it off", lead_ms=0, tail_ms=0))
    room = Room(delay_ms=150, seed=1)
    out = bytearray()
    for index, step in enumerate(pcm_steps(answer)[:600]):
        voice = user[index - 200] if 0 <= index - 200 < len(user) else None
        out += room.mic_step(step, voice)
    return bytes(out)


async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    """Yield to the loop over and over; record how long each turn took to come back."""
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0)
        now = time.perf_counter()
        gaps.append((now - last) * 1000)
        last = now


async def run(
    pcm: bytes, *, worker: bool, tick: bool = False
) -> tuple[list[float], float, int, list[float]]:
    """Feed ``pcm`` chunk by chunk; per-chunk loop times, CPU per chunk, utterances.

    A ticker task runs meanwhile: its gaps are the loop's longest holds.
    """
    dsp = DspWorker() if worker else None
    echo = EchoCanceller() if echo_unavailable_reason() is None else None
    session = DuplexSession(
        FakeChild(),
        stt=FakeStt(*["words"] * 10),
        tts=FakeTts(),
        send=FakeTransport().send,
        options=DuplexOptions(end_silence_ms=0),
        echo=echo,
        dsp=dsp,
    )
    applied = asyncio.Event()
    apply_times: list[float] = []
    original_apply = session._apply  # noqa: SLF001 - timing its callback

    def timed_apply(epoch, results) -> None:
        started = time.perf_counter()
        original_apply(epoch, results)
        apply_times.append(time.perf_counter() - started)
        applied.set()

    session._apply = timed_apply  # type: ignore[method-assign]  # noqa: SLF001
    if echo is not None:
        echo.far_end(pcm, at_sample=0)  # a reference that lines up with the echo
    feed_times: list[float] = []
    chunks = [pcm[i : i + CHUNK] for i in range(0, len(pcm) - CHUNK + 1, CHUNK)]
    stop, gaps = asyncio.Event(), []
    ticking = asyncio.create_task(ticker(stop, gaps)) if tick else None
    cpu = time.thread_time()
    for chunk in chunks:
        applied.clear()
        started = time.perf_counter()
        session.feed_mic(chunk)
        feed_times.append(time.perf_counter() - started)
        await applied.wait()  # worker: its result is back; inline: already set
        if tick:
            await asyncio.sleep(0)  # the ticker's turn
    cpu = time.thread_time() - cpu
    stop.set()
    if ticking is not None:
        await ticking
    await session.aclose()
    if dsp is not None:
        await dsp.aclose()
    per_chunk = [(f + a) * 1000 for f, a in zip(feed_times, apply_times, strict=True)]
    return per_chunk, cpu / len(chunks) * 1000, session.stats.utterances, gaps


@pytest.mark.usefixtures("clip")
async def test_loop_time_per_chunk_inline_and_on_the_worker(clip) -> None:
    """Print the loop's share; the worker path must reach the same decisions."""
    pcm = mic_audio(clip)
    figures, ticks = {}, {}
    for worker in (False, True, False, True):  # twice each: warm caches first
        figures[worker] = await run(pcm, worker=worker)
        ticks[worker] = (await run(pcm, worker=worker, tick=True))[3]
    for worker, (per_chunk, cpu, _, _) in figures.items():
        gaps = ticks[worker]
        ordered = sorted(per_chunk)
        holds = sorted(gaps)
        print(  # noqa: T201 - the figures are the point of this test
            f"\n{'worker' if worker else 'inline'}: feed + apply per 32 ms chunk"
            f" p50 {statistics.median(ordered):.3f} ms,"
            f" p99 {ordered[int(0.99 * (len(ordered) - 1))]:.3f} ms;"
            f" loop-thread CPU per chunk {cpu:.3f} ms;"
            f" loop turns seen by a ticker task p99 {holds[int(0.99 * (len(holds) - 1))]:.3f} ms,"
            f" max {holds[-1]:.3f} ms"
            f" (AEC {'on' if echo_unavailable_reason() is None else 'off'})"
        )
    assert figures[True][2] == figures[False][2]  # same utterances found
