"""A duplex conversation: one kernel child, and a ``DuplexSession`` per wake word.

Transport-free (the ESPHome and Wyoming links feed the mic and send the frames).
The child is spawned on an RT pair of its own with acknowledged delivery and
carry-over; its output handler hands every delta, with its round's seq
(``current_round_seq``), to the current session; the kernel's ``on_round_end``
(routed by ``RoundEnds``) tells that session when a round's text ends.

The conversation outlives the wake word (issue 10 §2, session end):

- the session ends after the configured silence: ``on_end`` runs (the link sends
  the device back to wake-word listening) and the conversation is **idle**: the
  child lives on, one ``call_later`` handle waits ``idle_timeout_s``;
- a wake word while idle: ``resume()`` opens a new session on the same child, so the
  model sees the earlier turns;
- the device going away or aborting: ``end_session()`` ends the session (the answer
  cut at what was heard, the round interrupted) and the conversation is idle too;
- the idle timeout, or ``aclose``: the session and the child close (the transcript
  is handed off), once; ``on_close`` tells the link when the timeout did it.
  ``resume()`` refuses once the close has begun: the link opens a new conversation.

The binding's ``prepare`` hook (HA: the brain's per-turn preparation, tools and
API prompt) runs for every session: ``open`` awaits it, ``resume`` starts it as a
task that the session's first transcription waits for (so its first push sees
it; ``resume`` itself stays synchronous). A failed prepare is logged and the
conversation goes on (with what was prepared before, if anything); the close
cancels a running one, then the ``forget`` hook drops what was prepared.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import functools
import itertools
import logging

from .duplex import (
    DspWorker,
    DuplexOptions,
    DuplexSession,
    EchoCanceller,
    KernelChild,
    Recogniser,
    RoomLevel,
    SendFrame,
    SessionState,
    SpeechToText,
    TextToSpeech,
    UtteranceSegmenter,
)
from .duplex.tasks import wait_ended
from .kernel import ChannelDef, ChildOptions, Kernel, current_round_seq

_LOGGER = logging.getLogger(__name__)

_COUNTER = itertools.count(1)


type _Route = Callable[[int], None]


class RoundEnds:
    """Routes the kernel's text signals of each child to its conversation.

    ``Kernel(on_round_end=round_ends, on_text_pause=round_ends.paused)``: a round's
    end, and its text pausing for tool calls.
    """

    def __init__(self) -> None:
        """Start with no routes."""
        self._routes: dict[str, tuple[_Route, _Route]] = {}

    def __call__(self, child_id: str, seq: int) -> None:
        """Forward the end of round ``seq`` of ``child_id`` (unknown: ignored)."""
        route = self._routes.get(child_id)
        if route is not None:
            route[0](seq)

    def paused(self, child_id: str, seq: int) -> None:
        """Forward that round ``seq``'s text waits for tool calls (unknown: ignored)."""
        route = self._routes.get(child_id)
        if route is not None:
            route[1](seq)

    def add(
        self,
        child_id: str,
        route: Callable[[int], None],
        pause: Callable[[int], None] | None = None,
    ) -> Callable[[], None]:
        """Route ``child_id``'s round ends (and pauses) here; returns the remover."""
        self._routes[child_id] = (route, pause or _ignore)
        return lambda: self._routes.pop(child_id, None) and None


def _ignore(seq: int) -> None:
    """Take no pause (a route without one)."""


async def warm_segmenter() -> UtteranceSegmenter:
    """Build a warmed VAD segmenter in an executor (~0.8 s of CPU, blocking)."""
    return await asyncio.get_running_loop().run_in_executor(None, UtteranceSegmenter)


@dataclass(frozen=True, slots=True)
class DuplexBinding:
    """What duplex conversations need from the integration (one per satellite).

    ``stt``/``tts`` are bound by the adapter (HA: the pipeline's stt/tts entities).
    A kernel built without ``on_round_end=round_ends`` still works: the session then
    learns a round's end from its ticket's outcome. ``idle_timeout_s``: how long the
    child outlives its last session (0: it closes with the session).
    ``render_prompt`` (when set) makes the system prompt at every conversation
    open instead of ``system_prompt`` (e.g. a template rendered now).
    ``prepare(child_id, prompt_scope)`` (when set) runs before each session's
    first push (e.g. the brain fetches the child's tools for this turn);
    ``forget(child_id)`` once the child has closed. The entry's
    other conversation settings (context window, tool turns, carry-over) are
    plain fields: the adapter replaces the binding when they change.
    """

    kernel: Kernel
    stt: SpeechToText
    tts: TextToSpeech
    options: DuplexOptions = field(default_factory=DuplexOptions)
    round_ends: RoundEnds | None = None
    echo: Callable[[], EchoCanceller | None] | None = None
    system_prompt: str = ""
    prompt_scope: str | None = None
    context_window: int = 8000
    max_tool_turns: int = 8
    max_answer_chars: int = 4000
    idle_timeout_s: float = 300.0
    carry_over: bool = True
    render_prompt: Callable[[], str] | None = None
    prepare: Callable[[str, str | None], Awaitable[None]] | None = None
    forget: Callable[[str], None] | None = None
    recognise: Recogniser | None = None  # HA's intent matching, for end of turn
    # Once per link: vad mode without echo cancellation, and the mic hears the
    # answers (duplex/self_hearing.py). HA raises a repair.
    on_hears_itself: Callable[[], None] | None = None
    # How loud the satellite's room gets by itself (a TV), learnt while answers
    # play; every session's onset gate judges over it (duplex/gate.py).
    room: RoomLevel = field(default_factory=RoomLevel)

    def prompt(self) -> str:
        """Return the system prompt of a conversation opening now."""
        if self.render_prompt is not None:
            return self.render_prompt()
        return self.system_prompt


class DuplexConversation:
    """One kernel child over one open mic; create with ``await DuplexConversation.open``."""

    def __init__(
        self,
        binding: DuplexBinding,
        child_id: str,
        *,
        send: SendFrame,
        segmenter: UtteranceSegmenter,
        dsp: DspWorker | None = None,
        on_end: Callable[[], None] | None = None,
        on_state: Callable[[SessionState], None] | None = None,
        on_close: Callable[[DuplexConversation], None] | None = None,
    ) -> None:
        """Use ``open``; this binds the parts (the first session included)."""
        self.binding = binding
        self.child_id = child_id
        self._send = send
        self._segmenter = segmenter
        self._own_dsp = dsp is None
        self.dsp = dsp if dsp is not None else DspWorker(f"rtvoice dsp {child_id}")
        self._on_end = on_end
        self._on_state = on_state
        self._on_close = on_close
        self._unroute: Callable[[], None] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._ending: set[asyncio.Task[None]] = set()  # sessions being released
        self._preparing: asyncio.Task[None] | None = None  # the binding's prepare
        self.sessions = 0  # sessions opened on this child
        self.hears_itself = False  # a session found the mic hears the answers
        self.session = self._new_session(first_seq=0)

    @classmethod
    async def open(
        cls,
        binding: DuplexBinding,
        *,
        name: str,
        send: SendFrame,
        segmenter: UtteranceSegmenter,
        on_end: Callable[[], None] | None = None,
        on_state: Callable[[SessionState], None] | None = None,
        dsp: DspWorker | None = None,
        on_close: Callable[[DuplexConversation], None] | None = None,
    ) -> DuplexConversation:
        """Spawn the child on a fresh RT pair and start the first session.

        ``segmenter`` is warmed (``warm_segmenter``) and restarted here; a link keeps
        one per stream, and should keep one ``dsp`` worker per stream with it (the
        mic DSP runs there, in order; without one the conversation makes its own).
        ``on_end`` runs when a session ended by silence (send the device back to
        its wake word); ``on_close`` when the idle timeout closes the conversation.
        """
        kernel = binding.kernel
        child_id = f"duplex:{name}:{next(_COUNTER)}"
        channels = kernel.channels
        channels.register_input(f"{child_id}/in", ChannelDef(realtime=True))
        try:
            conversation = cls(
                binding,
                child_id,
                send=send,
                segmenter=segmenter,
                dsp=dsp,
                on_end=on_end,
                on_state=on_state,
                on_close=on_close,
            )
        except BaseException:
            channels.unregister(f"{child_id}/in")
            raise
        channels.register_output(
            f"{child_id}/out",
            conversation._output_delta,
            definition=ChannelDef(realtime=True),
        )
        if binding.round_ends is not None:
            conversation._unroute = binding.round_ends.add(
                child_id, conversation._output_end, conversation._output_pause
            )
        try:
            await kernel.spawn(
                ChildOptions(
                    id=child_id,
                    input=f"{child_id}/in",
                    output=f"{child_id}/out",
                    system_prompt=binding.prompt(),
                    prompt_scope=binding.prompt_scope,
                    context_window=binding.context_window,
                    max_tool_turns=binding.max_tool_turns,
                    max_answer_chars=binding.max_answer_chars,
                    delivery="acknowledged",
                    carry_over=binding.carry_over,
                )
            )
        except BaseException:
            await conversation._release(spawned=False)
            raise
        try:
            if (preparing := conversation._prepare()) is not None:
                await asyncio.wait((preparing,))
        except BaseException:  # cancelled: nobody gets the conversation
            await conversation._release(spawned=True)
            raise
        _LOGGER.debug("Duplex conversation %s started", child_id)
        return conversation

    # --- state -------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """True while no session is live: idle (ended by silence) or closing."""
        return self.session.state is SessionState.ENDED or self._closing is not None

    @property
    def idle(self) -> bool:
        """True when the session has ended and the child waits for a wake word."""
        return self.session.state is SessionState.ENDED and self._closing is None

    @property
    def closing(self) -> bool:
        """True once the close (idle timeout or ``aclose``) has begun."""
        return self._closing is not None

    # --- sessions ----------------------------------------------------------------

    def resume(self) -> bool:
        """Take a wake word: a new session on the same child when idle.

        Return False once the conversation is closing (open a new one instead);
        True when a session is live (nothing to do: that is a barge-in) or a new one
        was opened. Synchronous: no await between the wake word and the new session.
        """
        if self._closing is not None:
            return False
        if self.session.state is not SessionState.ENDED:
            return True
        self._cancel_idle_timer()
        stats = self.binding.kernel.stats(self.child_id)
        # Rounds that started while nobody listened (e.g. an ask_parent answer)
        # are not the new session's to play.
        self.session = self._new_session(first_seq=stats.last_seq if stats else 0)
        self._prepare()  # a new turn: the session's first push waits for it
        if self._on_state is not None:
            self._on_state(self.session.state)  # listening again
        _LOGGER.debug("Duplex conversation %s resumed", self.child_id)
        return True

    def end_session(self) -> None:
        """End the live session now (device gone or aborted); the child stays, idle."""
        session = self.session
        if self._closing is not None or session.state is SessionState.ENDED:
            return
        session.end()
        self._went_idle(session)

    def _heard_itself(self) -> None:
        """Remember that the mic hears the answers, for later sessions; tell HA."""
        if self.hears_itself:
            return
        self.hears_itself = True
        if self.binding.on_hears_itself is not None:
            self.binding.on_hears_itself()

    def _new_session(self, *, first_seq: int) -> DuplexSession:
        binding = self.binding
        self.sessions += 1
        if self.dsp.closed:
            raise RuntimeError("the DSP worker of this stream is closed")
        session = DuplexSession(
            KernelChild(binding.kernel, self.child_id),
            stt=functools.partial(self._transcribe, binding.stt),
            tts=binding.tts,
            send=self._send,
            options=binding.options,
            segmenter=self._segmenter,
            echo=binding.echo() if binding.echo is not None else None,
            room=binding.room,
            on_end=self._session_ended,
            on_state=self._on_state,
            dsp=self.dsp,
            first_seq=first_seq,
            recognise=binding.recognise,
            hears_itself=self.hears_itself,
            on_hears_itself=self._heard_itself,
        )
        # In order with any audio of an earlier session still on the worker.
        self.dsp.submit(self._segmenter.restart)
        return session

    # --- preparing a turn ----------------------------------------------------------

    def _prepare(self) -> asyncio.Task[None] | None:
        """Start the binding's prepare for a new session (one at a time); its task."""
        if self.binding.prepare is None:
            return None
        if self._preparing is None or self._preparing.done():
            self._preparing = asyncio.get_running_loop().create_task(
                self._run_prepare(self.binding.prepare),
                name=f"rtvoice prepare {self.child_id}",
            )
        return self._preparing

    async def _run_prepare(
        self, prepare: Callable[[str, str | None], Awaitable[None]]
    ) -> None:
        try:
            await prepare(self.child_id, self.binding.prompt_scope)
        except Exception:
            _LOGGER.exception("Preparing duplex conversation %s failed", self.child_id)

    async def _transcribe(self, stt: SpeechToText, pcm: bytes) -> str:
        """Transcribe once the session's turn is prepared (its push comes next)."""
        if (preparing := self._preparing) is not None and not preparing.done():
            # Not shielded: a cancelled transcription leaves the prepare running;
            # asyncio.wait does not raise when the prepare was cancelled (closing).
            await asyncio.wait((preparing,))
        return await stt(pcm)

    # --- sessions ending -----------------------------------------------------------

    def _session_ended(self) -> None:
        """Silence after the last answer: back to the wake word, the child lives on.

        Only the current session hears the mic, so it is the one that ended.
        """
        if self._closing is not None:
            return
        self._went_idle(self.session)
        if self._on_end is not None:
            self._on_end()

    def _went_idle(self, session: DuplexSession) -> None:
        task = asyncio.get_running_loop().create_task(
            session.aclose(), name=f"rtvoice end session {self.child_id}"
        )
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)
        timeout = self.binding.idle_timeout_s
        self._cancel_idle_timer()
        self._idle_timer = asyncio.get_running_loop().call_later(
            max(0.0, timeout), self._idle_expired
        )

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if not self.idle:
            return
        _LOGGER.debug("Duplex conversation %s idle: closing", self.child_id)
        self._start_close()
        if self._on_close is not None:
            self._on_close(self)

    def _cancel_idle_timer(self) -> None:
        timer, self._idle_timer = self._idle_timer, None
        if timer is not None:
            timer.cancel()

    # --- kernel output -------------------------------------------------------------

    def _output_delta(self, text: str) -> None:
        seq = current_round_seq()
        if seq is not None:
            self.session.output_delta(seq, text)

    def _output_end(self, seq: int) -> None:
        self.session.output_end(seq)

    def _output_pause(self, seq: int) -> None:
        self.session.output_pause(seq)

    # --- closing -------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the session and the child (hand-off); every caller awaits one close.

        Shielded: a cancelled caller stops waiting, the close still completes.
        """
        await asyncio.shield(self._start_close())

    def _start_close(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._cancel_idle_timer()
            self._closing = asyncio.get_running_loop().create_task(
                self._release(spawned=True), name=f"rtvoice close {self.child_id}"
            )
        return self._closing

    async def _release(self, *, spawned: bool) -> None:
        try:
            if (preparing := self._preparing) is not None:
                # Before ``forget``: a prepare finishing later would bring it back.
                preparing.cancel()
                await asyncio.wait((preparing,))
            if self.session.state is not SessionState.ENDED:
                await self.session.aclose()  # an ended one is in _ending already
            await wait_ended(self._ending)
        finally:
            try:
                if spawned:
                    await _quietly(self.binding.kernel.close(self.child_id))
            finally:
                self._forget()
                if self._unroute is not None:
                    self._unroute()
                channels = self.binding.kernel.channels
                channels.unregister(f"{self.child_id}/in")
                channels.unregister(f"{self.child_id}/out")
                if self._own_dsp:
                    await self.dsp.aclose()
                _LOGGER.debug("Duplex conversation %s closed", self.child_id)

    def _forget(self) -> None:
        """Run the binding's forget hook (the child has closed); never raises."""
        if self.binding.forget is None:
            return
        try:
            self.binding.forget(self.child_id)
        except Exception:
            _LOGGER.exception("Forgetting duplex conversation %s failed", self.child_id)


async def _quietly(closing: Awaitable[object]) -> None:
    try:
        await closing
    except Exception:
        _LOGGER.exception("Closing a duplex child failed")
