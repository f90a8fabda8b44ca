"""A duplex conversation: one kernel child and one ``DuplexSession``, bound together.

Transport-free (the ESPHome link and, later, the Wyoming one feed the mic and send
the frames). The child is spawned on an RT pair of its own with acknowledged
delivery and carry-over; its output handler hands every delta, with its round's seq
(``current_round_seq``), to the session; the kernel's ``on_round_end`` (routed by
``RoundEnds``) tells the session when a round's text ends. Closing the conversation
closes the session (no task left) and the child (the transcript is handed off).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import itertools
import logging

from .duplex import (
    DuplexOptions,
    DuplexSession,
    EchoCanceller,
    KernelChild,
    SendFrame,
    SessionState,
    SpeechToText,
    TextToSpeech,
    UtteranceSegmenter,
)
from .kernel import ChannelDef, ChildOptions, Kernel, current_round_seq

_LOGGER = logging.getLogger(__name__)

_COUNTER = itertools.count(1)


class RoundEnds:
    """``Kernel(on_round_end=...)``: routes each round's end to its conversation."""

    def __init__(self) -> None:
        """Start with no routes."""
        self._routes: dict[str, Callable[[int], None]] = {}

    def __call__(self, child_id: str, seq: int) -> None:
        """Forward the end of round ``seq`` of ``child_id`` (unknown: ignored)."""
        route = self._routes.get(child_id)
        if route is not None:
            route(seq)

    def add(self, child_id: str, route: Callable[[int], None]) -> Callable[[], None]:
        """Route ``child_id``'s round ends to ``route``; returns the remover."""
        self._routes[child_id] = route
        return lambda: self._routes.pop(child_id, None) and None


async def warm_segmenter() -> UtteranceSegmenter:
    """Build a warmed VAD segmenter in an executor (~0.8 s of CPU, blocking)."""
    return await asyncio.get_running_loop().run_in_executor(None, UtteranceSegmenter)


@dataclass(frozen=True, slots=True)
class DuplexBinding:
    """What duplex conversations need from the integration (one per satellite).

    ``stt``/``tts`` are bound by the adapter (HA: the pipeline's stt/tts entities).
    A kernel built without ``on_round_end=round_ends`` still works: the session then
    learns a round's end from its ticket's outcome.
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
    max_tool_turns: int = 0


class DuplexConversation:
    """One conversation over one open mic; create with ``await DuplexConversation.open``."""

    def __init__(
        self, binding: DuplexBinding, child_id: str, session: DuplexSession
    ) -> None:
        """Use ``open``; this binds already created parts."""
        self.binding = binding
        self.child_id = child_id
        self.session = session
        self._unroute: Callable[[], None] | None = None
        self._closing: asyncio.Task[None] | None = None

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
    ) -> DuplexConversation:
        """Spawn the child on a fresh RT pair and start the session.

        ``segmenter`` is warmed (``warm_segmenter``) and restarted here; a link keeps
        one per stream. ``on_end`` runs when the session ended by silence.
        """
        kernel = binding.kernel
        child_id = f"duplex:{name}:{next(_COUNTER)}"
        holder: list[DuplexSession] = []

        def on_delta(text: str) -> None:
            seq = current_round_seq()
            if holder and seq is not None:
                holder[0].output_delta(seq, text)

        channels = kernel.channels
        channels.register_input(f"{child_id}/in", ChannelDef(realtime=True))
        channels.register_output(
            f"{child_id}/out", on_delta, definition=ChannelDef(realtime=True)
        )
        segmenter.restart()
        session = DuplexSession(
            KernelChild(kernel, child_id),
            stt=binding.stt,
            tts=binding.tts,
            send=send,
            options=binding.options,
            segmenter=segmenter,
            echo=binding.echo() if binding.echo is not None else None,
            on_end=on_end,
            on_state=on_state,
        )
        holder.append(session)
        conversation = cls(binding, child_id, session)
        if binding.round_ends is not None:
            conversation._unroute = binding.round_ends.add(child_id, session.output_end)
        try:
            await kernel.spawn(
                ChildOptions(
                    id=child_id,
                    input=f"{child_id}/in",
                    output=f"{child_id}/out",
                    system_prompt=binding.system_prompt,
                    prompt_scope=binding.prompt_scope,
                    context_window=binding.context_window,
                    max_tool_turns=binding.max_tool_turns,
                    delivery="acknowledged",
                    carry_over=True,
                )
            )
        except BaseException:
            await conversation._release(spawned=False)
            raise
        _LOGGER.debug("Duplex conversation %s started", child_id)
        return conversation

    @property
    def ended(self) -> bool:
        """True once the session ended (silence) or the conversation is closing."""
        return self.session.state is SessionState.ENDED or self._closing is not None

    async def aclose(self) -> None:
        """Close the session and the child (hand-off); every caller awaits one close.

        Shielded: a cancelled caller stops waiting, the close still completes.
        """
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(
                self._release(spawned=True), name=f"rtvoice close {self.child_id}"
            )
        await asyncio.shield(self._closing)

    async def _release(self, *, spawned: bool) -> None:
        try:
            await self.session.aclose()
        finally:
            if spawned:
                await _quietly(self.binding.kernel.close(self.child_id))
            if self._unroute is not None:
                self._unroute()
            channels = self.binding.kernel.channels
            channels.unregister(f"{self.child_id}/in")
            channels.unregister(f"{self.child_id}/out")
            _LOGGER.debug("Duplex conversation %s closed", self.child_id)


async def _quietly(closing: Awaitable[object]) -> None:
    try:
        await closing
    except Exception:
        _LOGGER.exception("Closing a duplex child failed")
