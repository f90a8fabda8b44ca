"""The speaker silenced at a pause, and the answer resumed from what was heard.

On the project firmware (``rtvoice_silence_speaker``: mute, then stop;
``rtvoice_unmute_speaker``) a pause silences the device's speaker at once and the
paused player goes back to what the user heard; before audio flows again the
player is held until the muted flush has run and the unmute was sent. Two parts:

- ``ApiAudioOutput`` and a real ``PacedPlayer`` (virtual clock) against a stand-in
  link whose action calls can be held open: the await points of a silence and a
  resume, with a cut or a second pause arriving in between, and a firmware without
  the actions;
- end to end on the ``s3-duplex`` profile with the project firmware (real peers,
  as ``test_esphome_profiles``): what the emulated loudspeaker emitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from custom_components.rtvoice.duplex import SessionState
from custom_components.rtvoice.duplex.audio import BYTES_PER_MS
from custom_components.rtvoice.duplex.clock import VirtualClock
from custom_components.rtvoice.duplex.player import PacedPlayer
from custom_components.rtvoice.esphome_link import (
    ACTION_SILENCE,
    ACTION_UNMUTE,
    OUTPUT_LAG_MS,
    ApiAudioOutput,
)
from tests.duplex.conftest import noise
from tests.duplex.test_esphome_link import ASK, LONG, SAFETY, STOP, rig
from tests.peers.esphome import EventType, Kind
from tests.peers.esphome.actions import ProjectFirmware
from tests.peers.esphome.i2s import STOP_S, SpeakerPath
from tests.peers.openai_server import Text

FRAME = 10 * BYTES_PER_MS

pytestmark = pytest.mark.usefixtures("socket_enabled", "clip")


def answer_audio(ms: int) -> bytes:
    """Return a distinct, never silent pattern: every frame can be found in it."""
    samples = (np.arange(ms * BYTES_PER_MS // 2) % 30000) + 1000
    return samples.astype("<i2").tobytes()


@dataclass
class FakeLink:
    """What ``ApiAudioOutput`` uses of ``EsphomeLink``; action calls can be held."""

    silences_speaker: bool = True
    stops_speaker: bool = True
    speaker_muted: bool = False
    client: Any = True
    wire: list[tuple[str, Any]] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    settle_gate: asyncio.Event | None = None  # holds frames before they are written
    settling: asyncio.Event = field(default_factory=asyncio.Event)

    async def _settle(self) -> None:
        self.settling.set()
        if self.settle_gate is not None:
            await self.settle_gate.wait()
        await asyncio.sleep(0)

    def _write_audio(self, frame: bytes) -> None:
        self.wire.append(("audio", frame))
        self.sent.set()

    async def call_action(self, name: str, data: dict[str, Any] | None = None) -> bool:
        """Call ``name`` (once its gate, if any, opens)."""
        if (gate := self.gates.get(name)) is not None:
            await gate.wait()
        self.wire.append(("action", name))
        self.sent.set()
        return True

    def stop_speaker(self) -> bool:
        """Call the older firmware's action."""
        self.wire.append(("action", "rtvoice_stop_speaker"))
        return True

    def actions(self) -> list[str]:
        """Return the actions called, in order."""
        return [what for kind, what in self.wire if kind == "action"]

    def answer_frames(self, since: int = 0) -> list[bytes]:
        """Audio that is not silence, sent at wire index ``since`` or later."""
        return [
            frame for kind, frame in self.wire[since:] if kind == "audio" and any(frame)
        ]

    def first_answer_frame(self, since: int) -> int:
        """Wire index of the first audio that is not silence after ``since``."""
        return next(
            i
            for i, (kind, frame) in enumerate(self.wire)
            if i > since and kind == "audio" and any(frame)
        )

    async def wait_until(self, condition: Any) -> None:
        """Wait until ``condition()`` holds after something went on the wire."""
        async with asyncio.timeout(SAFETY):
            while not condition():
                self.sent.clear()
                await self.sent.wait()


@contextlib.asynccontextmanager
async def output_and_player(
    link: FakeLink,
) -> AsyncIterator[tuple[ApiAudioOutput, PacedPlayer]]:
    """Yield an output on ``link`` and a player sending through it (virtual clock)."""
    output = ApiAudioOutput(link)  # type: ignore[arg-type]
    player = PacedPlayer(output.send, clock=VirtualClock(), lead_ms=100)
    output.bind(player)
    try:
        yield output, player
    finally:
        await player.aclose()
        await output.aclose()


async def play_until(link: FakeLink, player: PacedPlayer, sent: int) -> None:
    """Wait until the player has sent ``sent`` bytes, then pause it."""
    await link.wait_until(lambda: player.sent_bytes >= sent)
    player.pause()


async def test_a_pause_silences_and_goes_back_to_what_was_heard() -> None:
    """Silence is the first thing after the pause; the player rewinds by the lag."""
    link = FakeLink()
    audio = answer_audio(2000)
    async with output_and_player(link) as (output, player):
        player.enqueue(audio)
        await play_until(link, player, 50 * FRAME)
        mark, sent, heard = len(link.wire), player.sent_bytes, player.played_bytes()
        output.pause()
        await link.wait_until(lambda: ACTION_SILENCE in link.actions())
        assert player.sent_bytes == max(heard - OUTPUT_LAG_MS * BYTES_PER_MS, 0)
        assert sent - player.sent_bytes <= 1000 * BYTES_PER_MS  # within what is kept
        assert link.wire[mark] == ("action", ACTION_SILENCE)  # before any audio
        assert link.speaker_muted
        assert link.answer_frames(mark) == []  # the flush is silence
        # Resume: the unmute goes first, then the answer from the rewound position.
        rewound = player.sent_bytes
        player.resume()
        output.resume()
        await link.wait_until(lambda: link.answer_frames(mark))
        unmute = link.wire.index(("action", ACTION_UNMUTE))
        first = link.first_answer_frame(mark)
        assert unmute < first
        assert link.wire[first][1] == audio[rewound : rewound + FRAME]
        assert not link.speaker_muted


async def test_a_frame_on_its_way_at_the_pause_is_not_written() -> None:
    """A frame that waited for the loop when the pause came never reaches the device.

    The player had counted it; the silence drops what the device holds and the
    player goes back to what was heard, so nothing of the answer goes out between
    the pause and its silence, and nothing is lost.
    """
    link = FakeLink()
    audio = answer_audio(2000)
    async with output_and_player(link) as (output, player):
        player.enqueue(audio)
        await play_until(link, player, 30 * FRAME)
        player.resume()
        link.settle_gate = asyncio.Event()
        link.settling.clear()
        await link.settling.wait()  # a frame is on its way
        mark = len(link.wire)
        player.pause()
        output.pause()
        link.settle_gate.set()
        await link.wait_until(lambda: ACTION_SILENCE in link.actions())
        assert link.answer_frames(mark) == []
        assert link.wire[mark] == ("action", ACTION_SILENCE)
        rewound = player.sent_bytes
        player.resume()
        output.resume()
        await link.wait_until(lambda: link.answer_frames(mark))
        assert link.answer_frames(mark)[0] == audio[rewound : rewound + FRAME]


async def test_the_rewind_counts_what_played_until_the_silence_left() -> None:
    """A silence that leaves late: the rewind counts what played until it left.

    The device played on meanwhile; the position is taken when the action left,
    not at the pause, so the resume skips nothing of what was heard meanwhile.
    """
    gate = asyncio.Event()
    link = FakeLink(gates={ACTION_SILENCE: gate})
    async with output_and_player(link) as (output, player):
        player.enqueue(answer_audio(2000))
        await play_until(link, player, 50 * FRAME)
        clock = player.clock
        assert isinstance(clock, VirtualClock)
        at_pause = player.played_bytes()
        output.pause()
        clock.advance(0.060)  # the loop was busy: the action leaves 60 ms late
        at_send = player.played_bytes()
        assert at_send > at_pause  # the device played on
        gate.set()
        await link.wait_until(lambda: ACTION_SILENCE in link.actions())
        assert player.sent_bytes == at_send - OUTPUT_LAG_MS * BYTES_PER_MS


async def test_a_resume_before_the_silence_left_still_goes_back() -> None:
    """Resumed before the silence left: held, then back to what was heard.

    The unmute and the answer follow the silence in that order.
    """
    gate = asyncio.Event()
    link = FakeLink(gates={ACTION_SILENCE: gate})
    audio = answer_audio(2000)
    async with output_and_player(link) as (output, player):
        player.enqueue(audio)
        await play_until(link, player, 50 * FRAME)
        mark, heard = len(link.wire), player.played_bytes()
        output.pause()
        player.resume()
        output.resume()
        assert player.held
        gate.set()
        await link.wait_until(lambda: link.answer_frames(mark))
        rewound = max(heard - OUTPUT_LAG_MS * BYTES_PER_MS, 0)
        unmute = link.wire.index(("action", ACTION_UNMUTE))
        first = link.first_answer_frame(mark)
        assert link.actions()[:2] == [ACTION_SILENCE, ACTION_UNMUTE]
        assert unmute < first
        assert link.wire[first][1] == audio[rewound : rewound + FRAME]


async def test_a_cut_while_the_unmute_is_on_its_way_sends_nothing_more() -> None:
    """Cut during the resume's await: no answer frame follows, the player is free."""
    link = FakeLink(gates={ACTION_UNMUTE: asyncio.Event()})
    async with output_and_player(link) as (output, player):
        player.enqueue(answer_audio(2000))
        await play_until(link, player, 30 * FRAME)
        mark = len(link.wire)
        output.pause()
        player.resume()
        output.resume()  # held: waits for the flush, then the (held open) unmute
        assert player.held
        await link.wait_until(lambda: any(k == "audio" for k, _ in link.wire[mark:]))
        player.stop()  # the session's cut, then its state change
        output.stop()
        assert not player.held
        link.gates[ACTION_UNMUTE].set()
        player.enqueue(b"")  # nothing queued: the player stays idle
        await asyncio.wait_for(player.played(), SAFETY)
        assert link.answer_frames(mark) == []
        assert ACTION_UNMUTE not in link.actions()  # cancelled before it was sent
        assert link.actions().count(ACTION_SILENCE) == 1  # silent already: no second


async def test_a_second_pause_during_the_resume_rewinds_no_further() -> None:
    """Pause again while the unmute is on its way: nothing is lost or repeated."""
    link = FakeLink(gates={ACTION_UNMUTE: asyncio.Event()})
    audio = answer_audio(2000)
    async with output_and_player(link) as (output, player):
        player.enqueue(audio)
        await play_until(link, player, 30 * FRAME)
        output.pause()
        await link.wait_until(lambda: ACTION_SILENCE in link.actions())
        rewound = player.sent_bytes
        player.resume()
        output.resume()
        flushed = len(link.wire)
        await link.wait_until(lambda: len(link.wire) > flushed)  # unmute waits
        player.pause()  # a second onset
        output.pause()
        assert player.sent_bytes == rewound  # nothing was heard since: no further
        assert not player.held
        assert link.actions() == [ACTION_SILENCE]
        del link.gates[ACTION_UNMUTE]
        mark = len(link.wire)
        player.resume()
        output.resume()
        await link.wait_until(lambda: link.answer_frames(mark))
        assert link.actions() == [ACTION_SILENCE, ACTION_UNMUTE]
        assert link.answer_frames(mark)[0] == audio[rewound : rewound + FRAME]


async def test_a_cut_while_the_silence_is_on_its_way_then_the_next_answer() -> None:
    """The next answer waits for the silence and its flush, then the unmute."""
    link = FakeLink(gates={ACTION_SILENCE: asyncio.Event()})
    async with output_and_player(link) as (output, player):
        player.enqueue(answer_audio(1000))
        await play_until(link, player, 20 * FRAME)
        mark = len(link.wire)
        output.pause()  # the silence action is held open
        player.stop()  # cut at once
        output.stop()
        next_answer = answer_audio(300)[::-1]
        player.enqueue(next_answer)
        output.begin(player)
        assert player.held and link.answer_frames(mark) == []
        link.gates[ACTION_SILENCE].set()
        await link.wait_until(lambda: link.answer_frames(mark))
        assert link.actions() == [ACTION_SILENCE, ACTION_UNMUTE]
        frames = link.answer_frames(mark)
        assert frames[0] == next_answer[:FRAME]  # nothing of the cut answer
        unmute = link.wire.index(("action", ACTION_UNMUTE))
        silence = link.wire.index(("action", ACTION_SILENCE))
        flushed = [k for k, f in link.wire[silence:unmute] if k == "audio"]
        assert len(flushed) >= 100 // 10  # the muted flush ran in full first


async def test_firmware_without_the_actions_keeps_the_old_path() -> None:
    """No silence action: the pause pushes silence, no rewind; a cut stops."""
    link = FakeLink(silences_speaker=False)
    async with output_and_player(link) as (output, player):
        player.enqueue(answer_audio(1000))
        await play_until(link, player, 20 * FRAME)
        sent = player.sent_bytes
        output.pause()
        assert player.sent_bytes == sent and not player.held
        player.resume()
        output.resume()
        assert not player.held
        await link.wait_until(lambda: player.sent_bytes > sent)
        player.pause()
        output.pause()
        player.stop()
        output.stop()
        assert link.actions() == ["rtvoice_stop_speaker"]


# -- end to end: s3-duplex with the project firmware ----------------------------------


@dataclass
class Marks:
    """Device record index and loop time at each session state."""

    at: list[tuple[SessionState, int, float]] = field(default_factory=list)


def follow_states(r: Any) -> Marks:
    """Note where the device's record was at each state (before the conversation)."""
    marks = Marks()
    states = r.states
    loop = asyncio.get_running_loop()

    def on_state(state: SessionState) -> None:
        marks.at.append((state, r.device.mark(), loop.time()))
        states(state)

    r.link._on_state = on_state  # noqa: SLF001 - read by the next conversation
    return marks


def tap_wire(r: Any) -> list[Any]:
    """Log, in order, the link's writes ("answer", "silence", actions) and states."""
    wire: list[Any] = []
    link = r.link
    write, call, on_state = link._write_audio, link.call_action, link._on_state  # noqa: SLF001

    def write_audio(frame: bytes) -> None:
        wire.append("answer" if any(frame) else "silence")
        write(frame)

    async def call_action(name: str, data: dict[str, Any] | None = None) -> bool:
        wire.append(name)
        return bool(await call(name, data))

    def state_changed(state: SessionState) -> None:
        wire.append(state)
        on_state(state)

    link._write_audio = write_audio  # noqa: SLF001
    link.call_action = call_action
    link._on_state = state_changed  # noqa: SLF001 - read by the next conversation
    return wire


async def wait_heard(r: Any, speaker: SpeakerPath, ms: int = 0) -> None:
    """Wait until the loudspeaker has emitted something (``ms`` of audio at least)."""
    for _ in range(2000):
        if speaker.played and len(speaker.heard_pcm()) >= ms * BYTES_PER_MS:
            return
        mark = r.device.mark()
        await asyncio.wait_for(
            r.device.wait_for(lambda e: e.kind is Kind.SPEAKER_AUDIO, mark), SAFETY
        )
    raise AssertionError("nothing was heard")


def action_at(r: Any, name: str, since: int) -> Any:
    """Wait for the device's record entry of the action ``name`` at ``since`` on."""
    return r.device.wait_for(
        lambda e: e.kind is Kind.NOTE and e.detail["what"] == f"action {name}", since
    )


async def test_s3_duplex_pause_silences_the_loudspeaker_at_once(clip) -> None:
    """Speech over the answer: silent within the stop's latency of the pause."""
    async with rig(profile="s3-duplex", firmware=ProjectFirmware) as r:
        marks = follow_states(r)
        wire = tap_wire(r)
        speaker = r.device.loudspeaker
        assert speaker is not None and r.link.silences_speaker
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        r.peer.enqueue(Text("Okay."))
        await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await wait_heard(r, speaker)
        r.device.say(clip(STOP), wake_word=None)
        paused = await r.states.wait_for(SessionState.PAUSED)
        _state, mark, _at = marks.at[paused]
        silence = await asyncio.wait_for(action_at(r, ACTION_SILENCE, mark), SAFETY)
        # Nothing of the answer was written between the pause and its silence (the
        # device may still read frames written before the pause after it).
        assert "answer" in wire[: wire.index(SessionState.PAUSED)]  # the tap works
        after_pause = wire[wire.index(SessionState.PAUSED) :]
        assert after_pause[: after_pause.index(ACTION_SILENCE)].count("answer") == 0
        stopped_at, why = speaker.stops[-1]
        assert why == "speaker.stop" and stopped_at >= silence.at  # by the action
        silent = speaker.silenced_at[-1]
        assert silent - stopped_at <= STOP_S
        cut = await r.states.wait_for(SessionState.LISTENING, paused)
        speaking = await r.states.wait_for(SessionState.SPEAKING, cut)
        unmute = await asyncio.wait_for(
            action_at(r, ACTION_UNMUTE, marks.at[speaking][1]), SAFETY
        )
        assert not any(speaker.heard_pcm(silent, unmute.at))  # silent until then
        assert speaker.dropped_bytes == 0


def located(spans: list[bytes], answer: bytes) -> list[tuple[int, int]]:
    """Where each heard span's answer audio lies in ``answer`` (its zeros trimmed)."""
    out = []
    for pcm in spans:
        samples = np.frombuffer(pcm, dtype="<i2")
        loud = np.flatnonzero(samples)
        if not len(loud):
            continue
        part = pcm[2 * loud[0] : 2 * (loud[-1] + 1)]
        start = answer.find(part)
        while start >= 0 and start % 2:  # a sample boundary
            start = answer.find(part, start + 1)
        assert start >= 0, "heard audio that is not the answer's"
        out.append((start, start + len(part)))
    return out


async def test_s3_duplex_false_onset_resumes_from_what_was_heard(clip) -> None:
    """A cough: silenced, resumed; heard = the answer, nothing skipped, little twice."""
    async with rig(profile="s3-duplex", firmware=ProjectFirmware) as r:
        speaker = r.device.loudspeaker
        assert speaker is not None
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        player = conversation.session.player
        answer = bytearray()
        enqueue = player.enqueue

        def tap(pcm: bytes) -> int:
            answer.extend(pcm)
            return enqueue(pcm)

        player.enqueue = tap  # type: ignore[method-assign]
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        await wait_heard(r, speaker, 600)  # well into the answer
        r.device.say(noise(200, -12.0), wake_word=None)
        paused = await r.states.wait_for(SessionState.PAUSED, speaking)
        await r.states.wait_for(SessionState.SPEAKING, paused)  # resumed
        await asyncio.wait_for(r.device.wait_for_event(EventType.RUN_END), SAFETY)
        await asyncio.wait_for(speaker.stopped.wait(), SAFETY)
        history = r.history(conversation)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            ("user", ASK, False),
            ("assistant", LONG, False),
        ]
        pauses = conversation.session.stats.pauses
        assert pauses >= 1
        assert len([c for c in r.device.actions.calls if c.name == ACTION_UNMUTE]) >= 1
        spans = located([bytes(s.pcm) for s in speaker.played], bytes(answer))
        loud = np.flatnonzero(np.frombuffer(bytes(answer), dtype="<i2"))
        first, last = 2 * loud[0], 2 * (loud[-1] + 1)
        covered = 0
        duplicated = 0
        for start, end in spans:  # in the order heard
            assert not any(answer[max(covered, first) : start]), "answer skipped"
            duplicated += max(0, min(end, covered) - start)
            covered = max(covered, end)
        assert covered >= last  # heard to its end
        assert duplicated <= pauses * OUTPUT_LAG_MS * BYTES_PER_MS
        assert speaker.dropped_bytes == 0
