"""A room with a sound of its own (a TV): the onset gate judges over it.

The gate learns how loud the room gets while answers play (``RoomLevel``, kept by
the satellite across conversations); a TV across the room then opens no onset and
its talk is no utterance, while the user near the satellite, louder than the TV,
still opens the gate.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from custom_components.rtvoice.duplex.audio import FrameChunker
from custom_components.rtvoice.duplex.echo import EchoCanceller
from custom_components.rtvoice.duplex.gate import GateEvent, OnsetGate, RoomLevel
from tests.duplex.echo_sim import SENTENCES, run_answer
from tests.duplex.room import RealRoom, background_signal, grid


def _pcm(x: np.ndarray) -> bytes:
    return np.clip(np.round(x), -32768, 32767).astype("<i2").tobytes()


def _at_dbfs(x: np.ndarray, dbfs: float) -> np.ndarray:
    """``x`` scaled to ``dbfs`` RMS."""
    return x * (32768 * 10 ** (dbfs / 20) / np.sqrt(np.mean(x**2)))


def _onsets(gate: OnsetGate, pcm: bytes, *, learn_room: bool) -> list[int]:
    return [
        gate.frames
        for frame in FrameChunker().feed(pcm)
        if gate.process(frame, learn_room=learn_room) is GateEvent.ONSET
    ]


def test_the_room_level_is_how_loud_the_room_gets() -> None:
    """Levels that come and go: it settles near their 97th percentile."""
    rng = np.random.default_rng(1)
    levels = np.where(rng.random(6000) < 0.6, rng.normal(-35, 5, 6000), -70.0)
    room = RoomLevel()
    for level in levels:
        room.learn(float(level), -70.0)
    assert room.level == pytest.approx(np.percentile(levels, 97), abs=2.5)


@pytest.fixture(scope="module")
def tv() -> np.ndarray:
    """Twelve seconds of a TV (espeak news over a jingle) at -35 dBFS."""
    return _at_dbfs(background_signal("tv", 12.0, seed=3), -35.0)


def test_a_tv_opens_no_onset_once_learnt_and_the_user_over_it_does(
    tv: np.ndarray, clip
) -> None:
    """Learnt for 4 s of answer, 8 s more of TV open nothing; a user 10 dB over it does.

    A gate that does not judge over the room opens on the TV's words.
    """
    split = 4 * 16000
    user = np.frombuffer(clip("no wait, turn it off", lead_ms=0), dtype="<i2")
    user = _at_dbfs(user.astype(np.float64), -25.0)
    talk = tv[split : split + len(user)] + user

    gate = OnsetGate()
    _onsets(gate, _pcm(tv[:split]), learn_room=True)  # the answer plays
    assert _onsets(gate, _pcm(tv[split:]), learn_room=True) == []
    assert _onsets(gate, _pcm(talk), learn_room=False)  # the user, over the TV

    deaf_to_the_room = OnsetGate(room_margin_db=float("-inf"))
    _onsets(deaf_to_the_room, _pcm(tv[:split]), learn_room=True)
    assert _onsets(deaf_to_the_room, _pcm(tv[split:]), learn_room=True)


def test_the_room_level_lives_on_across_gates(tv: np.ndarray) -> None:
    """A satellite's next conversation starts from what the last one learnt."""
    room = RoomLevel()
    _onsets(OnsetGate(room=room), _pcm(tv[: 4 * 16000]), learn_room=True)
    learnt = room.level
    assert learnt is not None and learnt > -40.0
    # A new conversation, not (yet) learning: the TV still opens nothing.
    assert _onsets(OnsetGate(room=room), _pcm(tv[4 * 16000 :]), learn_room=False) == []


async def test_answers_with_the_tv_on_are_not_interrupted(clip) -> None:
    """Two answers with a TV 5 dB under a user's level and no user, one room.

    From the second answer on (the room's level learnt on the first and kept by
    the satellite), the TV neither pauses the answer nor is pushed as words, not
    even the TV's talk before the answer starts.
    """
    clips = {s: clip(s, lead_ms=0, tail_ms=150) for s in SENTENCES}
    spec = replace(grid((0.0,), rooms=2)[0], background="tv", background_db=-5.0)
    room = RoomLevel()
    learned = None
    runs = []
    for k in range(2):
        echo = EchoCanceller(learned=learned)
        learned = echo.fdaf
        background = background_signal("tv", 30.0, seed=k)
        runs.append(
            await run_answer(
                clips,
                aec=True,
                echo=echo,
                delay_ms=0,
                seed=k,
                room=RealRoom(spec, background=background),
                room_level=room,
            )
        )
    assert (runs[1].pauses, runs[1].pushes) == (0, 0)
