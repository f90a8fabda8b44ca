"""A Wyoming satellite in duplex: the integration as the satellite's TCP client.

HA-free (the ``wyoming`` package and the duplex core only); the config entry, the
``assist_satellite`` entity and the repair are the HA side (DESIGN §5.5). Like HA's
``wyoming`` integration (``assist_satellite.py``) the link connects to the satellite,
asks ``describe`` (keeps its ``info``) and sends ``run-satellite``. A satellite in
always-streaming mode (``wyoming-satellite`` without ``--vad`` and without a wake
service) then streams its mic continuously, also while it plays: a duplex peer::

    link = WyomingSatelliteLink(
        host, port,
        DuplexBinding(kernel, stt, tts, options, round_ends),  # as for ESPHome
        name="kitchen",
        wake=engine,                           # a warmed WakeWordEngine, or None
    )
    link.start()
    ...
    await link.aclose()                        # no task left

Wake word: on the server (``wake``: the openWakeWord engine of ``audio/wakeword.py``,
its model work in an executor) and/or a ``detection`` event from the satellite (a
satellite with its own wake service). The first wake opens a ``DuplexConversation``
(the session logic shared with ESPHome: a kernel child on its own RT pair, each delta
with its round's seq, the round's end through ``RoundEnds``); the mic goes to its
session; a wake word during the session interrupts the answer in every barge-in
mode (``wake_word_detected``). The session's frames become
``audio-start``/``audio-chunk``/``audio-stop``; the duplex player keeps only
``lead_ms`` queued on the satellite. wyoming-satellite has no stop-playback event: a
cut sends no more audio, then ``audio-stop``; the satellite still plays what it had
(the lead, plus the pipe of its ``--snd-command``). The mic DSP (echo canceller,
gate, VAD) runs on the link's one ``DspWorker`` thread, closed in ``aclose``.

The conversation outlives the wake word (as on ESPHome): after the end silence the
session ends and the link waits for the wake word again, while the conversation's
kernel child stays idle for the binding's ``idle_timeout_s``; a wake word within
it resumes the same child (the model sees the earlier turns), after it
(``on_close``) opens a new one.

Reconnect: a lost connection (EOF, error, no event for ``idle_timeout_s`` of the
link options) ends the session, not the conversation (the running round is
interrupted; what was played stays acknowledged): after the reconnect a wake word
continues it. The link reconnects with exponential backoff (``reconnect_min_s``
doubling up to ``reconnect_max_s``; reset once a connection delivered audio).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
import contextlib
from dataclasses import dataclass, field
import enum
import logging
from typing import TYPE_CHECKING, Any

from wyoming.audio import AudioChunk, AudioChunkConverter, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.satellite import RunSatellite
from wyoming.wake import Detection as WyomingDetection

from .duplex import (
    SAMPLE_RATE,
    DspWorker,
    DuplexSession,
    SessionState,
    UtteranceSegmenter,
)
from .duplex.tasks import wait_ended
from .duplex_link import DuplexBinding, DuplexConversation, warm_segmenter
from .wyoming_proto import (
    PeerInfo,
    WyomingConnection,
    WyomingProtocolError,
    audio_chunk,
    peer_info,
)

if TYPE_CHECKING:
    from .audio.wakeword import WakeWordEngine, WakeWordStream

_LOGGER = logging.getLogger(__name__)

SAMPLE_WIDTH = 2
CHANNELS = 1
_PLAYING = (SessionState.SPEAKING, SessionState.PAUSED, SessionState.RESUMING)


class LinkState(enum.StrEnum):
    """Where the link is."""

    CONNECTING = "connecting"
    WAITING_FOR_WAKE = "waiting_for_wake"  # connected, streaming, no conversation
    CONVERSING = "conversing"  # a duplex session owns the mic
    DISCONNECTED = "disconnected"  # waiting to reconnect
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class LinkOptions:
    """How the link talks to its satellite."""

    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 10.0
    # No event (the mic streams ~16 chunks a second) for this long: the satellite is gone.
    idle_timeout_s: float = 5.0
    connect_timeout_s: float = 5.0
    # openWakeWord scores several 80 ms frames of one phrase above the threshold: one
    # detection per this much audio (server-side wake word).
    wake_refractory_ms: int = 1500


@dataclass
class LinkStats:
    """Counters of one link (diagnostics, tests, benchmarks)."""

    connects: int = 0
    disconnects: int = 0
    wakes: int = 0  # wake words that opened or resumed a conversation
    resumed: int = 0  # of the wakes: a new session on the idle child
    wake_interrupts: int = 0  # wake words during a conversation
    satellite_detections: int = 0  # of the wakes: detection events from the satellite
    conversations: int = 0
    mic_chunks: int = 0
    audio_streams: int = 0  # audio-start .. audio-stop sent
    frames_sent: int = 0
    last_frame_sent_at: float | None = None  # loop time
    # Per audio stream closed (answer ended or cut): when its last frame was sent.
    stream_last_frame_at: list[float | None] = field(default_factory=list)
    # Per audio stream opened: when its first frame was sent.
    stream_first_frame_at: list[float] = field(default_factory=list)
    wake_errors: int = 0
    refused_chunks: int = 0  # audio-chunks in a format the link does not take
    protocol_errors: int = 0  # connections dropped for an event beyond the limits


class WyomingSatelliteLink:
    """One Wyoming satellite: connection, wake word, and its duplex conversations."""

    def __init__(
        self,
        host: str,
        port: int,
        binding: DuplexBinding,
        *,
        name: str | None = None,
        wake: WakeWordEngine | None = None,
        wake_model_ids: list[str] | None = None,
        satellite_wake: bool = True,
        link_options: LinkOptions | None = None,
        on_state: Callable[[LinkState], None] | None = None,
        on_session_state: Callable[[SessionState | None], None] | None = None,
    ) -> None:
        """Bind the satellite's address to the duplex binding (kernel, STT, TTS).

        ``wake``: a warmed engine for wake words on the server (None: only the
        satellite's ``detection`` events wake it, if ``satellite_wake``).
        ``on_state`` follows the link, ``on_session_state`` the conversation's
        session (None while no session runs). The binding's ``prepare`` hook
        (the HA side fetches the child's tools) runs when a conversation opens
        and again when a wake word resumes it (``DuplexConversation``).
        """
        self.host = host
        self.port = port
        self.binding = binding
        self.name = name or f"{host}:{port}"
        self._wake = wake
        self._wake_model_ids = wake_model_ids
        self._satellite_wake = satellite_wake
        self.link_options = link_options if link_options is not None else LinkOptions()
        self._on_state = on_state
        self._on_session_state = on_session_state
        self.state = LinkState.DISCONNECTED
        self.stats = LinkStats()
        self.info: PeerInfo | None = None
        self.conversation: DuplexConversation | None = None
        self.last_conversation: DuplexConversation | None = None
        self._client: WyomingConnection | None = None
        self._refusing_audio = False  # a bad format was logged on this connection
        self._converter = AudioChunkConverter(SAMPLE_RATE, SAMPLE_WIDTH, CHANNELS)
        self._wake_stream: WakeWordStream | None = None
        self._last_wake_ms: int | None = None  # stream audio position of the last wake
        self._segmenter: UtteranceSegmenter | None = None
        # The mic stream's DSP (AEC, gate, VAD) off the event loop, one per link.
        self._dsp = DspWorker(f"rtvoice dsp {self.name}")
        self._audio_open = False  # audio-start sent, audio-stop not yet
        self._stop_task: asyncio.Task[None] | None = None  # audio-stop being written
        self._task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._connected = asyncio.Event()
        self._closed = False

    @property
    def dsp_dropped(self) -> int:
        """Mic chunks the DSP worker dropped (audio faster than real time)."""
        return self._dsp.dropped

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start connecting (idempotent)."""
        if self._closed:
            raise RuntimeError("the link is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"rtvoice wyoming {self.host}:{self.port}"
            )

    @property
    def idle(self) -> bool:
        """Return True when no task of the link runs (after ``aclose``)."""
        return self._task is None and not self._closing and self.conversation is None

    @property
    def connected(self) -> bool:
        """Return True while the satellite is connected (streaming or waiting)."""
        return self.state in (LinkState.WAITING_FOR_WAKE, LinkState.CONVERSING)

    @property
    def session(self) -> DuplexSession | None:
        """The live session, if any (None while the conversation is idle)."""
        conversation = self.conversation
        if conversation is None or conversation.ended:
            return None
        return conversation.session

    @property
    def last_session(self) -> DuplexSession | None:
        """The session of the newest conversation, live or ended (tests, stats)."""
        conversation = self.last_conversation
        return conversation.session if conversation is not None else None

    async def wait_connected(self) -> None:
        """Return once the satellite streams to this link (tests, setup)."""
        await self._connected.wait()

    async def aclose(self) -> None:
        """Disconnect and close the conversation; no task is left. Idempotent."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A cancelled _run() may have left its cleanup to us.
        await self._close_conversation()
        await self._audio_stop()
        await wait_ended(self._closing)
        await self._disconnect()
        await self._dsp.aclose()
        await self._close_wake_stream()
        self._set_state(LinkState.CLOSED)

    # --- connection loop ---------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.link_options.reconnect_min_s
        while True:
            self._set_state(LinkState.CONNECTING)
            streamed = False
            try:
                await self._connect()
                self.stats.connects += 1
                streamed = await self._serve()
            except asyncio.CancelledError:
                raise
            except WyomingProtocolError as err:
                self.stats.protocol_errors += 1
                log = (
                    _LOGGER.warning
                    if self.stats.protocol_errors == 1
                    else _LOGGER.debug
                )
                log(
                    "Wyoming satellite %s:%s broke the protocol (%s): reconnecting",
                    self.host,
                    self.port,
                    err,
                )
            except Exception as err:  # noqa: BLE001 - any failure: reconnect
                _LOGGER.debug(
                    "Wyoming satellite %s:%s: %s",
                    self.host,
                    self.port,
                    type(err).__name__,
                )
            finally:
                self._connected.clear()
                # The session first: on a deliberate close its audio-stop still
                # reaches the satellite (which then closes its speaker).
                if self._closed:
                    await self._close_conversation()
                else:
                    self._set_state(LinkState.DISCONNECTED)
                    self._end_session()  # the conversation waits, idle
                await self._audio_stop()
                await self._disconnect()
            self.stats.disconnects += 1
            self._set_state(LinkState.DISCONNECTED)
            if streamed:
                backoff = self.link_options.reconnect_min_s
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.link_options.reconnect_max_s)

    async def _connect(self) -> None:
        client = WyomingConnection(self.host, self.port)
        async with asyncio.timeout(self.link_options.connect_timeout_s):
            await client.connect()
        self._client = client
        self._audio_open = False
        self._refusing_audio = False
        await client.write_event(Describe().event())
        await client.write_event(RunSatellite().event())
        if self._wake is not None and self._wake_stream is None:
            await self._open_wake_stream(self._wake)

    async def _open_wake_stream(self, engine: WakeWordEngine) -> None:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, engine.open_stream, self._wake_model_ids)
        try:
            self._wake_stream = await asyncio.shield(future)
        except asyncio.CancelledError:
            # The thread still makes the stream: free it when it is done.
            future.add_done_callback(_close_stream_later)
            raise
        except Exception as err:  # noqa: BLE001 - the satellite's own wake word still works
            self._wake = None
            _LOGGER.error(
                "Wake word detection on the server is unavailable for %s:%s: %s",
                self.host,
                self.port,
                err,
            )

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        self._audio_open = False
        if client is not None:
            with contextlib.suppress(OSError):
                await client.disconnect()

    async def _serve(self) -> bool:
        """Read events until the connection ends; return True if audio arrived."""
        client = self._client
        assert client is not None
        self._set_state(LinkState.WAITING_FOR_WAKE)
        streamed = False
        while True:
            async with asyncio.timeout(self.link_options.idle_timeout_s):
                event = await client.read_event()
            if event is None:
                return streamed
            if AudioChunk.is_type(event.type):
                if not streamed:
                    streamed = True
                    self._connected.set()
                if (chunk := self._checked_audio(event)) is not None:
                    await self._mic(chunk)
            elif WyomingDetection.is_type(event.type):
                if self._satellite_wake:
                    self.stats.satellite_detections += 1
                    await self._wake_detected()
            elif Info.is_type(event.type):
                self.info = peer_info(event)
            elif Ping.is_type(event.type):
                await self._write(Pong(text=Ping.from_event(event).text).event())
            # run-pipeline (the satellite asks for wake → tts), audio-start/stop of the
            # mic, pong, played: nothing to do in duplex mode.

    # --- mic -------------------------------------------------------------------------

    def _checked_audio(self, event: Event) -> AudioChunk | None:
        """Return the chunk if the link converts its format; else None (logged once)."""
        try:
            chunk = audio_chunk(event)
        except WyomingProtocolError as err:
            self.stats.refused_chunks += 1
            if not self._refusing_audio:
                self._refusing_audio = True
                _LOGGER.warning(
                    "Wyoming satellite %s:%s sends audio the link cannot take (%s):"
                    " such chunks are dropped (counted in the diagnostics)",
                    self.host,
                    self.port,
                    err,
                )
            return None
        return chunk

    async def _mic(self, chunk: AudioChunk) -> None:
        self.stats.mic_chunks += 1
        pcm = self._converter.convert(chunk).audio
        conversation = self.conversation
        if conversation is not None and not conversation.ended:
            conversation.session.feed_mic(pcm)
        stream = self._wake_stream
        if stream is None or not stream.feed(pcm):
            return
        loop = asyncio.get_running_loop()
        while stream.frames_ready:
            try:
                detection = await loop.run_in_executor(None, stream.process)
            except Exception as err:  # noqa: BLE001 - the wake word is lost, not the link
                self.stats.wake_errors += 1
                _LOGGER.error("Wake word detection failed: %s", type(err).__name__)
                return
            if detection is None:
                return
            last = self._last_wake_ms
            if (
                last is not None
                and detection.audio_ms - last < self.link_options.wake_refractory_ms
            ):
                continue  # the same phrase, scored again by the next frame
            self._last_wake_ms = detection.audio_ms
            await self._wake_detected()
            if stream is not self._wake_stream:
                return

    async def _wake_detected(self) -> None:
        """Take a wake word: barge-in, a new session on the idle child, or a new child."""
        conversation = self.conversation
        if conversation is not None and not conversation.ended:
            self.stats.wake_interrupts += 1
            conversation.session.wake_word_detected()
            return
        self.stats.wakes += 1
        if conversation is not None and conversation.resume():
            # Idle: a new session on the same child (no await since the check).
            self.stats.resumed += 1
            self._set_state(LinkState.CONVERSING)
            return
        await self._open_conversation()

    async def _open_conversation(self) -> None:
        if self._segmenter is None:
            # Loads and warms the VAD: blocking (in an executor), once per link.
            self._segmenter = await warm_segmenter()
        self.stats.conversations += 1
        conversation = await DuplexConversation.open(
            self.binding,
            name=self.name,
            send=self._send_frame,
            segmenter=self._segmenter,
            dsp=self._dsp,
            on_end=self._session_ended,
            on_state=self._session_state,
            on_close=self._conversation_closed,
        )
        previous = self.conversation
        self.conversation = self.last_conversation = conversation
        if previous is not None and previous is not conversation:
            self._spawn(previous.aclose(), "end conversation")  # closing already
        self._set_state(LinkState.CONVERSING)
        if self._on_session_state is not None:
            self._on_session_state(conversation.session.state)

    def _session_ended(self) -> None:
        """Silence after the last answer: back to the wake word, the child waits."""
        self._went_idle()

    def _end_session(self) -> None:
        """End the live session (the satellite went away); the child waits, idle.

        The answer is cut at what was heard and the running round interrupted; a
        reconnect and a wake word continue the conversation.
        """
        conversation = self.conversation
        if conversation is None or conversation.ended:
            return
        conversation.end_session()
        self._went_idle()

    def _went_idle(self) -> None:
        if self._on_session_state is not None:
            self._on_session_state(None)
        if self.state is LinkState.CONVERSING:
            self._set_state(LinkState.WAITING_FOR_WAKE)

    def _conversation_closed(self, conversation: DuplexConversation) -> None:
        """Detach ``conversation`` (the idle timeout began its close); await the close."""
        if self.conversation is conversation:
            self.conversation = None
        self._spawn(conversation.aclose(), "end conversation")

    async def _close_conversation(self) -> None:
        """Close the conversation (the link closes): child handed off, shielded."""
        conversation, self.conversation = self.conversation, None
        if conversation is None:
            return
        live = not conversation.ended
        await conversation.aclose()
        if live and self._on_session_state is not None:
            self._on_session_state(None)

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=f"rtvoice {what}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # --- speaker ----------------------------------------------------------------------

    def _session_state(self, state: SessionState) -> None:
        if self._on_session_state is not None and state is not SessionState.ENDED:
            self._on_session_state(state)
        if state not in _PLAYING and self._audio_open:
            # The answer ended or was cut: close the satellite's audio stream. The
            # next answer's audio-start waits for this audio-stop to be written.
            self._audio_open = False
            self.stats.stream_last_frame_at.append(self.stats.last_frame_sent_at)
            task = asyncio.get_running_loop().create_task(
                self._write_audio_stop(), name="rtvoice wyoming audio stop"
            )
            self._stop_task = task
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _send_frame(self, frame: bytes) -> None:
        if self._client is None:
            return  # disconnected: the frame is lost, as on a speaker that went away
        if not self._audio_open:
            if self._stop_task is not None and not self._stop_task.done():
                await asyncio.shield(self._stop_task)
            self._audio_open = True
            self.stats.audio_streams += 1
            await self._write(
                AudioStart(
                    rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS
                ).event()
            )
        chunk = AudioChunk(
            rate=SAMPLE_RATE, width=SAMPLE_WIDTH, channels=CHANNELS, audio=frame
        )
        if await self._write(chunk.event()):
            now = asyncio.get_running_loop().time()
            self.stats.frames_sent += 1
            if len(self.stats.stream_first_frame_at) < self.stats.audio_streams:
                self.stats.stream_first_frame_at.append(now)
            self.stats.last_frame_sent_at = now

    async def _audio_stop(self) -> None:
        """Close the satellite's audio stream, if open; wait for an audio-stop under way."""
        if self._audio_open:
            self._audio_open = False
            self.stats.stream_last_frame_at.append(self.stats.last_frame_sent_at)
            await self._write_audio_stop()
        elif self._stop_task is not None and not self._stop_task.done():
            await asyncio.shield(self._stop_task)

    async def _write_audio_stop(self) -> None:
        await self._write(AudioStop().event())

    async def _write(self, event: Event) -> bool:
        """Write an event; False when the connection is gone (the reader reconnects)."""
        client = self._client
        if client is None:
            return False
        try:
            await client.write_event(event)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a closed transport raises several types
            return False
        return True

    async def _close_wake_stream(self) -> None:
        stream, self._wake_stream = self._wake_stream, None
        self._last_wake_ms = None
        if stream is not None:
            await asyncio.get_running_loop().run_in_executor(None, stream.close)

    def _set_state(self, state: LinkState) -> None:
        if state is self.state:
            return
        self.state = state
        if self._on_state is not None:
            self._on_state(state)


def _close_stream_later(future: asyncio.Future[WakeWordStream]) -> None:
    """Free a wake word stream whose opener was cancelled (in a worker thread)."""
    if future.cancelled() or future.exception() is not None:
        return
    stream = future.result()
    asyncio.get_running_loop().run_in_executor(None, stream.close)
