"""Duplex on each device profile, measured as heard (issue 20 §4): rows 24-27 of ``scripts/bench``.

Printed, never asserted. The product's path as in ``bench_duplex_esphome.py`` (the
real aioesphomeapi client inside ``EsphomeLink``, a real ``Kernel`` on the loopback
OpenAI peer answering at once, instant in-process STT/TTS), but the device is one
of the profiles of ``tests/peers/esphome/profiles.py`` and the figures are read
from what its loudspeaker emitted (``device.loudspeaker``: the firmware's 16 KiB
buffer, I2S ring, 5 x 10 ms DMA, start latency, idle stop), not from frames sent.

- 20 (s3-duplex, ``vad``): speech onset in the mic -> the last sample of the cut
  answer leaves the loudspeaker (audible silence, device queue included), over a
  chain of barge-ins in one conversation; and pause -> that sample (what the
  device still played after the link stopped sending).
- 21 (atom-echo, shared bus): a full turn (heard = sent, dropped, "bus busy"),
  the dead time from the answer's last audible sample to the mic streaming again;
  the button during an answer -> silence, -> the answer cut at the link, -> the
  mic streaming again.
- 22 (voice-pe-stock, linux-voice-assistant: media-player announcements of the live
  stream): onset -> the media player's STOP command at the device (the emulated
  player stops at once; a real one still plays its decoder and speaker buffers,
  not modelled), over a chain of barge-ins.
- 23: per profile, a full turn and a barge-in turn pass; answer audio heard =
  answer audio sent; bytes the device dropped.
- 28 (s3-duplex): mic audio of a request said right after a wake-word barge-in
  that never reached the link: the project firmware's event path, and its
  stop → start path (``end_run``, then a new start: what firmware without
  duplex mode does).

(The numbers above are the rows' old names: now 24, 25, 26, 27.) Row 24 runs
the project firmware (``ProjectFirmware``: silenced at the pause).

Run: ``.venv/bin/python scripts/bench_duplex_profiles.py [--quick] [--only 20,23]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
import random
import sys
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions, SessionState
from custom_components.rtvoice.duplex_link import DuplexBinding
from custom_components.rtvoice.duplex_stream import StreamRegistry
from custom_components.rtvoice.esphome_link import EsphomeLink, LinkConfig
from scripts.bench_duplex_esphome import (
    ANSWER,
    ASK,
    SAFETY,
    SHORT_ANSWER,
    USERS,
    InstantSpeech,
    RoomMic,
    States,
    answer_clips,
    kernel_and_peer,
    ms,
)
from scripts.bench_kernel import Row
from tests.duplex.test_media_fallback import stream_server
from tests.peers.esphome import EmulatedDevice, Kind
from tests.peers.esphome.actions import ProjectFirmware
from tests.peers.esphome.i2s import BYTES_PER_S, Played
from tests.peers.esphome.mic import FRAME_SECONDS, Frame
from tests.peers.speech import speak


@dataclass
class Sat:
    """One profile device, its mic, its link, and a tap on the API audio it got."""

    device: EmulatedDevice
    mic: RoomMic
    link: EsphomeLink
    states: States
    api_bytes: int = 0
    bytes_at_pause: int | None = None
    firmware: ProjectFirmware | None = None


@contextlib.asynccontextmanager
async def profile_satellite(
    profile: str,
    binding: DuplexBinding,
    streams: StreamRegistry | None,
    *,
    project: bool = False,
    mic: RoomMic | None = None,
) -> AsyncIterator[Sat]:
    """Yield a connected profile device and the product's link to it.

    ``project``: the device runs the project firmware's actions and scripts
    (``ProjectFirmware``: silence at a pause, barge-in events).
    """
    loop = asyncio.get_running_loop()
    async with EmulatedDevice(profile=profile, encrypted=True) as device:
        firmware = ProjectFirmware(device) if project else None
        mic = mic or RoomMic(loop, None)
        states = States()
        note_state = states.__call__
        holder: list[Sat] = []

        def on_state(state: SessionState) -> None:
            if state is SessionState.PAUSED and holder:
                holder[0].bytes_at_pause = holder[0].api_bytes
            note_state(state)

        link = EsphomeLink(
            LinkConfig(
                host=device.host,
                port=device.port,
                noise_psk=device.noise_psk,
                login_timeout=0.5,
                backoff_min=0.05,
                backoff_max=0.2,
            ),
            binding,
            on_state=on_state,
            streams=streams,
        )
        sat = Sat(device, mic, link, states, firmware=firmware)
        holder.append(sat)
        device.voice.mic = mic
        original = device.voice.on_audio

        def on_audio(message: Any) -> None:
            original(message)
            sat.api_bytes += len(message.data)

        device.voice.on_audio = on_audio  # type: ignore[method-assign]
        link.start()
        try:
            await asyncio.wait_for(link.wait_connected(), SAFETY)
            await asyncio.wait_for(device.wait_for_voice_client(), SAFETY)
            yield sat
        finally:
            await link.aclose()
        if device.voice.errors:
            print(f"emulator errors: {device.voice.errors}", file=sys.stderr)


def heard_at_offset(played: list[Played], offset: int) -> float | None:
    """Loop time at which byte ``offset`` of the API audio stream left the loudspeaker."""
    seen = 0
    for span in played:
        if seen + len(span.pcm) >= offset:
            return span.at + (offset - seen) / BYTES_PER_S
        seen += len(span.pcm)
    return None


def heard_bytes(played: list[Played]) -> int:
    """Bytes the loudspeaker emitted."""
    return sum(len(span.pcm) for span in played)


async def open_conversation(sat: Sat, ask: bytes) -> int:
    """Wake word + the ask; the state index once the answer plays."""
    mark = sat.states.mark()
    sat.device.say(b"")
    spoken = sat.mic.say(ask)
    await asyncio.wait_for(spoken.heard.wait(), SAFETY)
    return await sat.states.wait_for(SessionState.SPEAKING, after=mark)


@dataclass
class Chain:
    """A chain of barge-ins (seconds)."""

    onset_to_silent: list[float] = field(default_factory=list)
    pause_to_silent: list[float] = field(default_factory=list)
    onset_to_pause: list[float] = field(default_factory=list)
    cut: int = 0
    missed: int = 0  # utterances the VAD did not take as words (no cut)
    stop_commands: list[float] = field(default_factory=list)  # onset -> STOP
    dropped: int = 0


async def barge_chain(
    profile: str, trials: int, seed: int, *, project: bool = False
) -> Chain:
    """One conversation on ``profile``, ``trials`` ``vad`` barge-ins (one warm-up)."""
    rng = random.Random(seed)
    speech = InstantSpeech(await asyncio.to_thread(answer_clips))
    users = [
        await asyncio.to_thread(speak, text, voice=voice, lead_ms=0, tail_ms=300)
        for text, voice in USERS
    ]
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    options = DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=0)
    chain = Chain()
    media = profile in ("voice-pe-stock", "linux-voice-assistant")
    async with contextlib.AsyncExitStack() as stack:
        streams = await stack.enter_async_context(stream_server()) if media else None
        binding, _ = await stack.enter_async_context(
            kernel_and_peer(speech, options, echo=False, answer=ANSWER)
        )
        sat = await stack.enter_async_context(
            profile_satellite(profile, binding, streams, project=project)
        )
        await open_conversation(sat, ask)
        for trial in range(-1, trials):
            await asyncio.sleep(rng.uniform(0.4, 0.9))  # into the answer (a scenario)
            speech.reply = f"words {trial}"
            mark = sat.states.mark()
            since = sat.device.mark()
            spoken = sat.mic.say(users[trial % len(users)])
            cut = await sat.states.wait_for(SessionState.LISTENING, after=mark)
            # The cut answer's last byte in the API stream: sent before the pause
            # (the link sends nothing of it after), else before the cut.
            offset = (
                sat.bytes_at_pause if sat.bytes_at_pause is not None else sat.api_bytes
            )
            sat.bytes_at_pause = None
            pauses = [
                at
                for state, at in sat.states.seen[mark:cut]
                if state is SessionState.PAUSED
            ]
            try:
                await asyncio.wait_for(
                    sat.states.wait_for(SessionState.SPEAKING, after=cut), 10.0
                )
            except TimeoutError:
                # The VAD found no words (the pause resumed) and the answer ran
                # out: not a barge-in. Ask again for a new answer.
                chain.missed += 1
                mark = sat.states.mark()
                sat.mic.say(ask)
                await sat.states.wait_for(SessionState.SPEAKING, after=mark)
                continue
            if trial < 0 or spoken.onset_at is None:
                continue
            chain.cut += 1
            if media:
                stop = sat.device.events.find(
                    lambda e: (
                        e.name == "MediaPlayerCommandRequest" and e.message.has_command
                    ),  # type: ignore[union-attr]
                    since,
                )
                silent = stop.at if stop is not None else None
                cut_play = [
                    p
                    for p in sat.device.playbacks
                    if p.source == "media_player" and p.stopped and p.ahead_bytes
                ]
                if silent is not None and cut_play and cut_play[-1].last_byte_at:
                    # The stream stopped growing at the pause: the player ran dry
                    # once what it had fetched was played (or at the STOP).
                    chain.stop_commands.append(silent - spoken.onset_at)
                    dry = cut_play[-1].last_byte_at + (
                        cut_play[-1].ahead_bytes[-1] / BYTES_PER_S
                    )
                    silent = min(silent, dry)
            else:
                speaker = sat.device.loudspeaker
                assert speaker is not None
                stops = speaker.silenced_at
                first_pause = pauses[0] if pauses else spoken.onset_at
                silenced = [at for at in stops if at >= first_pause]
                # Silenced by the firmware's action (the pause), else played out.
                silent = (
                    silenced[0] if silenced else heard_at_offset(speaker.played, offset)
                )
            if silent is None:
                continue
            chain.onset_to_silent.append(silent - spoken.onset_at)
            if pauses:
                chain.onset_to_pause.append(pauses[0] - spoken.onset_at)
                chain.pause_to_silent.append(silent - pauses[0])
        if sat.device.loudspeaker is not None:
            chain.dropped = sat.device.loudspeaker.dropped_bytes
    return chain


class LiveMic(RoomMic):
    """The room goes on in real time: speech said while nothing captures is lost.

    ``say_now`` starts a clip at this moment; at each capture, the speech that
    played since the last capture ended (the device's mic was stopped) is
    dropped and counted (``lost``): a stop → start firmware's gap.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Nothing said yet."""
        super().__init__(loop, None)
        self._until: float | None = None
        self.lost = 0

    def say_now(self, pcm: bytes) -> None:
        """Say ``pcm`` from now on (no zero sample: each is counted when sent)."""
        samples = np.frombuffer(pcm, dtype="<i2").copy()
        samples[samples == 0] = 1
        self.clear()
        self.queue(samples.tobytes())
        self._until = self.loop.time()
        self.lost = 0

    def capture(self, index: int) -> Frame:
        """Drop what was said while nothing captured, then capture frame ``index``."""
        now = self.loop.time()
        # Index 0: a new capture began (a new run); what was said since the last
        # one ended was heard by nobody. (Within a run frames follow each other.)
        if index == 0 and self.pending and self._until is not None:
            gap = 2 * int((now - FRAME_SECONDS - self._until) * 16000)
            if gap > 0:
                drop = min(gap, self.pending)
                del self._pending[:drop]
                self.lost += drop
        self._until = now
        return super().capture(index)


@dataclass
class Lost:
    """Words said right after a wake-word barge-in that never reached the link."""

    said_s: list[float] = field(default_factory=list)
    lost_s: list[float] = field(default_factory=list)


async def words_lost(trials: int, *, project: bool) -> Lost:
    """Wake word over the answer, then a request at once; the mic audio lost.

    ``project``: the project firmware in duplex (the event, the run goes on);
    else the same firmware's stop → start path (``end_run`` then a new start,
    as on_wake_word does outside duplex and a stock firmware does).
    """
    rng = random.Random(3)
    loop = asyncio.get_running_loop()
    speech = InstantSpeech(await asyncio.to_thread(answer_clips))
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    request = await asyncio.to_thread(
        speak, "turn on the kitchen lights please", lead_ms=0, tail_ms=300
    )
    options = DuplexOptions(barge_in=BargeIn.WAKE_WORD, end_silence_ms=0)
    result = Lost()
    mic = LiveMic(loop)
    async with contextlib.AsyncExitStack() as stack:
        binding, _ = await stack.enter_async_context(
            kernel_and_peer(speech, options, echo=False, answer=ANSWER)
        )
        sat = await stack.enter_async_context(
            profile_satellite("s3-duplex", binding, None, project=project, mic=mic)
        )
        voice = sat.device.voice
        delivered = [0]
        send_frame = voice._send_frame  # noqa: SLF001 - count what reaches the link

        def counted(run: Any, frame: Frame) -> None:
            delivered[0] += int(np.count_nonzero(np.frombuffer(frame.pcm, "<i2")))
            send_frame(run, frame)

        voice._send_frame = counted  # type: ignore[method-assign]  # noqa: SLF001
        await open_conversation(sat, ask)
        for _trial in range(trials):
            await asyncio.sleep(rng.uniform(0.4, 0.9))  # into the answer
            speech.reply = "turn on the kitchen lights please"
            mark = sat.states.mark()
            delivered[0] = 0
            mic.say_now(request)
            said = mic.pending // 2
            if sat.firmware is not None:
                assert sat.firmware.wake_word() is None  # reported: the run goes on
            else:
                sat.device.press_button()  # end_run, then voice_assistant.start
            said_at = loop.time()
            await asyncio.wait_for(
                sat.states.wait_for(SessionState.SPEAKING, after=mark), SAFETY
            )
            # The clip's end (its trailing silence) may come after the answer
            # starts: count once all of it had its time to be captured and sent.
            await asyncio.sleep(max(0.0, said_at + said / 16000 + 0.1 - loop.time()))
            result.said_s.append(said / 16000)
            result.lost_s.append(max(0, said - delivered[0]) / 16000)
    return result


@dataclass
class Turns:
    """A full turn and a barge-in turn on one profile."""

    full_ok: bool = False
    barge_ok: bool = False
    sent: int = 0
    heard: int = 0
    dropped: int = 0
    bus_busy: int = 0
    relisten_s: float | None = None
    button: dict[str, float] = field(default_factory=dict)


async def turns(profile: str) -> Turns:
    """Run a full turn (short answer), then a barge-in turn (the button on atom-echo)."""
    speech = InstantSpeech(await asyncio.to_thread(answer_clips))
    ask = await asyncio.to_thread(speak, ASK, lead_ms=0, tail_ms=300)
    stop = await asyncio.to_thread(speak, "stop", lead_ms=0, tail_ms=300)
    options = DuplexOptions(barge_in=BargeIn.VAD, end_silence_ms=4000)
    media = profile in ("voice-pe-stock", "linux-voice-assistant")
    result = Turns()
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        streams = await stack.enter_async_context(stream_server()) if media else None
        binding, kernel = await stack.enter_async_context(
            kernel_and_peer(speech, options, echo=False, answer=SHORT_ANSWER)
        )
        sat = await stack.enter_async_context(
            profile_satellite(profile, binding, streams)
        )
        device, speaker = sat.device, sat.device.loudspeaker
        speaking = await open_conversation(sat, ask)
        conversation = sat.link.conversation
        assert conversation is not None
        session = conversation.session
        await sat.states.wait_for(SessionState.LISTENING, after=speaking)
        if speaker is not None:
            if sat.link.half_duplex:  # the device listens again by itself
                stopped = await device.wait_for(lambda e: e.kind is Kind.MIC_STOP)
                started = await device.wait_for(
                    lambda e: e.kind is Kind.MIC_START, stopped.index + 1
                )
                result.relisten_s = started.at - speaker.silent_from()
            # The tail pushes the rest out; wait until that has been heard.
            await asyncio.sleep(0.3)
            await asyncio.sleep(max(0.0, speaker.silent_from() - loop.time()))
            result.sent = session.player.sent_bytes
            result.heard = heard_bytes(speaker.played)
            result.dropped = speaker.dropped_bytes
            result.bus_busy = speaker.bus_busy
            result.full_ok = result.heard >= result.sent and result.dropped == 0
        else:
            await asyncio.wait_for(
                device.wait_for(lambda e: e.kind is Kind.PLAYBACK), SAFETY
            )
            playback = next(p for p in device.playbacks if p.source == "media_player")
            result.sent = session.player.sent_bytes
            result.heard = playback.played_bytes
            result.full_ok = (
                playback.error is None and not playback.stopped
            ) and result.heard >= result.sent
        # The barge-in turn: a long answer, cut.
        speech.reply = "what about the bedroom"
        sat.mic.say(ask)
        mark = sat.states.mark()
        speaking = await sat.states.wait_for(SessionState.SPEAKING, after=mark)
        await asyncio.sleep(0.8)  # into the answer (a scenario)
        cut_mark = sat.states.mark()
        if sat.link.half_duplex:
            pressed = loop.time()
            device.press_button()
            ended = await sat.states.wait_for(SessionState.ENDED, after=cut_mark)
            since = device.mark()
            started = await device.wait_for(lambda e: e.kind is Kind.MIC_START, since)
            assert speaker is not None
            result.button = {
                "silent": max(0.0, speaker.silent_from() - pressed),
                "cut": sat.states.seen[ended][1] - pressed,
                "listening": started.at - pressed,
            }
        else:
            sat.mic.say(stop)
            await sat.states.wait_for(SessionState.LISTENING, after=cut_mark)
        history = kernel.transcript(conversation.child_id) or []
        result.barge_ok = any(m.role == "assistant" and m.interrupted for m in history)
    return result


def show(row: Row) -> None:
    """Print one row of the table at once."""
    print(f"{row.name} | {row.measured} | {row.target}", flush=True)


async def main(args: argparse.Namespace) -> None:
    """Run the selected rows."""
    rows = {"24", "25", "26", "27", "28"}
    if args.only:
        rows &= {r.strip() for r in args.only.split(",")}
    results: dict[str, Turns] = {}
    if rows & {"25", "27"}:
        for profile in (
            "s3-duplex",
            "atom-echo",
            "voice-pe-stock",
            "linux-voice-assistant",
        ):
            if "27" in rows or profile == "atom-echo":
                results[profile] = await turns(profile)
    if "24" in rows:
        chain = await barge_chain("s3-duplex", args.trials, seed=1, project=True)
        show(
            Row(
                "24 s3-duplex, project firmware (vad, no echo): speech onset in the"
                " mic → the cut"
                " answer's last sample leaves the loudspeaker (heard, device queue"
                f" included), {chain.cut} barge-ins ({chain.missed} utterances the"
                " VAD did not take as words)",
                f"{ms(chain.onset_to_silent)}; onset → pause"
                f" {ms(chain.onset_to_pause)}; pause → silent (what the device still"
                f" played) {ms(chain.pause_to_silent)}; device dropped"
                f" {chain.dropped} B",
                "p99 ≤ 80 ms",
            )
        )
    if "25" in rows and "atom-echo" in results:
        t = results["atom-echo"]
        button = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in t.button.items())
        relisten = f"{t.relisten_s * 1000:.0f} ms" if t.relisten_s is not None else "—"
        show(
            Row(
                "25 atom-echo (shared bus, half duplex): full turn; button during an"
                " answer",
                f"heard {t.heard} B of {t.sent} B sent, dropped {t.dropped} B,"
                f" bus busy {t.bus_busy}×; answer's last sample → mic streaming again"
                f" {relisten}; button → {button}",
                "heard = sent, dropped 0",
            )
        )
    if "26" in rows:
        for profile in ("voice-pe-stock", "linux-voice-assistant"):
            chain = await barge_chain(profile, args.media_trials, seed=2)
            show(
                Row(
                    f"26 {profile} (announcement of the live stream, vad): speech"
                    " onset → the emulated player runs dry (the stream stops growing"
                    f" at the pause), {chain.cut} barge-ins",
                    f"{ms(chain.onset_to_silent)}; onset → pause"
                    f" {ms(chain.onset_to_pause)}; onset → the STOP command (words"
                    f" confirmed) {ms(chain.stop_commands)}; + the real player's"
                    " decoder and speaker buffers (not modelled)",
                    "—",
                )
            )
    if "28" in rows:
        project = await words_lost(args.lost_trials, project=True)
        restart = await words_lost(args.lost_trials, project=False)
        show(
            Row(
                "28 s3-duplex: words lost at a wake-word barge-in (a request said"
                " right after the wake word; its mic audio that never reached the"
                f" link), {len(project.lost_s)} barge-ins each",
                f"project firmware (event, the run goes on): {ms(project.lost_s)}"
                f" lost of {ms(project.said_s)} said; stop → start (end_run then"
                f" a new start): {ms(restart.lost_s)} lost",
                "0 on the project firmware",
            )
        )
    if "27" in rows:
        parts = []
        for profile, t in results.items():
            parts.append(
                f"{profile}: full turn {'pass' if t.full_ok else 'FAIL'}, barge-in"
                f" {'pass' if t.barge_ok else 'FAIL'}, heard {t.heard} B / sent"
                f" {t.sent} B, dropped {t.dropped} B"
            )
        show(
            Row(
                "27 per profile: a full turn and a barge-in turn; answer audio heard"
                " = sent",
                "; ".join(parts),
                "all pass, dropped 0",
            )
        )


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=55, help="row 24 barge-ins")
    parser.add_argument("--media-trials", type=int, default=10, help="row 26")
    parser.add_argument("--lost-trials", type=int, default=10, help="row 28")
    parser.add_argument("--quick", action="store_true", help="short runs")
    parser.add_argument("--only", help="comma-separated row numbers (24-28)")
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.trials, parsed.media_trials, parsed.lost_trials = 8, 3, 3
    return parsed


if __name__ == "__main__":
    asyncio.run(main(_parse()))
