"""Duplex on the project firmware: barge-in without a restart, a silenced speaker.

The emulated device runs ``firmware/packages`` as ``tests.peers.esphome.actions``
models it (its API actions, its ``on_wake_word``/``on_button`` scripts, its
``homeassistant.event``s): a wake word, "stop" or the button during a duplex run is
reported (``esphome.rtvoice_barge_in``) and the run, and the mic, go on; the link
cuts the answer and calls ``rtvoice_stop_speaker``. Stock firmware (no such
actions) says the same wake word as a stop and then a start: the link treats it
as a barge-in too. A start announced by the device (``esphome.rtvoice_start``) that
never reaches the link means another API client owns the voice assistant.
Real peers on 127.0.0.1, as in ``test_esphome_link``; waits are on events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
import contextlib
from dataclasses import dataclass, field
from typing import Any

from aioesphomeapi import APIClient
import pytest

from custom_components.rtvoice.duplex import BargeIn, DuplexOptions, SessionState
from custom_components.rtvoice.duplex_link import DuplexBinding, RoundEnds
from custom_components.rtvoice.esphome_link import (
    ACTION_DUPLEX,
    ACTION_SILENCE,
    ACTION_STOP_SPEAKER,
    EsphomeLink,
    LinkConfig,
)
from custom_components.rtvoice.kernel import ChannelRegistry, Kernel, Message
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from tests.duplex.test_esphome_link import (
    ASK,
    FIRMWARE,
    LONG,
    SAFETY,
    STOP,
    States,
    wyoming_stt,
    wyoming_tts,
)
from tests.peers.esphome import ATOM_ECHO_FEATURES, EmulatedDevice, EventType, Kind
from tests.peers.esphome.actions import EVENT_BARGE_IN, ProjectFirmware
from tests.peers.esphome.runs import Interrupt
from tests.peers.openai_server import DEFAULT_MODEL, OpenAIPeer, Text
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

pytestmark = pytest.mark.usefixtures("socket_enabled", "clip")

START_TIMEOUT = 0.3  # the link's wait for an announced start (3 s in use)


async def within(awaitable: Awaitable[Any]) -> Any:
    """Await ``awaitable`` with the safety net (a hang fails, never waits forever)."""
    return await asyncio.wait_for(awaitable, SAFETY)


@dataclass
class Refusals:
    """What ``on_refused`` reported, with an event-driven wait."""

    seen: list[bool] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, refused: bool) -> None:
        """Record a report."""
        self.seen.append(refused)
        self.changed.set()

    async def wait_for(self, count: int) -> list[bool]:
        """Wait until ``count`` reports came; return them."""
        async with asyncio.timeout(SAFETY):
            while len(self.seen) < count:
                self.changed.clear()
                await self.changed.wait()
        return self.seen


@dataclass
class Rig:
    """The device (with or without the project firmware), the link, the peers."""

    device: EmulatedDevice
    firmware: ProjectFirmware | None
    link: EsphomeLink
    kernel: Kernel
    peer: OpenAIPeer
    stt: WyomingSttServer
    states: States
    refused: Refusals

    async def wake_and_say(self, pcm: bytes) -> Any:
        """Wake the device (its own start), speak; the conversation that opened."""
        since = self.device.mark()
        run = self.device.say(pcm)
        assert run is not None
        await asyncio.wait_for(run.streaming.wait(), SAFETY)
        await self.device.wait_for_event(EventType.RUN_START, since)
        assert self.link.conversation is not None
        return self.link.conversation

    def history(self, child_id: str) -> list[tuple[str, str, bool]]:
        """(role, content, interrupted) of the child's transcript."""
        transcript: list[Message] | None = self.kernel.transcript(child_id)
        assert transcript is not None
        return [(m.role, m.content, m.interrupted) for m in transcript]

    def calls(self, name: str) -> list[Any]:
        """Return the device's executions of the API action ``name``."""
        return [call for call in self.device.actions.calls if call.name == name]


@contextlib.asynccontextmanager
async def rig(
    *,
    project: bool = True,
    barge_in: BargeIn = BargeIn.WAKE_WORD,
    connect: bool = True,
    device: EmulatedDevice | None = None,
    before_link: Callable[[EmulatedDevice], Awaitable[None]] | None = None,
) -> AsyncIterator[Rig]:
    """Start the peers, the device (project firmware unless told) and the link.

    ``before_link`` runs once the device serves, before the link connects.
    """
    device = device or EmulatedDevice(
        name="kitchen",
        encrypted=True,
        esphome_version=FIRMWARE,
        features=ATOM_ECHO_FEATURES,
    )
    firmware = ProjectFirmware(device) if project else None  # before it serves
    async with (
        device,
        OpenAIPeer() as peer,
        WyomingSttServer(phrases=[ASK, STOP]) as stt,
        WyomingTtsServer() as tts,
    ):
        round_ends = RoundEnds()
        kernel = Kernel(
            OpenAIChatProvider(
                base_url=peer.base_url, api_key="sk-test", model=DEFAULT_MODEL
            ),
            ChannelRegistry(),
            on_round_end=round_ends,
        )
        binding = DuplexBinding(
            kernel=kernel,
            stt=wyoming_stt(stt.host, stt.port),
            tts=wyoming_tts(tts.host, tts.port),
            options=DuplexOptions(barge_in=barge_in, end_silence_ms=1500),
            round_ends=round_ends,
        )
        if before_link is not None:
            await before_link(device)
        states = States()
        refused = Refusals()
        link = EsphomeLink(
            LinkConfig(
                host=device.host,
                port=device.port,
                noise_psk=device.noise_psk,
                login_timeout=0.5,
                backoff_min=0.05,
                backoff_max=0.2,
                start_timeout=START_TIMEOUT,
            ),
            binding,
            on_state=states,
            on_refused=refused,
        )
        link.start()
        try:
            await asyncio.wait_for(link.wait_connected(), SAFETY)
            if connect:
                await within(device.wait_for_voice_client())
            yield Rig(device, firmware, link, kernel, peer, stt, states, refused)
        finally:
            await link.aclose()
            await kernel.stop_all()
        assert device.voice.errors == []


async def barge_in_and_say(r: Rig, clip: Any, how: str) -> None:
    """Interrupt the playing answer by ``how``, then say STOP into the open mic."""
    assert r.firmware is not None
    words = clip(STOP)  # made first: making a clip blocks the loop
    if how == "wake_word":
        assert r.firmware.wake_word() is None  # reported, no new run
    else:
        assert r.firmware.button() is None
    r.device.say(words, wake_word=None)


@pytest.mark.parametrize("how", ["wake_word", "button"])
async def test_barge_in_on_the_project_firmware_keeps_the_run(clip, how: str) -> None:
    """Wake word or button over the answer: one run, the mic never stops, no word lost.

    The firmware reports it (``esphome.rtvoice_barge_in``) because the link turned
    ``rtvoice_duplex`` on at its first run; the link cuts the answer where it was
    heard and silences the speaker (``rtvoice_silence_speaker``) right after the event.
    """
    async with rig() as r:
        r.peer.enqueue(Text(LONG))
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        assert [call.data for call in r.calls(ACTION_DUPLEX)] == [{"enabled": True}]
        await r.states.wait_for(SessionState.SPEAKING)
        since = r.device.mark()
        await barge_in_and_say(r, clip, how)
        stopped = await within(
            r.device.wait_for(
                lambda e: e.kind is Kind.NOTE and e.detail["what"] == "speaker stopped",
                since,
            )
        )
        await within(r.peer.wait_for_request(2))
        await within(r.device.wait_for_event(EventType.RUN_END, since))
        sent = [
            e
            for e in list(r.device.events)[since:]
            if e.kind is Kind.SENT
            and getattr(e.message, "service", "") == EVENT_BARGE_IN
        ]
        assert len(sent) == 1 and sent[0].index < stopped.index
        assert len(r.calls(ACTION_SILENCE)) >= 1  # mute, then stop
        assert r.calls(ACTION_STOP_SPEAKER) == []  # the older firmware's action
        assert len(r.device.runs) == 1  # no stop, no new start
        assert r.device.runs[0].mic_stop_reason == "run_end"  # streamed throughout
        assert r.link.barge_in_events == 1
        history = r.history(conversation.child_id)
        assert history[0] == ("user", ASK, False)
        assert history[1][0] == "assistant" and history[1][2]  # cut where heard
        assert LONG.startswith(history[1][1]) and len(history[1][1]) < len(LONG)
        assert history[2:] == [("user", STOP, False), ("assistant", "Okay.", False)]


async def test_stock_firmware_stop_then_start_is_a_barge_in(clip) -> None:
    """Stock firmware says the wake word as a stop, then a start: the answer is cut.

    The same conversation goes on (the new run resumes the child, the model sees
    the heard part, marked interrupted); no action is called (the firmware has
    none). What the user said between the stop and the new run's listening is lost
    on real firmware (``START_MICROPHONE`` clears the buffers; docs/duplex.md).
    """
    async with rig(project=False) as r:
        r.peer.enqueue(Text(LONG))
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        since = r.device.mark()
        run = r.device.say(clip(STOP), interrupt=Interrupt.STOP_FIRST)
        assert run is not None and len(r.device.runs) == 2
        await within(r.peer.wait_for_request(2))
        await within(r.device.wait_for_event(EventType.RUN_END, since))
        assert r.link.conversation is conversation
        history = r.history(conversation.child_id)
        assert history[0] == ("user", ASK, False)
        assert history[1][0] == "assistant" and history[1][2]
        assert history[2:] == [("user", STOP, False), ("assistant", "Okay.", False)]
        assert r.device.actions.calls == []


async def test_stop_word_cuts_the_answer_and_listens(clip) -> None:
    """Say "stop" over the answer (project firmware): cut, silenced, still listening."""
    async with rig() as r:
        assert r.firmware is not None
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        since = r.device.mark()
        r.firmware.stop_word()
        listening = await r.states.wait_for(SessionState.LISTENING, len(r.states.seen))
        assert r.states.seen[listening] is SessionState.LISTENING
        await within(
            r.device.wait_for(
                lambda e: e.kind is Kind.NOTE and e.detail["what"] == "speaker stopped",
                since,
            )
        )
        await within(
            r.device.wait_for_event(EventType.RUN_END, since)
        )  # silence ends it
        assert len(r.device.runs) == 1
        history = r.history(conversation.child_id)
        assert len(history) == 2 and history[1][2]


@pytest.mark.parametrize("requested", [False, True], ids=["announced", "requested"])
async def test_a_start_for_another_client_is_noticed_and_recovers(
    clip, requested: bool
) -> None:
    """Another API client owns the voice assistant: the link reports it, then recovers.

    The firmware refuses the link's subscription with only a log line. Its next
    own start (a wake word) is announced to every client (``esphome.rtvoice_start``),
    or the link asks for one (``request_start``), but the start request goes to the
    owner: the link sees none and reports it (``on_refused(True)``). Once the other client is gone, the next announced start
    makes the link subscribe again; the start after that reaches it (``False``).
    """
    other: list[APIClient] = []
    starts: list[int] = []

    async def handle_start(*args: Any) -> int | None:
        starts.append(1)
        return 0

    async def handle_stop(*args: Any) -> None:
        return None

    async def other_client_first(device: EmulatedDevice) -> None:
        client = APIClient(
            device.host,
            device.port,
            None,
            client_info="other",
            noise_psk=device.noise_psk,
        )
        await client.connect(login=False)
        other.append(client)
        client.subscribe_voice_assistant(
            handle_start=handle_start, handle_stop=handle_stop
        )
        await within(device.wait_for_voice_client())

    async with rig(before_link=other_client_first, connect=False) as r:
        assert r.firmware is not None
        try:
            await within(
                r.device.wait_for_message("SubscribeHomeassistantServicesRequest")
            )
            mark = r.device.mark()
            if requested:
                assert r.link.request_start()  # the link asks (start_listening)
            else:
                r.firmware.wake_word()  # the device announces its own start
            await within(r.device.wait_for_message("VoiceAssistantResponse", mark))
            assert starts == [1]
            assert await r.refused.wait_for(1) == [True]
            assert r.link.voice_refused
            r.device.abort()
        finally:
            mark = r.device.mark()
            await other[0].disconnect()
        await within(r.device.wait_for_disconnect(mark))
        mark = r.device.mark()
        r.firmware.wake_word()  # nobody owns it: lost, but the link subscribes again
        await within(r.device.wait_for_voice_client(mark))
        r.peer.enqueue(Text("Okay."))
        await r.wake_and_say(clip(STOP))
        assert await r.refused.wait_for(2) == [True, False]
        assert not r.link.voice_refused
