"""The lifecycle of sessions: spawn, input, output, the idle timer, close.

- A session is spawned as a kernel child on its satellite's RT channel pair (held
  while the satellite exists), else on an ad-hoc pair of its own, with the entry's
  options (prompt, context window, tool turns, carry-over: the kernel carries a
  superseded input over into the next one).
- Every session has exactly one idle timer while it lives, reset on every input and
  every ended turn; when it expires the session closes (hand-off). It is the only
  timer, and it exists only while a conversation does.
- A session is closed once: the close takes it out of every map at once and runs
  one teardown task that every caller awaits (shielded), so a cancelled caller
  never leaves a half-closed child behind.
- The output handler of every channel pair records the child's deltas on its
  session and hands them to the turn waiting for them; sensors hear of every change
  (dispatcher signal ``SIGNAL_SESSION_UPDATE``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
import logging
from typing import Any, Final

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant, callback
from homeassistant.exceptions import TemplateError
from homeassistant.helpers import template
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.helpers.event import async_call_later

from .. import compat
from ..availability import BrainAvailability
from ..brain import Brain
from ..const import (
    CONF_CARRY_OVER,
    CONF_CONTEXT_WINDOW,
    CONF_IDLE_TIMEOUT,
    CONF_MAX_ANSWER_CHARS,
    CONF_MAX_TOOL_TURNS,
    CONF_PROMPT,
    DEFAULT_CARRY_OVER,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_ANSWER_CHARS,
    DEFAULT_MAX_TOOL_TURNS,
    DOMAIN,
    SIGNAL_SESSION_UPDATE,
    STATE_CLOSED,
)
from ..errors import UnknownConversationError
from ..kernel import (
    Capability,
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    ChildStats,
    Delivery,
    Kernel,
    KernelError,
    Ticket,
)
from ..satellites.directory import SATELLITE_CHANNEL, channel_names
from ..speech import complete_sentences_end
from .routing import SessionIndex
from .session import Session, SessionInput, Turn

_LOGGER = logging.getLogger(__name__)

_ADHOC_CHANNEL: Final = ChannelDef(realtime=True)


@dataclass(frozen=True, slots=True)
class ConversationSettings:
    """The entry's settings every conversation is spawned with (both modes)."""

    context_window: int
    max_tool_turns: int
    idle_timeout: float  # seconds
    carry_over: bool
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS


class SessionLifecycle:
    """Spawn, feed, time and close the sessions of one config entry."""

    _kernel: Kernel

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        brain: Brain,
        channels: ChannelRegistry,
        index: SessionIndex,
    ) -> None:
        """Create the lifecycle; ``start`` gives it the kernel."""
        self._hass = hass
        self._entry = entry
        self._brain = brain
        self._channels = channels
        self._index = index
        self._prompt_template = ""
        self._context_window = DEFAULT_CONTEXT_WINDOW
        self._max_tool_turns = DEFAULT_MAX_TOOL_TURNS
        self._max_answer_chars = DEFAULT_MAX_ANSWER_CHARS
        self._idle_timeout = float(DEFAULT_IDLE_TIMEOUT)
        self._carry_over = DEFAULT_CARRY_OVER
        self.configure(entry.options)
        self._signal = SIGNAL_SESSION_UPDATE.format(entry.entry_id)
        self._satellite_pairs: set[str] = set()  # satellites whose pair we hold
        self._close_tasks: set[asyncio.Task[Any]] = set()
        self._shut_down = False
        self._availability = BrainAvailability(entry, brain.kind)

    def configure(self, options: Mapping[str, Any]) -> None:
        """Use the entry's options from now on (changed options need no reload).

        Prompt, context window and tool turns apply to conversations started
        after this; carry-over and the idle timeout also to running ones (a
        running idle timer keeps its deadline until the next turn re-arms it).
        """
        self._prompt_template = options.get(CONF_PROMPT) or ""
        self._context_window = int(
            options.get(CONF_CONTEXT_WINDOW, DEFAULT_CONTEXT_WINDOW)
        )
        self._max_tool_turns = int(
            options.get(CONF_MAX_TOOL_TURNS, DEFAULT_MAX_TOOL_TURNS)
        )
        self._max_answer_chars = int(
            options.get(CONF_MAX_ANSWER_CHARS, DEFAULT_MAX_ANSWER_CHARS)
        )
        self._idle_timeout = float(options.get(CONF_IDLE_TIMEOUT, DEFAULT_IDLE_TIMEOUT))
        self._carry_over = bool(options.get(CONF_CARRY_OVER, DEFAULT_CARRY_OVER))

    @property
    def settings(self) -> ConversationSettings:
        """The entry's conversation settings, as configured now."""
        return ConversationSettings(
            context_window=self._context_window,
            max_tool_turns=self._max_tool_turns,
            idle_timeout=self._idle_timeout,
            carry_over=self._carry_over,
            max_answer_chars=self._max_answer_chars,
        )

    def start(self, kernel: Kernel) -> None:
        """Run sessions on ``kernel`` (built by the runtime)."""
        self._kernel = kernel

    # ── satellites' channel pairs ─────────────────────────────────────────

    def add_satellite(self, entity_id: str) -> None:
        """Register a satellite's RT channel pair, with this output handler."""
        input_name, output_name = channel_names(entity_id)
        self._satellite_pairs.add(entity_id)
        self._channels.register_input(input_name, SATELLITE_CHANNEL)
        self._channels.register_output(
            output_name,
            partial(self._on_satellite_delta, entity_id),
            definition=SATELLITE_CHANNEL,
        )

    def remove_satellite(self, entity_id: str) -> None:
        """Unregister a vanished satellite's pair and close its conversation."""
        self._satellite_pairs.discard(entity_id)
        for name in channel_names(entity_id):
            self._channels.unregister(name)
        if (session := self._index.by_key.get(entity_id)) is not None:
            _LOGGER.debug("Satellite %s is gone; closing %s", entity_id, session.id)
            self.close(session)

    # ── spawn and close ───────────────────────────────────────────────────

    def render_prompt(self) -> str:
        """Render the configured prompt template (once per new session)."""
        if not self._prompt_template.strip():
            return ""
        try:
            return str(
                template.Template(self._prompt_template, self._hass).async_render(
                    parse_result=False
                )
            )
        except TemplateError as err:
            _LOGGER.warning("The prompt template cannot be rendered: %s", err)
            return self._prompt_template

    async def async_spawn(
        self,
        session_id: str,
        *,
        satellite: str | None,
        device_id: str | None,
        key: str | None,
        system_prompt: str,
        extra_prompt: str | None,
        adopt_new_id: bool,
        owner: str | None,
    ) -> Session:
        """Start a session (a kernel child) and index it."""
        if satellite is not None and satellite in self._satellite_pairs:
            input_channel, output_channel = channel_names(satellite)
            adhoc = False
        else:
            input_channel = f"conversation.{session_id}:in"
            output_channel = f"conversation.{session_id}:out"
            adhoc = True
        session = Session(
            id=session_id,
            satellite=satellite,
            device_id=device_id,
            key=key,
            input_channel=input_channel,
            output_channel=output_channel,
            adhoc=adhoc,
            prompt_scope=satellite or session_id,
            owner=owner,
            ids={session_id},
            adopt_new_id=adopt_new_id,
        )
        if adhoc:
            self._channels.register_input(input_channel, _ADHOC_CHANNEL)
            self._channels.register_output(
                output_channel,
                partial(self._on_delta, session),
                Capability.TEXT,
                _ADHOC_CHANNEL,
            )
        if extra_prompt:
            system_prompt = "\n\n".join(p for p in (system_prompt, extra_prompt) if p)
        try:
            await self._kernel.spawn(
                ChildOptions(
                    id=session_id,
                    input=input_channel,
                    output=output_channel,
                    system_prompt=system_prompt,
                    max_tool_turns=self._max_tool_turns,
                    max_answer_chars=self._max_answer_chars,
                    context_window=self._context_window,
                    prompt_scope=session.prompt_scope,
                    carry_over=self._carry_over,
                    delivery=_delivery(session),
                )
            )
        except KernelError:  # pragma: no cover - the pair and id were checked above
            if adhoc:
                self._channels.unregister(input_channel)
                self._channels.unregister(output_channel)
            raise
        self._index.add(session)
        self.arm_idle(session)
        _LOGGER.debug(
            "Conversation %s started (satellite=%s, channels=%s)",
            session_id,
            satellite,
            "ad-hoc" if adhoc else "satellite",
        )
        self.send_update(session)
        return session

    async def async_close(self, session: Session) -> int:
        """Close a session and wait for it; the number of messages handed off.

        Every caller awaits the same teardown; a cancelled caller stops waiting but
        the teardown still completes (it is a task of the entry).
        """
        return await asyncio.shield(self.close(session))

    def close(self, session: Session) -> asyncio.Task[int]:
        """Start the session's teardown (once) and return it.

        The session leaves every map right here, synchronously, so a turn routed
        meanwhile starts a new conversation instead of finding a closing one.
        """
        if session.close_task is not None:
            return session.close_task
        self._cancel_idle(session)
        self._index.remove(session)
        task = session.close_task = self._entry.async_create_task(
            self._hass, self._async_teardown(session), f"{DOMAIN} close {session.id}"
        )
        if not task.done():
            self._close_tasks.add(task)
            task.add_done_callback(self._close_tasks.discard)
        return task

    async def _async_teardown(self, session: Session) -> int:
        """Stop the session's child, hand off its transcript, free its pair."""
        final = self.stats(session)
        messages = await self._kernel.close(session.id)
        if session.adhoc:
            self._channels.unregister(session.input_channel)
            self._channels.unregister(session.output_channel)
        self._brain.forget(session.id)
        self._index.forget_ended(
            {*self._kernel.archived(), *self._index.sessions, *self._index.duplex}
        )
        _LOGGER.debug("Conversation %s closed (%d messages)", session.id, messages)
        async_dispatcher_send(
            self._hass,
            self._signal,
            session.satellite,
            replace(final, state=STATE_CLOSED, messages=messages),
        )
        return messages

    async def async_shutdown(self) -> None:
        """Close every session (hand-off), wait for every close, free the pairs."""
        self._shut_down = True
        for session in self._index.sessions.values():
            self._cancel_idle(session)
        sessions = list(self._index.sessions.values())
        if sessions:
            await asyncio.gather(*(self.async_close(s) for s in sessions))
        # Closes already under way (idle timer, vanished satellite).
        if self._close_tasks:
            await asyncio.wait(self._close_tasks)
        for entity_id in self._satellite_pairs:
            for name in channel_names(entity_id):
                self._channels.unregister(name)
        self._satellite_pairs.clear()

    # ── input and output ──────────────────────────────────────────────────

    def push(self, session: Session, text: str) -> Ticket:
        """Push the newest input (the kernel carries a superseded one over)."""
        if session.closing:
            raise UnknownConversationError(f"conversation {session.id!r} is closing")
        try:
            ticket = self._kernel.push(session.id, text)
        except KernelError as err:  # pragma: no cover - live sessions have a child
            raise UnknownConversationError(str(err)) from err
        ticket.outcome.add_done_callback(self._availability.round_ended)
        session.last_input = SessionInput(text=text, ticket=ticket)
        self.arm_idle(session)
        self.send_update(session)
        return ticket

    def _on_satellite_delta(self, entity_id: str, delta: str) -> None:
        """Output handler of a satellite's channel: a delta of its child."""
        if (session := self._index.by_key.get(entity_id)) is not None:
            self._on_delta(session, delta)

    def _on_delta(self, session: Session, delta: str) -> None:
        """Output handler: record the delta, acknowledge what TTS got, feed the turn."""
        if (newest := session.record_delta(delta)) is not None and (
            session.key is not None and compat.tts_streams_answers()
        ):
            heard = complete_sentences_end(newest.emitted)
            self._kernel.acknowledge(session.id, newest.ticket.seq, heard)
        if (turn := session.current_turn()) is not None:
            turn.feed.delta(delta)

    async def async_end_turn(
        self, session: Session, turn: Turn, *, cancel: bool
    ) -> None:
        """Forget the turn and let its feed finish (or cut it); the feed never lingers."""
        if session.turn is turn:
            session.turn = None
        session.turns_running -= 1
        self.arm_idle(session)
        if (err := await turn.feed.async_finish(cancel=cancel)) is not None:
            _LOGGER.warning(
                "Conversation %s: writing the chat log failed: %s",
                session.id,
                type(err).__name__,
            )

    # ── idle timer ────────────────────────────────────────────────────────

    def arm_idle(self, session: Session) -> None:
        """(Re)start the single idle timer of a live session."""
        self._cancel_idle(session)
        if session.closing or self._shut_down:
            return
        session.idle_unsub = async_call_later(
            self._hass, self._idle_timeout, partial(self._idle_expired, session)
        )

    def _cancel_idle(self, session: Session) -> None:
        if session.idle_unsub is not None:
            session.idle_unsub()
            session.idle_unsub = None

    @callback
    def _idle_expired(self, session: Session, _now: datetime) -> None:
        session.idle_unsub = None
        if session.closing:  # pragma: no cover - closing cancels the timer
            return
        if session.turns_running:
            self.arm_idle(session)  # a turn is still waiting for its round
            return
        _LOGGER.debug("Conversation %s idle: closing", session.id)
        self.close(session)

    # ── what the sensors hear ─────────────────────────────────────────────

    def stats(self, session: Session) -> ChildStats:
        """Counters of a live session."""
        stats = self._kernel.stats(session.id)
        if stats is None:  # pragma: no cover - only live sessions are asked
            return ChildStats(
                session.id, 0, 0, 0, False, 0, 0, 0, 0, state=STATE_CLOSED
            )
        return stats

    def send_update(self, session: Session) -> None:
        """Tell the sensors that a session changed."""
        self.send_stats(session.satellite, self.stats(session))

    def send_stats(self, satellite: str | None, stats: ChildStats) -> None:
        """Tell the sensors a conversation's counters (of either mode)."""
        async_dispatcher_send(self._hass, self._signal, satellite, stats)


def _delivery(session: Session) -> Delivery:
    """Return what counts as heard in a session's history (DESIGN §4.4).

    A text caller (the browser's Assist dialog, an API call) shows every delta:
    emitted text is delivered. A voice satellite hears only what its TTS spoke: on
    HA versions whose pipeline speaks the finished answer only, a cut answer was
    never heard; where TTS streams the chat log, the sentences handed to it were
    (the output handler acknowledges them).
    """
    return "acknowledged" if session.key is not None else "emitted"
