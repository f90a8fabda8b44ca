"""End of turn by what was said, and speculative answers (issue 18 §3): rows 20-23.

Printed, never asserted. Each stream is a ``DuplexConversation`` (the product's
session, its DSP worker, the warmed pymicro-vad segmenter) on a real ``Kernel``
whose ``OpenAIChatProvider`` talks HTTP to the loopback OpenAI peer; the mic is fed
espeak-ng speech in 32 ms chunks at real-time pace (as the ESPHome firmware sends
it); answer frames are timed when the session sends them (the device link is not
in the path: rows 12-13 measure it). Every configuration runs in the same process
and run as its baseline ("off": the turn ends by silence alone, today's path).

Utterances: 40 commands and questions x several voices (``UTTERANCES``); a third
of them say the first words, pause 300-600 ms, and say the rest. Most pauses
follow an unfinished phrase ("turn on the | kitchen lights"), one in five a
complete one ("turn off the lights | in the hall"): those can be cut off.

STT is an oracle: it returns the words whose audio the mic has delivered by the
time it is called (no recognition errors; no punctuation), after ``stt_ms``. TTS
yields pre-made espeak-ng clips in 100 ms chunks, the first after ``tts_ms``. The
peer's first token comes after ``first_token_ms``. "Instant": 0/0/0; "realistic":
150/400/100 ms (the issue's figures). The STT and TTS delays are in-process
(``asyncio.sleep``), the model's is the loopback HTTP peer's.

- 20: end of speech (last loud sample of the utterance, mic time) -> first answer
  frame, instant peers: p50/p99, off vs auto.
- 21: the same with realistic peers, and the ratio auto/off of the p50.
- 22: false cut-offs (the first answer frame before the user finished), per
  eagerness level (and, for comparison, with instant peers).
- 23: extra model requests and tokens per utterance from speculation (requests
  of preempted rounds, their estimated prompt + emitted tokens), and the peer's
  requests per utterance against the baseline.

Run: ``.venv/bin/python scripts/bench_turn.py [--quick] [--only 20,22]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
import random
import sys
import time

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions, Eagerness
from custom_components.rtvoice.duplex_link import (
    DuplexBinding,
    DuplexConversation,
    RoundEnds,
    warm_segmenter,
)
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from scripts.bench_kernel import Row, pct
from tests.peers.openai_server import DEFAULT_MODEL, Delay, OpenAIPeer, Text
from tests.peers.speech import silence, speak

RATE = 16000
CHUNK = 1024  # bytes: the firmware's 32 ms mic messages
CHUNK_S = CHUNK / 2 / RATE
LOUD = 300  # |sample| above this is sound (about -41 dBFS)
ANSWER = "Okay, done."
WAIT_S = 4.0  # an answer later than this after the end of speech is "missed"
QUIET_S = 0.2  # the answer has played out when no frame came for this long
GAP_S = 0.5  # silence after an answer, before the next utterance
VOICES = ("en-us", "en-gb", "en-us+f2", "en-gb+f3", "en-us+m3")

# (first words, rest): the rest empty = said in one go. Pauses go between them.
UTTERANCES: tuple[tuple[str, str], ...] = (
    ("turn on the", "kitchen lights"),
    ("turn off the", "living room lamp"),
    ("set the thermostat to", "twenty one degrees"),
    ("what is the", "weather like tomorrow"),
    ("set a timer for", "ten minutes"),
    ("open the", "garage door"),
    ("dim the bedroom lights to", "thirty percent"),
    ("play some music in the", "kitchen"),
    ("is the front door", "locked"),
    ("turn off the lights", "in the hall"),  # complete before the pause
    ("close the blinds", "in the office"),  # complete before the pause
    ("what time is it", ""),
    ("turn on the kitchen lights", ""),
    ("turn off all the lights", ""),
    ("lock the front door", ""),
    ("what is the temperature outside", ""),
    ("how long until the washing machine is done", ""),
    ("start the robot vacuum", ""),
    ("is the garage door open", ""),
    ("tell me a joke", ""),
    ("set an alarm for seven tomorrow morning", ""),
    ("what is on my calendar today", ""),
    ("turn the heating down a little", ""),
    ("switch on the fan in the bedroom", ""),
    ("how warm is it in the living room", ""),
    ("add milk to the shopping list", ""),
    ("pause the music", ""),
    ("when does the sun set today", ""),
    ("turn the porch light on", ""),
    ("what was the last thing i asked you", ""),
)


# --------------------------------------------------------------------------- clips


@dataclass
class Clip:
    """One utterance as the mic hears it, with where its words end."""

    text: str
    first: str  # the words before the pause ("" when said in one go)
    pcm: bytes
    first_end: int  # sample where the first words' sound ends (0: no pause)
    end: int  # sample where the last sound ends
    pause_ms: int = 0

    def words_at(self, samples: int) -> str:
        """Return the words whose sound the mic has delivered by ``samples``."""
        if samples >= self.end:
            return self.text
        if self.first_end and samples >= self.first_end:
            return self.first
        return ""


def loud_end(pcm: bytes) -> int:
    """Sample after the last loud one."""
    samples = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    return int(np.flatnonzero(samples > LOUD)[-1]) + 1


def loud_start(pcm: bytes) -> int:
    """Sample of the first loud one."""
    samples = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.int32))
    return int(np.flatnonzero(samples > LOUD)[0])


def make_clips(count: int, seed: int) -> list[Clip]:
    """``count`` utterances: phrases x voices, a third with a mid-sentence pause."""
    rng = random.Random(seed)
    paused = [u for u in UTTERANCES if u[1]]
    whole = [u for u in UTTERANCES if not u[1]]
    clips: list[Clip] = []
    for index in range(count):
        voice = VOICES[index % len(VOICES)]
        if index % 3 == 0:
            first, rest = paused[(index // 3) % len(paused)]
            pause_ms = rng.randrange(300, 601, 10)
            # espeak-ng pads its clips with silence: cut it, so the pause between
            # the two sounds is pause_ms.
            head = speak(first, voice=voice, lead_ms=300, tail_ms=0)
            head = head[: 2 * loud_end(head)]
            tail = speak(rest, voice=voice, lead_ms=0, tail_ms=0)
            tail = tail[2 * loud_start(tail) :]
            pcm = head + silence(pause_ms) + tail
            clips.append(
                Clip(
                    f"{first} {rest}",
                    first,
                    pcm,
                    loud_end(head),
                    loud_end(pcm),
                    pause_ms,
                )
            )
        else:
            text = whole[index % len(whole)][0]
            pcm = speak(text, voice=voice, lead_ms=300, tail_ms=0)
            clips.append(Clip(text, "", pcm, 0, loud_end(pcm)))
    return clips


# --------------------------------------------------------------------------- peers


@dataclass
class Delays:
    """The peers' latencies (seconds)."""

    stt: float = 0.0
    first_token: float = 0.0
    tts: float = 0.0


class Stream:
    """One conversation: its mic position, its oracle STT, its answer frames."""

    def __init__(self, delays: Delays, answer_clip: bytes) -> None:
        """No clip yet."""
        self.delays = delays
        self.answer_clip = answer_clip
        self.clip: Clip | None = None
        self.fed = 0  # samples of the current clip delivered
        self.frames: list[float] = []  # loop time of every answer frame sent
        self.stt_calls = 0

    async def stt(self, pcm: bytes) -> str:
        """Return the words delivered so far (an oracle), after the STT delay."""
        self.stt_calls += 1
        words = self.clip.words_at(self.fed) if self.clip is not None else ""
        if self.delays.stt:
            await asyncio.sleep(self.delays.stt)
        return words

    async def tts(self, text: str) -> AsyncIterator[bytes]:
        """Yield the answer clip in 100 ms chunks, the first after the TTS delay."""
        if self.delays.tts:
            await asyncio.sleep(self.delays.tts)
        for start in range(0, len(self.answer_clip), 3200):
            yield self.answer_clip[start : start + 3200]

    async def send(self, frame: bytes) -> None:
        """Note an answer frame."""
        self.frames.append(asyncio.get_running_loop().time())


@dataclass
class Result:
    """What one configuration measured."""

    name: str
    latencies: list[float] = field(default_factory=list)  # end of speech -> audio
    false_cutoffs: int = 0
    missed: int = 0
    utterances: int = 0
    paused: int = 0
    requests: int = 0  # model requests the peer got
    preempted_requests: int = 0
    preempted_tokens: int = 0
    speculations: int = 0
    preempted: int = 0
    early_ends: int = 0
    spoken_over: int = 0  # early ends heard, then spoken over
    stt_calls: int = 0


async def run_stream(
    binding: DuplexBinding, stream: Stream, clips: list[Clip], result: Result
) -> None:
    """Say ``clips`` one after the other into one conversation; time the answers."""
    loop = asyncio.get_running_loop()
    segmenter = await warm_segmenter()
    conversation = await DuplexConversation.open(
        binding, name="bench", send=stream.send, segmenter=segmenter
    )
    start = loop.time()
    chunks = 0

    async def feed(pcm: bytes, *, said: bool = False) -> None:
        nonlocal chunks
        for offset in range(0, len(pcm), CHUNK):
            chunks += 1
            due = start + chunks * CHUNK_S
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            conversation.session.feed_mic(pcm[offset : offset + CHUNK])
            if said:  # the oracle STT knows how much of the clip was said
                stream.fed = min(len(pcm), offset + CHUNK) // 2

    try:
        await feed(silence(1000))  # the gate learns the room
        for clip in clips:
            stream.clip, stream.fed = clip, 0
            began = start + chunks * CHUNK_S  # mic time of the clip's first sample
            frames_before = len(stream.frames)
            await feed(clip.pcm, said=True)
            end_at = began + clip.end / RATE
            if DEBUG:
                print(f"clip {clip.text!r} began {began:.3f} end {end_at:.3f}")
            waited = 0.0
            while len(stream.frames) == frames_before and waited < WAIT_S:
                await feed(silence(32))
                waited += CHUNK_S
            # Let every answer play out (a cut-off one has a second answer).
            settle = 0.0
            while settle < WAIT_S and (
                not conversation.session.idle
                or (stream.frames and loop.time() - stream.frames[-1] < QUIET_S)
            ):
                await feed(silence(32))
                settle += CHUNK_S
            result.utterances += 1
            result.paused += bool(clip.first_end)
            new = stream.frames[frames_before:]
            if not new:
                result.missed += 1
            elif new[0] < end_at:
                result.false_cutoffs += 1
                if DEBUG:
                    print(
                        f"FALSE {clip.text!r} first {new[0] - end_at:.3f} after end, {new[0] - began:.3f} after began"
                    )
            else:
                result.latencies.append(new[0] - end_at)
            stream.clip = None
            await feed(silence(round(GAP_S * 1000)))
        stats = conversation.session.stats
        result.speculations += stats.speculations
        result.preempted += stats.preempted
        result.early_ends += stats.early_ends
        result.spoken_over += stats.spoken_over_ends
        result.stt_calls += stream.stt_calls
        kernel_stats = binding.kernel.stats(conversation.child_id)
        if kernel_stats is not None:
            result.preempted_requests += kernel_stats.preempted_requests
            result.preempted_tokens += kernel_stats.preempted_tokens
    finally:
        await conversation.aclose()


async def run_config(
    name: str,
    eagerness: Eagerness | None,
    delays: Delays,
    clips: list[Clip],
    streams: int,
) -> Result:
    """Run ``clips`` over ``streams`` conversations at once on one kernel and peer."""
    result = Result(name)
    async with OpenAIPeer() as peer:
        steps = [Text(ANSWER)]
        if delays.first_token:
            steps.insert(0, Delay(delays.first_token))
        peer.default_reply(*steps)
        round_ends = RoundEnds()
        kernel = Kernel(
            OpenAIChatProvider(
                base_url=peer.base_url, api_key="sk-bench", model=DEFAULT_MODEL
            ),
            ChannelRegistry(),
            on_round_end=round_ends,
            on_text_pause=round_ends.paused,  # as the product wires it (runtime.py)
        )
        parts = [clips[i::streams] for i in range(streams)]
        runs = []
        for part in parts:
            stream = Stream(delays, ANSWER_CLIP)
            binding = DuplexBinding(
                kernel=kernel,
                stt=stream.stt,
                tts=stream.tts,
                options=DuplexOptions(
                    barge_in=BargeIn.VAD, end_silence_ms=0, eagerness=eagerness
                ),
                round_ends=round_ends,
                idle_timeout_s=0,
            )
            runs.append(run_stream(binding, stream, part, result))
        try:
            await asyncio.gather(*runs)
        finally:
            await kernel.stop_all()
        result.requests = len(peer.requests)
    return result


ANSWER_CLIP = b""
DEBUG = False


# --------------------------------------------------------------------------- main


def ms(values: list[float]) -> str:
    """p50/p99 of seconds, in ms."""
    if not values:
        return "n=0"
    return (
        f"p50 {pct(values, 50) * 1e3:.0f} ms, p99 {pct(values, 99) * 1e3:.0f} ms"
        f" (n={len(values)})"
    )


def show(row: Row) -> None:
    """Print one row of the table at once."""
    print(f"{row.name} | {row.measured} | {row.target}", flush=True)


def cost(res: Result, base: Result) -> str:
    """Extra requests/tokens per utterance of ``res`` against its baseline."""
    n = max(1, res.utterances)
    return (
        f"{res.preempted_requests / n:.2f} extra requests and"
        f" {res.preempted_tokens / n:.0f} extra tokens per utterance"
        f" ({res.early_ends} turns ended early, {res.speculations} answered ahead;"
        f" {res.preempted} withdrawn before their answer went out,"
        f" {res.spoken_over} early ends spoken over once heard); the peer got"
        f" {res.requests / n:.2f} requests per utterance ({base.name}:"
        f" {base.requests / max(1, base.utterances):.2f}); STT calls per utterance"
        f" {res.stt_calls / n:.2f} ({base.name}: {base.stt_calls / max(1, base.utterances):.2f})"
    )


def cutoffs(res: Result) -> str:
    """Describe the false cut-offs of one configuration."""
    share = 100 * res.false_cutoffs / max(1, res.utterances)
    return (
        f"{res.name} {res.false_cutoffs}/{res.utterances} ({share:.1f} %,"
        f" {res.paused} with a pause; {res.missed} missed)"
    )


async def main(args: argparse.Namespace) -> None:
    """Run the selected rows."""
    global ANSWER_CLIP  # noqa: PLW0603 - made once, read by every stream
    rows = {"20", "21", "22", "23"}
    if args.only:
        rows &= {r.strip() for r in args.only.split(",")}
    if not rows:
        return
    ANSWER_CLIP = await asyncio.to_thread(speak, ANSWER, lead_ms=0, tail_ms=100)
    clips = await asyncio.to_thread(make_clips, args.utterances, 18)
    instant, realistic = Delays(), Delays(0.150, 0.400, 0.100)
    started = time.monotonic()
    results: dict[str, Result] = {}

    async def pair(tag: str, delays: Delays, levels: list[Eagerness | None]) -> None:
        runs = await asyncio.gather(
            *(
                run_config(
                    f"{level.value if level else 'off'}",
                    level,
                    delays,
                    clips,
                    args.streams,
                )
                for level in levels
            )
        )
        for level, res in zip(levels, runs, strict=True):
            results[f"{tag}:{level.value if level else 'off'}"] = res

    if rows & {"20", "23"}:
        await pair("instant", instant, [None, Eagerness.AUTO])
    if rows & {"21", "22", "23"}:
        await pair("realistic", realistic, [None, Eagerness.AUTO])
    if rows & {"22", "23"} and not args.quick:
        await pair("realistic", realistic, [Eagerness.LOW, Eagerness.HIGH])
    if "20" in rows:
        off, auto = results["instant:off"], results["instant:auto"]
        show(
            Row(
                "20 duplex: end of speech → first answer frame (instant STT/LLM/TTS"
                f" peers, {auto.utterances} utterances, {auto.paused} with a"
                " 300–600 ms pause)",
                f"auto: {ms(auto.latencies)}; off (today's path, same run):"
                f" {ms(off.latencies)}",
                "p50 ≤ 300 ms",
            )
        )
    if "21" in rows:
        off, auto = results["realistic:off"], results["realistic:auto"]
        ratio = (
            pct(auto.latencies, 50) / pct(off.latencies, 50)
            if auto.latencies and off.latencies
            else float("nan")
        )
        show(
            Row(
                "21 duplex: end of speech → first answer frame (STT 150 ms, first"
                " token 400 ms, TTS first chunk 100 ms)",
                f"auto: {ms(auto.latencies)}; off: {ms(off.latencies)};"
                f" p50 ratio auto/off {ratio:.2f}",
                "p50 ≤ 700 ms",
            )
        )
    if "22" in rows:
        names = ["realistic:off", "realistic:low", "realistic:auto", "realistic:high"]
        # With instant peers an early end's answer comes before a long pause is
        # over, so its revocable window closes sooner: shown for comparison.
        fast = [n for n in ("instant:off", "instant:auto") if n in results]
        show(
            Row(
                "22 duplex: false cut-offs (first answer frame before the user"
                " finished), realistic peers",
                "; ".join(cutoffs(results[n]) for n in names if n in results)
                + (
                    " (instant peers: "
                    + "; ".join(cutoffs(results[n]) for n in fast)
                    + ")"
                    if fast
                    else ""
                ),
                "≤ 3 %",
            )
        )
    if "23" in rows:
        show(
            Row(
                "23 duplex: extra model requests and tokens per utterance from"
                " speculation",
                "; ".join(
                    f"{key.replace(':', ' ')}: {cost(results[key], results[base])}"
                    for key, base in (
                        ("instant:auto", "instant:off"),
                        ("realistic:auto", "realistic:off"),
                        ("realistic:low", "realistic:off"),
                        ("realistic:high", "realistic:off"),
                    )
                    if key in results
                ),
                "bounded (≤ 1 speculative round per utterance)",
            )
        )
    print(f"(rows 20-23 took {time.monotonic() - started:.0f} s)", file=sys.stderr)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--utterances", type=int, default=102, help="per config")
    parser.add_argument("--streams", type=int, default=4, help="conversations at once")
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument("--only", help="comma-separated row numbers (20-23)")
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.utterances, parsed.streams = 12, 3
    return parsed


if __name__ == "__main__":
    asyncio.run(main(_parse()))
