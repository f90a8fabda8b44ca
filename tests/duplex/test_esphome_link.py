"""Duplex mode end to end: the ESPHome link against real peers on 127.0.0.1.

The emulated device (firmware 2026.9, a speaker on a bus of its own, i.e. full
duplex: raw API audio plays; the boards people own, the shared-bus Atom Echo
among them, are the profiles of ``test_esphome_profiles.py``) is driven by
the real aioesphomeapi client inside ``EsphomeLink``; the kernel talks to the
OpenAI-compatible peer through the real ``openai`` SDK; STT and TTS are the Wyoming
speech servers (pocketsphinx, espeak-ng) bound through a ``wyoming`` client, as the
HA adapter will bind the pipeline's stt/tts entities. Nothing is mocked. Waits are
on events (session states, device records); timeouts are safety nets only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
import contextlib
from dataclasses import dataclass, field
from functools import partial
from importlib.metadata import version
import json
import logging
from typing import Any

from aioesphomeapi import InvalidEncryptionKeyAPIError
import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript
from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from custom_components.rtvoice.duplex import (
    BargeIn,
    DuplexOptions,
    EchoCanceller,
    SessionState,
    echo_unavailable_reason,
)
from custom_components.rtvoice.duplex_link import (
    DuplexBinding,
    DuplexConversation,
    RoundEnds,
)
from custom_components.rtvoice.esphome_link import (
    ApiAudioOutput,
    EsphomeLink,
    LinkConfig,
)
from custom_components.rtvoice.kernel import (
    ChannelRegistry,
    Kernel,
    Message,
    ToolCall,
    ToolSpec,
)
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from tests.accounts import accounted, duplex_account
from tests.duplex.conftest import epoll_loop, noise, selector_keys_epoll_lost
from tests.peers.esphome import ATOM_ECHO_FEATURES, EmulatedDevice, EventType, State
from tests.peers.esphome.record import Kind
from tests.peers.openai_server import (
    DEFAULT_MODEL,
    OpenAIPeer,
    Text,
    ToolCall as PeerToolCall,
)
from tests.peers.wyoming_speech import WyomingSttServer, WyomingTtsServer

SAFETY = 30.0  # seconds: a safety net against hangs, never a synchronisation
FIRMWARE = "2026.9.0"  # plays raw API audio directly; never answers login
# aioesphomeapi before 45 waits for the login answer that ESPHome >= 2026.1 never
# sends (the link falls back to login=False); 45+ never waits for it.
LOGIN_WAITS = int(version("aioesphomeapi").split(".", 1)[0]) < 45

ASK = "turn on the kitchen lights"
ANSWER = "the kitchen lights are on"
STOP = "stop"
LONG = (
    "the kitchen lights are on. the kitchen lights are on."
    " the kitchen lights are on. the kitchen lights are on."
)
MIC_ENDING = {
    EventType.STT_VAD_END,
    EventType.TTS_END,
    EventType.ERROR,
    EventType.INTENT_PROGRESS,
}

# pytest-homeassistant-custom-component blocks sockets; loopback peers need them.
pytestmark = pytest.mark.usefixtures("socket_enabled", "clip")


# --------------------------------------------------------------------------- speech


def wyoming_stt(host: str, port: int) -> Callable[[bytes], Any]:
    """Bind STT to a Wyoming ASR server (16 kHz mono s16le in, text out)."""

    async def transcribe(pcm: bytes) -> str:
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Transcribe(language="en").event())
            await client.write_event(
                AudioStart(rate=16000, width=2, channels=1).event()
            )
            for start in range(0, len(pcm), 3200):
                chunk = AudioChunk(
                    rate=16000, width=2, channels=1, audio=pcm[start : start + 3200]
                )
                await client.write_event(chunk.event())
            await client.write_event(AudioStop().event())
            while (event := await client.read_event()) is not None:
                if Transcript.is_type(event.type):
                    return Transcript.from_event(event).text
        raise ConnectionError("the STT server hung up")

    return transcribe


def wyoming_tts(host: str, port: int) -> Callable[[str], AsyncIterator[bytes]]:
    """Bind TTS to a Wyoming TTS server, converted to 16 kHz mono s16le."""

    async def synthesise(text: str) -> AsyncIterator[bytes]:
        converter = AudioChunkConverter(rate=16000, width=2, channels=1)
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Synthesize(text=text).event())
            while (event := await client.read_event()) is not None:
                if AudioChunk.is_type(event.type):
                    yield converter.convert(AudioChunk.from_event(event)).audio
                elif AudioStop.is_type(event.type):
                    return
        raise ConnectionError("the TTS server hung up")

    return synthesise


# --------------------------------------------------------------------------- doubles


class DeviceAction:
    """A tool runner with one device action that waits for the test (no HA here)."""

    def __init__(self) -> None:
        """Offer ``lights``; its calls block until ``release`` is set."""
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.finished = asyncio.Event()

    def specs(self) -> list[ToolSpec]:
        """One device action."""
        return [ToolSpec("lights", "Switch the lights", {"type": "object"})]

    async def call(self, call: ToolCall) -> str:
        """Run the action to its end once released."""
        self.started.set()
        await self.release.wait()
        self.finished.set()
        return json.dumps({"success": True})


@dataclass
class States:
    """Session states reported through the link, with an event-driven wait."""

    seen: list[SessionState] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, state: SessionState) -> None:
        """Record a state."""
        self.seen.append(state)
        self.changed.set()

    async def wait_for(self, state: SessionState, after: int = 0) -> int:
        """Wait until ``state`` is reported at index ``after`` or later; its index."""
        try:
            async with asyncio.timeout(SAFETY):
                while True:
                    for index in range(after, len(self.seen)):
                        if self.seen[index] is state:
                            return index
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError as err:
            raise AssertionError(f"no {state} after {after} in {self.seen}") from err


@dataclass
class Rig:
    """Everything a test needs, wired."""

    device: EmulatedDevice
    link: EsphomeLink
    kernel: Kernel
    peer: OpenAIPeer
    stt: WyomingSttServer
    states: States
    tools: DeviceAction
    conversations: list[DuplexConversation]
    transcribe: Callable[[bytes], Any]
    closed: asyncio.Event  # the link reported a conversation closed

    async def wake_and_say(self, pcm: bytes) -> DuplexConversation:
        """Wake the device, speak, and return the conversation that opened."""
        since = self.device.mark()
        run = self.device.say(pcm)
        assert run is not None
        await asyncio.wait_for(run.streaming.wait(), SAFETY)
        await self.device.wait_for_event(EventType.RUN_START, since)
        conversation = self.link.conversation
        assert conversation is not None
        return conversation

    def history(self, conversation: DuplexConversation) -> list[Message]:
        """Return the child's transcript (live or archived)."""
        transcript = self.kernel.transcript(conversation.child_id)
        assert transcript is not None
        return transcript

    def answer_audio(self) -> bytes:
        """Return the raw API audio the device received last."""
        playback = self.device.playbacks[-1]
        assert playback.source == "api"
        return playback.pcm


@contextlib.asynccontextmanager
async def rig(
    *,
    barge_in: BargeIn = BargeIn.VAD,
    end_silence_ms: int = 1500,
    phrases: tuple[str, ...] = (ASK, ANSWER, STOP),
    echo: Callable[[], EchoCanceller | None] | None = None,
    psk: str | None = None,
    connect: bool = True,
    idle_timeout_s: float = 300.0,
    firmware: Callable[[EmulatedDevice], Any] | None = None,
    **device_options: Any,
) -> AsyncIterator[Rig]:
    """Start the peers, the device, the kernel and the link; tear all down.

    ``firmware`` installs on the device before the link connects (for example
    ``actions.ProjectFirmware``: its API actions are listed at connect).
    """
    if "profile" not in device_options:  # a profile brings its own firmware
        device_options = {
            "esphome_version": FIRMWARE,
            "features": ATOM_ECHO_FEATURES,
            **device_options,
        }
    async with (
        EmulatedDevice(name="kitchen", encrypted=True, **device_options) as device,
        OpenAIPeer() as peer,
        WyomingSttServer(phrases=list(phrases)) as stt,
        WyomingTtsServer() as tts,
    ):
        if firmware is not None:
            firmware(device)
        round_ends = RoundEnds()
        tools = DeviceAction()
        kernel = Kernel(
            OpenAIChatProvider(
                base_url=peer.base_url, api_key="sk-test", model=DEFAULT_MODEL
            ),
            ChannelRegistry(),
            tools=tools,
            on_round_end=round_ends,
        )
        transcribe = wyoming_stt(stt.host, stt.port)
        binding = DuplexBinding(
            kernel=kernel,
            stt=transcribe,
            tts=wyoming_tts(tts.host, tts.port),
            options=DuplexOptions(barge_in=barge_in, end_silence_ms=end_silence_ms),
            round_ends=round_ends,
            echo=echo,
            idle_timeout_s=idle_timeout_s,
        )
        states = States()
        conversations: list[DuplexConversation] = []
        closed = asyncio.Event()

        def on_conversation(conversation: DuplexConversation | None) -> None:
            if conversation is None:
                closed.set()
            else:
                conversations.append(conversation)

        link = EsphomeLink(
            LinkConfig(
                host=device.host,
                port=device.port,
                noise_psk=psk or device.noise_psk,
                login_timeout=0.5,  # 2026.9 never answers: fall back quickly
                backoff_min=0.05,
                backoff_max=0.2,
            ),
            binding,
            on_state=states,
            on_conversation=on_conversation,
        )
        link.start()
        try:
            if connect:
                await asyncio.wait_for(link.wait_connected(), SAFETY)
                await device.wait_for_voice_client()
            with accounted(
                lambda: duplex_account(
                    link, stt, len(peer.requests), [str(s) for s in states.seen]
                )
            ):
                yield Rig(
                    device,
                    link,
                    kernel,
                    peer,
                    stt,
                    states,
                    tools,
                    conversations,
                    transcribe,
                    closed,
                )
        finally:
            tools.release.set()
            await link.aclose()
            await kernel.stop_all()
        assert device.voice.errors == []


def mic_ending_events(device: EmulatedDevice, since: int = 0) -> list[int]:
    """Events the link sent that end the device's mic streaming."""
    return [
        e.detail["type"]
        for e in list(device.events)[since:]
        if e.kind is Kind.VOICE_EVENT and e.detail["type"] in MIC_ENDING
    ]


def run_end_count(device: EmulatedDevice) -> int:
    """RUN_END events the device received."""
    return sum(
        1
        for e in device.events
        if e.kind is Kind.VOICE_EVENT and e.detail["type"] == EventType.RUN_END
    )


# --------------------------------------------------------------------------- tests


async def test_wake_utterance_answer_then_silence_ends_the_run(clip) -> None:
    """Wake word, words, an answer heard at the device; silence: RUN_END, child kept."""
    async with rig() as r:
        assert r.link.login is not LOGIN_WAITS  # fell back where it would hang
        r.peer.enqueue(Text("The kitchen "), Text("lights are on."))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        await r.states.wait_for(SessionState.LISTENING, speaking)
        await r.device.wait_for_event(EventType.RUN_END)
        await asyncio.wait_for(r.device.wait_for_state(State.IDLE), SAFETY)
        history = r.history(conversation)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            ("user", ASK, False),
            ("assistant", "The kitchen lights are on.", False),
        ]
        assert (await r.transcribe(r.answer_audio())) == ANSWER
        assert mic_ending_events(r.device) == []
        assert run_end_count(r.device) == 1
        assert r.link.conversation is conversation and conversation.idle
        assert conversation.child_id in r.kernel.children()  # outlives the wake word
        assert r.device.runs[-1].mic_stop_reason == "run_end"


async def test_a_wake_word_within_the_idle_timeout_continues_the_child(clip) -> None:
    """Second wake word after RUN_END: a new session on the same child, history kept."""
    async with rig() as r:
        r.peer.enqueue(Text("The kitchen lights are on."))
        r.peer.enqueue(Text("Okay."))
        first = await r.wake_and_say(clip(ASK))
        await r.device.wait_for_event(EventType.RUN_END)
        await asyncio.wait_for(r.device.wait_for_state(State.IDLE), SAFETY)
        first_session = first.session
        since = r.device.mark()
        second = await r.wake_and_say(clip(STOP))
        assert second is first and second.session is not first_session
        assert second.sessions == 2
        await r.peer.wait_for_request(2)
        await r.device.wait_for_event(EventType.RUN_END, since)
        # The model saw the earlier turns.
        contents = [m["content"] for m in r.peer.requests[1].body["messages"]]
        assert contents[-3:] == [ASK, "The kitchen lights are on.", STOP]
        assert [m.content for m in r.history(first)] == [
            ASK,
            "The kitchen lights are on.",
            STOP,
            "Okay.",
        ]
        assert first_session.state is SessionState.ENDED
        assert r.closed.is_set() is False
        assert mic_ending_events(r.device) == []


async def test_the_idle_timeout_closes_the_conversation(clip) -> None:
    """No wake word within the idle timeout: the child is handed off; a new one starts."""
    async with rig(idle_timeout_s=0.2) as r:
        r.peer.enqueue(Text("The kitchen lights are on."))
        r.peer.enqueue(Text("Okay."))
        first = await r.wake_and_say(clip(ASK))
        await r.device.wait_for_event(EventType.RUN_END)
        await asyncio.wait_for(r.closed.wait(), SAFETY)
        assert r.link.conversation is None
        assert first.child_id not in r.kernel.children()  # handed off
        assert r.kernel.transcript(first.child_id) is not None
        since = r.device.mark()
        second = await r.wake_and_say(clip(STOP))
        assert second is not first
        await r.device.wait_for_event(EventType.RUN_END, since)
        assert [m.content for m in r.history(second)] == [STOP, "Okay."]


async def test_speech_during_playback_stops_it_and_is_answered(clip) -> None:
    """Barge-in: the answer stops, history keeps what was heard, the words are answered."""
    async with rig() as r:
        r.peer.enqueue(*(Text(part + ".") for part in LONG.split(".") if part))
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        mark = r.device.mark()
        r.device.say(clip(STOP), wake_word=None)  # the mic stays open
        await r.peer.wait_for_request(2)
        await r.device.wait_for_event(EventType.RUN_END, mark)
        history = r.history(conversation)
        roles = [(m.role, m.interrupted) for m in history]
        assert roles == [
            ("user", False),
            ("assistant", True),
            ("user", False),
            ("assistant", False),
        ]
        heard = history[1].content
        assert heard and LONG.lower().startswith(heard.lower().rstrip())
        assert len(heard) < len(LONG)
        assert history[2].content == STOP
        assert history[3].content == "Okay."
        session_stats = r.conversations[0].session.stats
        assert session_stats.barge_ins == 1
        assert mic_ending_events(r.device) == []


async def test_device_action_running_at_barge_in_completes(clip) -> None:
    """A tool running when the user talks over the answer completes and is recorded."""
    async with rig() as r:
        r.peer.enqueue(
            # "!" and a space close the sentence: the splitter holds a final "."
            # until the next word or the round's end (after the tool).
            Text("Sure, I am switching on every light in the kitchen for you now! "),
            PeerToolCall("t1", "lights", "{}"),
        )
        r.peer.enqueue(Text("Okay."))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await asyncio.wait_for(r.tools.started.wait(), SAFETY)
        r.device.say(clip(STOP), wake_word=None)
        await r.stt.wait_for_request(2)
        await r.states.wait_for(SessionState.LISTENING, len(r.states.seen) - 1)
        assert not r.tools.finished.is_set()  # still running: never cut
        r.tools.release.set()
        await r.peer.wait_for_request(2)
        await r.device.wait_for_event(EventType.RUN_END)
        history = r.history(conversation)
        assert [m.role for m in history] == [
            "user",
            "assistant",
            "tool",
            "user",
            "assistant",
        ]
        assert history[1].tool_calls and history[1].tool_calls[0].name == "lights"
        assert json.loads(history[2].content) == {"success": True}
        assert history[3].content == STOP
        assert r.tools.finished.is_set()


async def test_a_cough_during_playback_pauses_and_resumes(clip) -> None:
    """A noise burst pauses the answer; no words: it resumes and completes."""
    async with rig() as r:
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        r.device.say(noise(200, -12.0), wake_word=None)
        paused = await r.states.wait_for(SessionState.PAUSED, speaking)
        await r.states.wait_for(SessionState.SPEAKING, paused)  # resumed
        await r.device.wait_for_event(EventType.RUN_END)
        history = r.history(conversation)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            ("user", ASK, False),
            ("assistant", LONG, False),
        ]
        stats = r.conversations[0].session.stats
        assert stats.false_barge_ins >= 1 and stats.pushes == 1


async def test_wake_word_mode_ignores_speech_during_playback(clip) -> None:
    """In wake_word mode speech over the answer neither pauses nor interrupts it."""
    async with rig(barge_in=BargeIn.WAKE_WORD) as r:
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        r.device.say(clip(STOP), wake_word=None)
        await r.device.wait_for_event(EventType.RUN_END)
        assert SessionState.PAUSED not in r.states.seen[speaking:]
        history = r.history(conversation)
        assert [(m.role, m.content, m.interrupted) for m in history] == [
            ("user", ASK, False),
            ("assistant", LONG, False),
        ]
        assert r.conversations[0].session.stats.dropped_utterances == 1
        assert len(r.peer.requests) == 1


async def test_device_drops_mid_answer_and_comes_back(clip) -> None:
    """A lost connection ends the session (cut as heard); a wake word continues the child."""
    async with rig() as r:
        r.peer.enqueue(Text(LONG))
        first = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        since = r.device.mark()
        r.device.drop_connection()
        await r.device.wait_for_voice_client(since)
        await asyncio.wait_for(r.link.wait_connected(), SAFETY)
        assert r.link.conversation is first and first.idle
        assert first.child_id in r.kernel.children()
        first_session = first.session
        assert first_session.state is SessionState.ENDED
        r.peer.enqueue(Text("The kitchen lights are on."))
        second = await r.wake_and_say(clip(ASK))
        assert second is first and second.session is not first_session
        await r.device.wait_for_event(EventType.RUN_END, since)
        history = r.history(second)
        assert history[1].interrupted and len(history[1].content) < len(LONG)
        assert history[-1].content == "The kitchen lights are on."
        assert not r.closed.is_set()


def device_transport(loop: asyncio.AbstractEventLoop, port: int) -> asyncio.Transport:
    """Return the link's socket transport to the device (aioesphomeapi hides it)."""
    selector = loop._selector  # type: ignore[attr-defined]  # noqa: SLF001
    for key in selector.get_map().values():
        reader = key.data[0]
        transport = getattr(getattr(reader, "_callback", None), "__self__", None)
        if isinstance(transport, asyncio.Transport):
            peer = transport.get_extra_info("peername")
            if peer is not None and peer[1] == port:
                return transport
    raise AssertionError("no transport to the device")


async def test_sends_after_the_socket_failed_leave_the_loop_sound() -> None:
    """Audio sent between a failed socket and aioesphomeapi hearing of it is dropped.

    A failed write closes asyncio's transport at once; aioesphomeapi learns of it
    one loop iteration later. Frames sent in between must not reach the transport
    (``writelines`` would leave a writer for the closed fd in the selector), so
    the reconnect and every later socket of the loop work.
    """
    loop = epoll_loop()
    async with rig() as r:
        client = r.link.client
        assert client is not None
        transport = device_transport(loop, r.device.port)
        since = r.device.mark()
        transport.abort()  # what a write that failed does to the transport
        output = ApiAudioOutput(r.link)
        for _ in range(5):  # the player's frames, in the same loop iteration
            await output.send(bytes(320))
        await output.aclose()
        await r.device.wait_for_voice_client(since)
        await asyncio.wait_for(r.link.wait_connected(), SAFETY)
        assert selector_keys_epoll_lost(loop) == []


async def test_aclose_mid_session_leaves_no_task(clip) -> None:
    """Closing the link while an answer plays ends every task it started."""
    before = asyncio.all_tasks()
    async with rig() as r:
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await r.link.aclose()
        assert r.link.conversation is None
        assert conversation.child_id not in r.kernel.children()
        assert run_end_count(r.device) == 1  # the device goes back to its wake word
    leftover = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and "rtvoice" in t.get_name()
    ]
    assert leftover == []


async def test_echo_never_interrupts_in_wake_word_mode(clip) -> None:
    """The device hears its own answer (echo): wake_word mode plays it to the end."""
    async with rig(barge_in=BargeIn.WAKE_WORD, echo_gain=0.6) as r:
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        speaking = await r.states.wait_for(SessionState.SPEAKING)
        await r.device.wait_for_event(EventType.RUN_END)
        assert SessionState.PAUSED not in r.states.seen[speaking:]
        assert r.history(conversation)[-1].content == LONG
        assert not r.history(conversation)[-1].interrupted
        assert len(r.peer.requests) == 1


@pytest.mark.skipif(
    echo_unavailable_reason("aec3") is not None,
    reason=str(echo_unavailable_reason("aec3")),
)
async def test_echo_cancelled_on_the_server_does_not_interrupt_in_vad_mode(
    clip,
) -> None:
    """Vad mode over echo, with the server's AEC3: the answer is not cut by itself."""
    async with rig(echo=partial(EchoCanceller, engine="aec3"), echo_gain=0.6) as r:
        r.peer.enqueue(Text(LONG))
        conversation = await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await r.device.wait_for_event(EventType.RUN_END)
        stats = r.conversations[0].session.stats
        assert stats.barge_ins == 0 and stats.pushes == 1
        assert r.history(conversation)[-1].content == LONG
        assert not r.history(conversation)[-1].interrupted


class RecordingEcho(EchoCanceller):
    """The product's canceller, keeping the reference each mic frame was cleaned with."""

    def __init__(self) -> None:
        """Make a real AEC3; ``references`` fills on the DSP worker, in mic order."""
        super().__init__(engine="aec3")
        self.references: list[bytes] = []

    def process(self, frame: bytes, reference: bytes | None = None) -> bytes:
        """Clean ``frame``; note the reference that went with it."""
        cleaned = super().process(frame, reference)
        self.references.append(self.last_reference)
        return cleaned


def sounding(pcm: bytes) -> np.ndarray:
    """Return the samples of ``pcm`` that are not digital silence, in order."""
    samples = np.frombuffer(pcm, dtype="<i2")
    return samples[samples != 0]


@pytest.mark.skipif(
    echo_unavailable_reason("aec3") is not None,
    reason=str(echo_unavailable_reason("aec3")),
)
async def test_echo_reference_is_the_answer_as_the_device_plays_it(clip) -> None:
    """The far-end reference is the sent audio back to back: no sample lost or doubled.

    The device plays the frames it gets one after another; AEC3 learns the echo path
    sample by sample, so a reference that slips by one sample between two frames
    (re-placed from the mic chunks' jittery arrival times) is a new echo path to it,
    and the echo leaks until it re-learns. Only silence may be inserted (where the
    device really ran dry). Real loop timing: the mic chunks arrive over TCP.
    """
    echoes: list[RecordingEcho] = []

    def factory() -> RecordingEcho:
        echoes.append(RecordingEcho())
        return echoes[-1]

    async with rig(echo=factory, echo_gain=0.5) as r:
        r.peer.enqueue(Text(LONG))
        await r.wake_and_say(clip(ASK))
        await r.states.wait_for(SessionState.SPEAKING)
        await r.device.wait_for_event(EventType.RUN_END)
        sent = r.answer_audio()
    assert len(echoes) == 1
    reference = b"".join(echoes[0].references)
    assert len(sounding(sent)) > 16000  # seconds of answer, not a blip
    assert np.array_equal(sounding(reference), sounding(sent))


async def test_wrong_key_is_reported_once_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A wrong Noise key: unavailable with a typed error, one warning, no crash."""
    wrong = "kM4hjsYMzyG7ieDB+jQEPvqAOGdYoswlGXmQx4CGuhY="
    with caplog.at_level(logging.WARNING, logger="custom_components.rtvoice"):
        async with rig(psk=wrong, connect=False) as r:
            await r.device.wait_for_disconnect()
            since = r.device.mark()
            await r.device.wait_for_disconnect(since)  # retried, failed again
            assert not r.link.available
            assert isinstance(r.link.last_error, InvalidEncryptionKeyAPIError)
    warnings = [
        rec for rec in caplog.records if rec.name.startswith("custom_components")
    ]
    assert len(warnings) == 1
    assert "unavailable" in warnings[0].getMessage()
    assert wrong not in caplog.text


async def test_older_firmware_gets_login_and_both_audio_signatures_work() -> None:
    """ESPHome < 2026.1 answers the login; mic audio arrives as (data) or (data, data2)."""
    async with EmulatedDevice(name="old", esphome_version="2025.4.0") as device:
        kernel = Kernel(
            OpenAIChatProvider(base_url="http://127.0.0.1:9", api_key=None, model="m"),
            ChannelRegistry(),
        )

        async def no_stt(pcm: bytes) -> str:
            return ""

        async def no_tts(text: str) -> AsyncIterator[bytes]:
            yield b""

        link = EsphomeLink(
            LinkConfig(host=device.host, port=device.port),
            DuplexBinding(kernel=kernel, stt=no_stt, tts=no_tts),
        )
        link.start()
        try:
            await asyncio.wait_for(link.wait_connected(), SAFETY)
            await device.wait_for_voice_client()
            assert link.login is True
            assert link.device_info is not None and link.device_info.name == "old"
            opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            link._on_conversation = lambda c: opened.done() or opened.set_result(None)  # noqa: SLF001
            run = device.wake()
            assert run is not None
            await asyncio.wait_for(run.streaming.wait(), SAFETY)
            await asyncio.wait_for(opened, SAFETY)
            conversation = link.conversation
            assert conversation is not None
            fed: list[bytes] = []
            conversation.session.feed_mic = fed.append  # type: ignore[method-assign]
            await link._handle_audio(b"\x01" * 640)  # noqa: SLF001 - aioesphomeapi 29.x
            await link._handle_audio(b"\x02" * 640, b"")  # noqa: SLF001 - 45+
            # No await suspends in between: these two chunks, in order.
            assert [chunk for chunk in fed if chunk[:1] != b"\x00"] == [
                b"\x01" * 640,
                b"\x02" * 640,
            ]
        finally:
            await link.aclose()
            await kernel.stop_all()
