"""openWakeWord engine benchmark on generated speech: printed, nothing asserted.

Run: ``.venv/bin/python scripts/bench_wakeword.py [--quick]`` (needs pyopen-wakeword,
espeak-ng and sox). It measures, with the engine exactly as the ``wake_word`` entity
uses it (``WakeWordEngine`` streams listening to every bundled model):

- detection rate of each wake phrase over espeak-ng voices x speeds, per model,
  per voice and per speed (a detection counts when the phrase's own model fires);
- false detections: other phrases (commands, questions, fragments of wake phrases),
  silence and white noise, per model;
- CPU per second of audio per stream (process CPU time, one model and all models),
  the one-off warm-up and the per-stream open cost;
- detection latency: end of phrase (last 10 ms above -40 dBFS) to the end of the
  80 ms frame that fired, in audio time, plus the compute of that frame, p50/p99.

espeak-ng is one synthetic voice family: the figures say how the models hear it,
not how they hear people. docs/configuration.md records a full run.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
import math
from pathlib import Path
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.audio.wakeword import (
    BYTES_PER_MS,
    FRAME_BYTES,
    WakeWordEngine,
    WakeWordStream,
)
from tests.peers.speech import silence, speak

VOICES = ["en-us", "en-gb", "en-us+f3", "en-us+m3", "en-gb+f2", "en-us+f4"]
RATES = [130, 160, 200]
# (model, text): "hey mycroft" as written, and respelled the way people (and the
# model) say it; espeak-ng reads "mycroft" as "mick-roft".
WAKE = [
    ("okay_nabu", "okay nabu"),
    ("hey_jarvis", "hey jarvis"),
    ("hey_mycroft", "hey mycroft"),
    ("hey_mycroft", "hey my croft"),
    ("alexa", "alexa"),
    ("hey_rhasspy", "hey rhasspy"),
]
OTHER = [
    "turn on the kitchen lights",
    "turn off the bedroom lamp",
    "what is the weather like tomorrow",
    "play some music in the living room",
    "set a timer for ten minutes",
    "what time is it",
    "open the garage door",
    "tell me a joke",
    "okay",
    "hey",
    "hey there",
    "jarvis",
    "nabu",
    "my car is in the garage",
    "a lexical analysis",
]


def speech_end_ms(pcm: bytes) -> int:
    """End of the last 10 ms window louder than -40 dBFS."""
    window = 10 * BYTES_PER_MS
    end = 0
    for start in range(0, len(pcm) - window + 1, window):
        samples = memoryview(pcm[start : start + window]).cast("h")
        rms = math.sqrt(sum(s * s for s in samples) / len(samples))
        if rms > 328:  # 32768 * 10^(-40/20)
            end = start + window
    return end // BYTES_PER_MS


def noise(ms: int, seed: int) -> bytes:
    """White noise at about -20 dBFS."""
    rng = random.Random(seed)
    return b"".join(
        max(-32768, min(32767, int(rng.gauss(0, 3000)))).to_bytes(
            2, "little", signed=True
        )
        for _ in range(ms * 16)
    )


def run(stream: WakeWordStream, pcm: bytes) -> tuple[dict[str, int], list[float]]:
    """Feed ``pcm`` in 10 ms chunks; first detection (audio ms) per model, frame CPU."""
    first: dict[str, int] = {}
    frame_cpu: list[float] = []
    for start in range(0, len(pcm), 320):
        if stream.feed(pcm[start : start + 320]):
            while stream.frames_ready:
                began = time.process_time()
                detection = stream.process()
                frame_cpu.append(time.process_time() - began)
                if detection is not None and detection.model_id not in first:
                    first[detection.model_id] = detection.audio_ms
    stream.close()
    return first, frame_cpu


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def bench_rows(quick: bool, only: set[str]) -> None:
    """Rows 17-18 of ``scripts/bench``: one line each, the same measurements."""
    from scripts.bench_kernel import Row  # noqa: PLC0415

    voices = VOICES[:2] if quick else VOICES
    rates = [160] if quick else RATES
    engine = WakeWordEngine()
    engine.warm_up()
    latencies: list[float] = []
    hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for model_id, text in WAKE:
        if text == "hey mycroft":  # espeak-ng says "mick-roft": see the full table
            continue
        for voice in voices:
            for rate in rates:
                pcm = speak(text, voice=voice, rate=rate)
                first, frame_cpu = run(engine.open_stream(), pcm)
                hits[model_id][1] += 1
                if model_id in first:
                    hits[model_id][0] += 1
                    latencies.append(
                        first[model_id]
                        - speech_end_ms(pcm)
                        + 1000 * statistics.mean(frame_cpu)
                    )
    false_clips = 0
    clips = 0
    for text in OTHER:
        for voice in voices:
            for rate in rates:
                first, _ = run(
                    engine.open_stream(), speak(text, voice=voice, rate=rate)
                )
                clips += 1
                false_clips += bool(first)
    seconds = 10 if quick else 60
    speech = b"".join(speak(t) for t in OTHER)
    speech = (speech * math.ceil(seconds * 1000 * BYTES_PER_MS / len(speech)))[
        : seconds * 1000 * BYTES_PER_MS
    ]
    rtf: dict[str, float] = {}
    for label, ids in (("one model", ["okay_nabu"]), ("all 5 models", None)):
        stream = engine.open_stream(ids)
        stream.feed(speech)
        began = time.process_time()
        while stream.frames_ready:
            stream.process()
        rtf[label] = (time.process_time() - began) / seconds
        stream.close()
    total = sum(n for _, n in hits.values())
    found = sum(h for h, _ in hits.values())
    rows = [
        Row(
            "17 wake word (openWakeWord engine): CPU per stream (real-time factor) and"
            " end of phrase → detection",
            f"RTF {rtf['one model']:.3f} one model, {rtf['all 5 models']:.3f} all"
            f" models ({rtf['all 5 models'] * 100:.1f} % of a core per stream);"
            f" latency p50 {pct(latencies, 0.5):.0f} ms, p99 {pct(latencies, 0.99):.0f}"
            f" ms, max {max(latencies):.0f} ms (n={len(latencies)}, audio time of the"
            " detecting 80 ms frame + its compute)",
            "—",
        ),
        Row(
            f"18 wake word: detection rate on espeak-ng phrases ({len(voices)} voices ×"
            f" {len(rates)} speeds), false detections on other phrases",
            f"{found}/{total} ({100 * found / total:.0f} %): "
            + ", ".join(f"{m} {h}/{n}" for m, (h, n) in hits.items())
            + f"; false: {false_clips} of {clips} clips of {len(OTHER)} other phrases",
            "—",
        ),
    ]
    for row in rows:
        if row.name.split()[0] in only:
            print(f"{row.name} | {row.measured} | {row.target}", flush=True)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 voices, 1 speed")
    parser.add_argument(
        "--rows", action="store_true", help="print rows 17-18 of scripts/bench only"
    )
    parser.add_argument("--only", help="with --rows: comma-separated row numbers")
    args, _unknown = parser.parse_known_args()
    if args.rows:
        only = {"17", "18"}
        if args.only:
            only &= {r.strip() for r in args.only.split(",")}
        if only:
            bench_rows(args.quick, only)
        return
    voices = VOICES[:2] if args.quick else VOICES
    rates = [160] if args.quick else RATES

    print(
        f"# openWakeWord bench — {platform.machine()}, Python {platform.python_version()}"
    )
    engine = WakeWordEngine()
    began = time.process_time()
    engine.warm_up()
    print(
        f"warm-up (once per engine): {1000 * (time.process_time() - began):.0f} ms CPU"
    )
    began = time.process_time()
    for _ in range(20):
        engine.open_stream().close()
    print(
        f"open a stream (all models): {1000 * (time.process_time() - began) / 20:.1f} ms CPU"
    )

    # --- detection rate and latency ------------------------------------------------
    print("\n## Wake phrases (threshold 0.5, every model listening)\n")
    print("| model | phrase | detected | by voice | by speed | wrong model |")
    print("|---|---|---|---|---|---|")
    latencies: list[float] = []
    latency_by_model: dict[str, list[float]] = defaultdict(list)
    for model_id, text in WAKE:
        hits = 0
        total = 0
        wrong = 0
        per_voice: dict[str, int] = defaultdict(int)
        per_rate: dict[int, int] = defaultdict(int)
        for voice in voices:
            for rate in rates:
                pcm = speak(text, voice=voice, rate=rate)
                first, frame_cpu = run(engine.open_stream(), pcm)
                total += 1
                wrong += any(m != model_id for m in first)
                if model_id in first:
                    hits += 1
                    per_voice[voice] += 1
                    per_rate[rate] += 1
                    lat = first[model_id] - speech_end_ms(pcm)
                    lat += 1000 * statistics.mean(frame_cpu)
                    latencies.append(lat)
                    latency_by_model[model_id].append(lat)
        by_voice = " ".join(f"{v}:{per_voice[v]}/{len(rates)}" for v in voices)
        by_rate = " ".join(f"{r}:{per_rate[r]}/{len(voices)}" for r in rates)
        print(
            f"| {model_id} | {text} | {hits}/{total} ({100 * hits / total:.0f} %) "
            f"| {by_voice} | {by_rate} | {wrong} |"
        )

    print(
        "\n## Detection latency: end of phrase -> detection (audio time + frame compute)\n"
    )
    print("| model | n | p50 ms | p99 ms | min ms | max ms |")
    print("|---|---|---|---|---|---|")
    for model_id, values in [*latency_by_model.items(), ("all", latencies)]:
        if values:
            print(
                f"| {model_id} | {len(values)} | {pct(values, 0.5):.0f} | {pct(values, 0.99):.0f}"
                f" | {min(values):.0f} | {max(values):.0f} |"
            )

    # --- false detections ------------------------------------------------------------
    print("\n## Other audio (false detections)\n")
    false_by_model: dict[str, int] = defaultdict(int)
    clips = 0
    audio_ms = 0
    false_clips: list[str] = []
    for text in OTHER:
        for voice in voices:
            for rate in rates:
                pcm = speak(text, voice=voice, rate=rate)
                first, _ = run(engine.open_stream(), pcm)
                clips += 1
                audio_ms += len(pcm) // BYTES_PER_MS
                for model_id in first:
                    false_by_model[model_id] += 1
                if first:
                    false_clips.append(f"{text!r} {voice} {rate}: {sorted(first)}")
    minutes = 1 if args.quick else 3
    for label, pcm in (
        (f"silence {minutes} min", silence(minutes * 60_000)),
        (f"white noise -20 dBFS {minutes} min", noise(minutes * 60_000, seed=8)),
    ):
        first, _ = run(engine.open_stream(), pcm)
        print(f"- {label}: {sorted(first) or 'no detection'}")
    print(
        f"- {len(OTHER)} phrases x {len(voices)} voices x {len(rates)} speeds = {clips} clips"
        f" ({audio_ms / 1000:.0f} s): {len(false_clips)} clips with a detection;"
        f" per model {dict(false_by_model) or 0}"
    )
    for line in false_clips:
        print(f"  - {line}")

    # --- CPU ---------------------------------------------------------------------------
    print("\n## CPU per second of audio, one stream (process CPU time)\n")
    speech = b"".join(speak(t) for t in OTHER)
    speech = (speech * math.ceil(60_000 * BYTES_PER_MS / len(speech)))[
        : 60_000 * BYTES_PER_MS
    ]
    for label, ids in (("one model", ["okay_nabu"]), ("all models", None)):
        stream = engine.open_stream(ids)
        stream.feed(speech)
        began = time.process_time()
        while stream.frames_ready:
            stream.process()
        cpu = time.process_time() - began
        stream.close()
        frames = len(speech) // FRAME_BYTES
        print(
            f"- {label}: {1000 * cpu / 60:.1f} ms CPU per s of audio"
            f" ({100 * cpu / 60:.1f} % of a core), {1000 * cpu / frames:.2f} ms per 80 ms frame"
        )


if __name__ == "__main__":
    main()
