"""Duplex end to end on each device profile (``tests/peers/esphome/profiles.py``).

The same real peers as ``test_esphome_link`` (aioesphomeapi inside ``EsphomeLink``,
the openai SDK against the loopback model, the Wyoming speech servers); the device
is one of the satellites people own, with the firmware's speaker path, so what the
assertions read is what its loudspeaker emitted (``device.loudspeaker``), not the
frames the link sent.
"""

from __future__ import annotations

import asyncio

import pytest

from custom_components.rtvoice.duplex import SessionState
from tests.duplex.test_esphome_link import ANSWER, ASK, LONG, SAFETY, STOP, rig
from tests.peers.esphome import EmulatedDevice, Entry, EventType, Kind, State
from tests.peers.openai_server import Text

pytestmark = pytest.mark.usefixtures("socket_enabled", "clip")


def heard_all(heard: bytes, sent: bytes) -> bool:
    """Every byte sent was heard, but for silence still waiting on the device."""
    return heard == sent[: len(heard)] and not any(sent[len(heard) :])


async def wait_kind(device: EmulatedDevice, kind: Kind, since: int = 0) -> Entry:
    """Wait for the first record entry of ``kind`` at ``since`` or later."""
    return await asyncio.wait_for(
        device.wait_for(lambda e: e.kind is kind, since), SAFETY
    )


async def test_atom_echo_releases_the_mic_plays_the_answer_and_listens_again(
    clip,
) -> None:
    """Shared bus: the answer is heard in full, then the device listens by itself."""
    async with rig(profile="atom-echo") as r:
        assert r.link.half_duplex
        speaker = r.device.loudspeaker
        assert speaker is not None
        r.peer.enqueue(Text("The kitchen lights are on."))
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        first_run = r.device.runs[-1]
        # continue_conversation: the firmware starts a new run once the answer played.
        stopped = await wait_kind(r.device, Kind.MIC_STOP)
        await wait_kind(r.device, Kind.MIC_START, stopped.index + 1)
        second_run = r.device.runs[-1]
        assert second_run is not first_run and second_run.continued
        assert first_run.mic_stop_reason == "stt_vad_end"
        sent = r.answer_audio()
        heard = speaker.heard_pcm()
        assert speaker.dropped_bytes == 0 and speaker.bus_busy == 0
        assert heard_all(heard, sent)
        assert len(heard) >= conversation.session.player.sent_bytes
        assert (await r.transcribe(heard)) == ANSWER
        # The same session goes on: words without a wake word are answered.
        r.device.say(clip(STOP), wake_word=None)
        await r.peer.wait_for_request(2)
        stopped = await wait_kind(r.device, Kind.MIC_STOP, stopped.index + 1)
        await wait_kind(r.device, Kind.MIC_START, stopped.index + 1)
        assert [(m.role, m.content) for m in r.history(conversation)] == [
            ("user", ASK),
            ("assistant", "The kitchen lights are on."),
            ("user", STOP),
            ("assistant", "Okay."),
        ]
        assert conversation.sessions == 1


async def test_atom_echo_button_cuts_the_answer_and_the_conversation_goes_on(
    clip,
) -> None:
    """The button during an answer: cut at what was heard; its new run resumes."""
    async with rig(profile="atom-echo") as r:
        speaker = r.device.loudspeaker
        assert speaker is not None
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        # Once the loudspeaker has emitted something, press the button.
        for _ in range(200):
            mark = r.device.mark()
            if speaker.played:
                break
            await r.device.wait_for(lambda e: e.kind is Kind.SPEAKER_AUDIO, mark)
        assert speaker.played
        mark = r.device.mark()
        r.device.press_button()
        await r.states.wait_for(SessionState.ENDED, speaking)
        await asyncio.wait_for(r.device.wait_for_event(EventType.RUN_END, mark), SAFETY)
        await wait_kind(r.device, Kind.MIC_START, mark)
        history = r.history(conversation)
        assert [(m.role, m.interrupted) for m in history] == [
            ("user", False),
            ("assistant", True),
        ]
        assert len(history[1].content) < len(LONG)
        assert r.link.conversation is conversation and not conversation.ended
        assert conversation.sessions == 2  # the button's start resumed it
        assert r.device.state == State.STREAMING_MICROPHONE


async def test_s3_duplex_full_turn_is_heard_in_full(clip) -> None:
    """Separate buses: the answer plays while the mic streams, every byte heard."""
    async with rig(profile="s3-duplex") as r:
        assert not r.link.half_duplex
        speaker = r.device.loudspeaker
        assert speaker is not None
        r.peer.enqueue(Text("The kitchen lights are on."))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        await r.states.wait_for(SessionState.LISTENING, speaking)
        await asyncio.wait_for(r.device.wait_for_event(EventType.RUN_END), SAFETY)
        await asyncio.wait_for(speaker.stopped.wait(), SAFETY)
        sent = r.answer_audio()
        heard = speaker.heard_pcm()
        assert speaker.dropped_bytes == 0
        # The tail of silence pushed the answer out of the 16 KiB buffer: every
        # byte the player sent was heard (and some of the silence after it).
        assert heard_all(heard, sent)
        assert len(heard) >= conversation.session.player.sent_bytes
        assert (await r.transcribe(heard)) == ANSWER
        assert r.device.runs[0].mic_stop_reason == "run_end"  # never before


async def test_s3_duplex_barge_in_silences_the_speaker(clip) -> None:
    """Speech over the answer: the loudspeaker goes silent, the words are answered."""
    async with rig(profile="s3-duplex") as r:
        speaker = r.device.loudspeaker
        assert speaker is not None
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        r.device.say(clip(STOP), wake_word=None)
        paused = await r.states.wait_for(SessionState.PAUSED)
        player = conversation.session.player
        sent_at_pause = player.sent_bytes
        cut = await r.states.wait_for(SessionState.LISTENING, paused)
        # Nothing more of the cut answer was sent after the pause (only silence
        # from the output), and the device played out what it held.
        assert player.sent_bytes == sent_at_pause
        await r.peer.wait_for_request(2)
        await r.states.wait_for(SessionState.SPEAKING, cut)
        history = r.history(conversation)
        assert [(m.role, m.interrupted) for m in history][:2] == [
            ("user", False),
            ("assistant", True),
        ]
        assert speaker.dropped_bytes == 0
