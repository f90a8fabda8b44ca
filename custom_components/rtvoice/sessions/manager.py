"""The session manager: Home Assistant's turns and the control plane's calls.

``SessionManager`` is what the conversation entity, the control plane and the
kernel's callbacks talk to. It routes each turn under its routing lock
(``routing``), spawns and closes sessions through their lifecycle (``lifecycle``)
and answers the turn:

- ``async_converse`` prepares the brain, pushes the text (the kernel carries a
  superseded input over) and awaits the outcome of its round, shielded. If HA
  cancels the caller, the round is interrupted (tools still complete) and the
  cancellation propagates; a cancel while the turn is still being routed or
  prepared counts as a barge-in too.
- What the answer says: its parts joined as one utterance; an apology for a failed
  round; what its tools did when it was cut before saying anything; and what the
  user heard of an answer cut by the control plane (an acknowledgement).

Wiring goes one way: the runtime hands the manager the kernel it built and
registers the manager's kernel callbacks; the manager follows the satellite
directory and has the lifecycle register each satellite's channel pair with its own
output handler. HA's chat log is written by ``chat_feed``; the control plane
(actions, the control LLM API) lives in ``control``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
import contextlib
from dataclasses import replace
from functools import partial
import logging
from typing import Any

from homeassistant.components.conversation import (
    ChatLog,
    ConversationInput,
    ConversationResult,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import CALLBACK_TYPE, Context, HomeAssistant, callback
from homeassistant.util.ulid import ulid_now

from .. import compat
from ..brain import Brain
from ..chat_feed import (
    APOLOGY,
    ChatLogFeed,
    conversation_result,
    interrupted_speech,
    not_understood_result,
)
from ..const import DOMAIN, EVENT_ASK_PARENT, EVENT_CONVERSATION_CLOSED, STATE_CLOSED
from ..errors import EmptyInputError, UnknownConversationError
from ..kernel import (
    ChannelRegistry,
    ChildStats,
    Kernel,
    KernelError,
    Outcome,
    Ticket,
    ToolCall,
)
from ..satellites.directory import SatelliteDirectory
from ..turn import TurnContext
from .lifecycle import ConversationSettings, SessionLifecycle
from .routing import KeyLocks, SessionIndex, lock_key, route_key
from .session import Conversation, DuplexConversationEntry, DuplexHandle, Session, Turn

_LOGGER = logging.getLogger(__name__)

# Questions of ask_parent kept for the parent to read (the event carries only ids).
MAX_QUESTIONS = 256


class SessionManager:
    """Conversations of one config entry (DESIGN §5.3, docs/architecture.md)."""

    _kernel: Kernel

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        brain: Brain,
        channels: ChannelRegistry,
        satellites: SatelliteDirectory,
    ) -> None:
        """Create the manager; ``start`` gives it the kernel, sessions start on demand."""
        self._hass = hass
        self._entry = entry
        self._brain = brain
        self._satellites = satellites
        self._index = SessionIndex()
        self._locks = KeyLocks()
        self._lifecycle = SessionLifecycle(hass, entry, brain, channels, self._index)
        self._unsubs: list[CALLBACK_TYPE] = []
        # (conversation id, question id) -> text, oldest first, at most MAX_QUESTIONS.
        self._questions: OrderedDict[tuple[str, str], str] = OrderedDict()

    # ── wiring ────────────────────────────────────────────────────────────

    def configure(self, options: Mapping[str, Any]) -> None:
        """Use the entry's options from now on (changed options need no reload).

        Prompt, context window and tool turns apply to conversations started
        after this; carry-over and the idle timeout also to running ones (a
        running idle timer keeps its deadline until the next turn re-arms it).
        """
        self._lifecycle.configure(options)

    @property
    def settings(self) -> ConversationSettings:
        """The entry's conversation settings now (duplex bindings use them too)."""
        return self._lifecycle.settings

    def render_prompt(self) -> str:
        """Render the entry's prompt template (once per new conversation)."""
        return self._lifecycle.render_prompt()

    def start(self, kernel: Kernel) -> None:
        """Use ``kernel`` (built by the runtime) and follow the satellites.

        Call before the directory starts: it reports every satellite it finds, and
        each gets its RT channel pair, with the lifecycle's output handler.
        """
        self._kernel = kernel
        self._lifecycle.start(kernel)
        self._unsubs.append(
            self._satellites.async_add_listener(self._on_satellite_change)
        )

    @callback
    def _on_satellite_change(self, entity_id: str, present: bool) -> None:
        if present:
            self._lifecycle.add_satellite(entity_id)
        else:
            self._lifecycle.remove_satellite(entity_id)

    # ── Home Assistant's conversation agent ───────────────────────────────

    async def async_converse(
        self, user_input: ConversationInput, chat_log: ChatLog, agent_id: str
    ) -> ConversationResult:
        """Answer one turn of a conversation (the conversation entity calls this)."""
        if not user_input.text.strip():
            # Nothing to answer (an empty Assist message, a blank text input): answer
            # as HA's own agent does and start nothing.
            _LOGGER.debug("Blank input: not understood, no conversation started")
            return not_understood_result(
                language=user_input.language,
                conversation_id=self.resolve(chat_log.conversation_id),
            )
        try:
            session = await self._async_route(user_input, chat_log)
        except asyncio.CancelledError:
            # A barge-in before the push: the satellite's conversation goes on.
            _satellite, key = route_key(user_input, self._satellites)
            if key is not None and (barged := self._index.by_key.get(key)) is not None:
                barged.barged_in()
            raise
        try:
            return await self._async_answer(session, user_input, chat_log, agent_id)
        finally:
            session.in_flight -= 1

    async def _async_answer(
        self,
        session: Session,
        user_input: ConversationInput,
        chat_log: ChatLog,
        agent_id: str,
    ) -> ConversationResult:
        """Push a routed turn's words and answer it (``async_converse``)."""
        try:
            await self.async_prepare_turn(
                session.id,
                context=user_input.context,
                language=user_input.language,
                device_id=user_input.device_id,
                satellite=session.satellite,
                prompt_scope=session.prompt_scope,
            )
        except asyncio.CancelledError:
            session.barged_in()
            raise
        ticket = self._lifecycle.push(session, user_input.text)
        # Read when the round ends, before a next round can commit anything.
        round_tools: list[str] = []
        ticket.outcome.add_done_callback(
            partial(self._collect_round_tools, session, round_tools)
        )
        turn = Turn(
            ticket.seq,
            ChatLogFeed(
                self._hass,
                self._entry,
                chat_log,
                agent_id,
                f"{session.id}#{ticket.seq}",
            ),
        )
        session.turn = turn
        session.turns_running += 1
        try:
            outcome = await asyncio.shield(ticket.outcome)
        except asyncio.CancelledError:
            # HA started a new run (barge-in): cut the round; a running tool still
            # completes. Then let the cancellation propagate.
            self._caller_cancelled(session, ticket)
            await self._lifecycle.async_end_turn(session, turn, cancel=True)
            raise
        await self._lifecycle.async_end_turn(session, turn, cancel=False)
        speech = session.spoken(ticket, outcome)
        if outcome.status == "completed":
            session.adopt_new_id = False
        elif outcome.status == "failed":
            _LOGGER.debug("Conversation %s: the round failed", session.id)
            # History holds what the user was told: the apology, not the partial.
            self._kernel.record_reply(session.id, ticket.seq, APOLOGY)
        elif not speech.strip():
            # Cut (or voided) before it said anything: say what its tools did.
            speech = interrupted_speech(round_tools)
        elif outcome.status == "interrupted" and (
            (newest := session.last_input) is not None and newest.ticket is ticket
        ):
            # Cut by a stop or a control-plane input, not by HA: the pipeline
            # still speaks what it gets back, so that much of the answer is heard.
            self._kernel.acknowledge(
                session.id, ticket.seq, len(newest.emitted), final=True
            )
        return conversation_result(
            outcome,
            language=user_input.language,
            conversation_id=session.id,
            speech=speech,
            agent_reply=self._brain.agent_reply(session.id),
            chat_log=chat_log,
            agent_id=agent_id,
        )

    def _collect_round_tools(
        self, session: Session, into: list[str], future: asyncio.Future[Outcome]
    ) -> None:
        """Collect the results of the tools an interrupted round finished.

        A done callback of the round's outcome: it runs before the kernel can
        start the next round, so the round's user input and finished tool groups
        are the tail of the history. A superseded round ran nothing.
        """
        if future.cancelled() or future.result().status != "interrupted":
            return
        results: list[str] = []
        for message in reversed(self._kernel.transcript(session.id) or ()):
            if message.role == "user":
                break
            if message.role == "tool":
                results.append(message.content)
        into.extend(reversed(results))

    def _caller_cancelled(self, session: Session, ticket: Ticket) -> None:
        """HA cancelled the caller: take its input back (tools still complete)."""
        session.barged_in()
        if ticket.outcome.done():
            return  # the answer was complete already: nothing to cut
        with contextlib.suppress(KernelError):  # closing: the close settles the ticket
            if self._kernel.withdraw(session.id, ticket.seq):
                self._lifecycle.send_update(session)

    # ── routing a turn ────────────────────────────────────────────────────

    async def _async_route(
        self, user_input: ConversationInput, chat_log: ChatLog
    ) -> Session:
        """Find or start the session of a turn (a new id on a satellite closes the old)."""
        session = await self._async_find_or_spawn(user_input, chat_log)
        session.in_flight += 1  # no await since the lookup: it cannot have closed
        return session

    async def _async_find_or_spawn(
        self, user_input: ConversationInput, chat_log: ChatLog
    ) -> Session:
        satellite, key = route_key(user_input, self._satellites)
        wanted = {
            i for i in (user_input.conversation_id, chat_log.conversation_id) if i
        }
        user_id = user_input.context.user_id
        admin = False
        if user_id:
            user = await self._hass.auth.async_get_user(user_id)
            admin = user is not None and user.is_admin
        async with self._locks.hold(lock_key(key, user_id, chat_log)):
            route = self._index.route(self._kernel, key, wanted, user_id, admin=admin)
            if route.session is not None:
                return route.session
            if route.replaces is not None:
                await self._lifecycle.async_close(route.replaces)
            if route.foreign:  # someone else's: a conversation of the user's own
                satellite = key = None
            session = await self._lifecycle.async_spawn(
                self._index.new_id(self._kernel, chat_log.conversation_id),
                satellite=satellite,
                device_id=user_input.device_id,
                key=key,
                system_prompt=self._lifecycle.render_prompt(),
                extra_prompt=user_input.extra_system_prompt,
                adopt_new_id=False,
                owner=user_id,
            )
            session.dialog_user = route.dialog_user
            return session

    # ── what the control plane uses ───────────────────────────────────────

    async def async_open(
        self,
        satellite: str | None,
        system_prompt: str | None,
        language: str,
        owner: str | None = None,
        extra_prompt: str | None = None,
        *,
        context: Context | None = None,
    ) -> str:
        """Start a conversation on a known satellite (or ad hoc); its id.

        A conversation already on the satellite is closed first (hand-off). The
        first turn HA routes to the satellite continues the new conversation.
        ``extra_prompt`` is added to its system prompt (e.g. what it said first).
        ``context``: the caller's; inputs sent before the satellite's first turn
        run their tools with it (None: a context without user, the system's).
        """
        info = self._satellites.info(satellite) if satellite is not None else None
        async with self._locks.hold(satellite or f"open:{ulid_now()}"):
            if satellite is not None and (old := self._index.by_key.get(satellite)):
                await self._lifecycle.async_close(old)
            session = await self._lifecycle.async_spawn(
                ulid_now(),
                satellite=satellite,
                device_id=info.device_id if info else None,
                key=satellite,
                system_prompt=system_prompt
                if system_prompt is not None
                else self._lifecycle.render_prompt(),
                extra_prompt=extra_prompt,
                adopt_new_id=True,
                owner=owner,
            )
        await self.async_prepare_turn(
            session.id,
            context=context if context is not None else Context(),
            language=language,
            device_id=session.device_id,
            satellite=satellite,
            prompt_scope=session.prompt_scope,
        )
        return session.id

    async def async_prepare_turn(
        self,
        child_id: str,
        *,
        context: Context,
        language: str,
        device_id: str | None,
        satellite: str | None,
        prompt_scope: str | None,
    ) -> None:
        """Tell the brain about a conversation's turn and prepare it (before a push).

        The brain fetches the LLM API instance (tools, API prompt) for the turn's
        user, device and language. Duplex conversations call it at every session
        (``duplex_ha.satellite_binding``) and ``forget_turn`` when their child closes.
        """
        self._brain.set_turn(
            child_id,
            TurnContext(
                context=context,
                language=language,
                device_id=device_id,
                satellite_id=satellite,
                conversation_id=child_id,
                prompt_scope=prompt_scope,
            ),
        )
        await self._brain.async_prepare(child_id)

    async def async_act_as(self, conversation_id: str, context: Context) -> None:
        """Prepare a live conversation's tools for the caller of ``context``.

        Before a control-plane push (``rtvoice.send``, the control LLM API): the
        input's tool calls run with that caller's user, so Home Assistant's
        permission checks apply to them. The turn keeps the conversation's device,
        satellite and language. Raises ``UnknownConversationError`` when no live
        conversation has the id.
        """
        if (duplex := self._index.duplex.get(conversation_id)) is not None:
            if duplex.close_task is not None:
                raise UnknownConversationError(
                    f"no live conversation {conversation_id!r}"
                )
            child_id = duplex.id
        else:
            child_id = self._live(conversation_id).id
        await self._brain.async_prepare_as(child_id, context)

    def running_on(self, satellite: str) -> str | None:
        """Return the id of the live conversation on a satellite (None: none)."""
        session = self._index.by_key.get(satellite)
        if session is not None and not session.closing:
            return session.id
        duplex = self._index.duplex_of(satellite)
        if duplex is not None and duplex.close_task is None:
            return duplex.id
        return None

    def forget_turn(self, child_id: str) -> None:
        """Drop a closed duplex child's turn and prepared tools."""
        self._brain.forget(child_id)

    def push(self, conversation_id: str, text: str) -> Ticket:
        """Push ``text`` into a live conversation (interrupting it).

        Raises ``EmptyInputError`` for blank text (before looking at the id),
        ``UnknownConversationError`` when no live conversation has the id.
        """
        if not text.strip():
            raise EmptyInputError("the text is empty")
        if (duplex := self._index.duplex.get(conversation_id)) is not None:
            if duplex.close_task is not None:
                raise UnknownConversationError(
                    f"no live conversation {conversation_id!r}"
                )
            try:
                return self._kernel.push(duplex.id, text)
            except KernelError as err:  # its link is closing it
                raise UnknownConversationError(str(err)) from err
        return self._lifecycle.push(self._live(conversation_id), text)

    def spoken(self, conversation_id: str, ticket: Ticket, outcome: Outcome) -> str:
        """Return the spoken answer of a pushed input (its parts joined)."""
        session = self._index.sessions.get(conversation_id)
        return session.spoken(ticket, outcome) if session else outcome.text

    async def async_close(self, conversation_id: str) -> int:
        """Close a live conversation with hand-off; the number of messages handed off.

        Every caller awaits the one close; a cancelled caller stops waiting, the
        close still completes.
        """
        if (duplex := self._index.duplex.get(conversation_id)) is not None:
            if duplex.close_task is not None:
                raise UnknownConversationError(
                    f"no live conversation {conversation_id!r}"
                )
            duplex.close_task = self._entry.async_create_task(
                self._hass,
                self._async_close_duplex(duplex),
                f"{DOMAIN} close {duplex.id}",
            )
            return await asyncio.shield(duplex.close_task)
        return await self._lifecycle.async_close(self._live(conversation_id))

    async def _async_close_duplex(self, duplex: DuplexConversationEntry) -> int:
        stats = self._kernel.stats(duplex.id)
        await duplex.handle.aclose()
        return (
            duplex.messages
            if duplex.messages is not None
            else (stats.messages if stats is not None else 0)
        )

    def conversations(self) -> list[Conversation]:
        """Live conversations (both modes) with their counters, by id."""
        live = [
            Conversation(s.id, s.satellite, s.device_id, self._lifecycle.stats(s))
            for s in self._index.sessions.values()
        ]
        live.extend(
            Conversation(duplex.id, duplex.satellite, duplex.device_id, stats)
            for duplex in self._index.duplex.values()
            if duplex.close_task is None and (stats := self._kernel.stats(duplex.id))
        )
        return sorted(live, key=lambda c: c.id)

    # ── duplex satellites' conversations ──────────────────────────────────

    def attach_duplex(
        self,
        conversation_id: str,
        handle: DuplexHandle,
        *,
        satellite: str | None,
        device_id: str | None,
        owner: str | None = None,
    ) -> None:
        """Index a conversation a duplex satellite's link opened (once; an owner given later is kept).

        It is listed, sent to, stopped and read like any other; it leaves the
        index when its child closes (``on_closed``), whoever closed it.
        """
        if (known := self._index.duplex.get(conversation_id)) is not None:
            if owner is not None:  # its opener's, once it is known
                known.owner = self._index.owner_of[conversation_id] = owner
            return
        self._index.add_duplex(
            DuplexConversationEntry(
                conversation_id, satellite, device_id, owner, handle
            )
        )
        self._duplex_update(conversation_id)

    def is_duplex(self, conversation_id: str) -> bool:
        """Whether the id names a live duplex satellite's conversation."""
        return conversation_id in self._index.duplex

    def duplex_handle(self, conversation_id: str) -> DuplexHandle | None:
        """Return the handle of a live duplex conversation (None: not one)."""
        duplex = self._index.duplex.get(conversation_id)
        return duplex.handle if duplex is not None else None

    def _duplex_update(self, child_id: str) -> None:
        duplex = self._index.duplex.get(child_id)
        if duplex is not None and (stats := self._kernel.stats(child_id)):
            duplex.last_stats = stats
            self._lifecycle.send_stats(duplex.satellite, stats)

    def owner(self, conversation_id: str) -> str | None:
        """Return the user a conversation belongs to, live or archived (None: none)."""
        if (session := self._index.by_alias.get(conversation_id)) is not None:
            return session.owner
        return self._index.owner_of.get(conversation_id)

    def satellite(self, conversation_id: str) -> str | None:
        """Return the satellite of a live conversation (None: none, or not live)."""
        if (duplex := self._index.duplex.get(conversation_id)) is not None:
            return duplex.satellite
        session = self._index.by_alias.get(conversation_id)
        return session.satellite if session is not None else None

    def resolve(self, conversation_id: str) -> str:
        """Return the session id of any id a live conversation answers to."""
        if (session := self._index.by_alias.get(conversation_id)) is not None:
            return session.id
        return conversation_id

    def known_ids(self) -> list[str]:
        """Ids of live and archived conversations."""
        return sorted(
            {*self._index.sessions, *self._index.duplex, *self._kernel.archived()}
        )

    def knows(self, conversation_id: str) -> bool:
        """Whether the id names a live conversation (any of its ids) or an archive."""
        return (
            conversation_id in self._index.by_alias
            or conversation_id in self._index.duplex
            or conversation_id in self._kernel.archived()
        )

    def stats(self, satellite: str) -> ChildStats | None:
        """Counters of the live conversation of a satellite (or of that id), or None."""
        session = self._index.by_key.get(satellite) or self._index.by_alias.get(
            satellite
        )
        if session is not None:
            return self._lifecycle.stats(session)
        duplex = self._index.duplex.get(satellite) or self._index.duplex_of(satellite)
        return self._kernel.stats(duplex.id) if duplex is not None else None

    async def async_shutdown(self) -> None:
        """Close every conversation (hand-off), cancel timers, tasks and listeners."""
        while self._unsubs:
            self._unsubs.pop()()
        await self._lifecycle.async_shutdown()
        # Duplex closes under way (their links close the rest themselves).
        closing = [d.close_task for d in self._index.duplex.values() if d.close_task]
        if closing:
            await asyncio.wait(closing)
        # A safety net: no child outlives the entry, whatever happened above.
        await self._kernel.close_all()

    def _live(self, conversation_id: str) -> Session:
        session = self._index.by_alias.get(conversation_id)
        if session is None or session.closing:
            # Never name other conversations: their ids are not every caller's.
            raise UnknownConversationError(f"no live conversation {conversation_id!r}")
        return session

    # ── kernel callbacks (the runtime registers them) ─────────────────────

    def on_closed(self, child_id: str, messages: int, chars: int) -> None:
        """Fire the closed event (id and counts, never the text)."""
        if (duplex := self._index.duplex.pop(child_id, None)) is not None:
            duplex.messages = messages
            if duplex.last_stats is not None:
                self._lifecycle.send_stats(
                    duplex.satellite,
                    replace(duplex.last_stats, state=STATE_CLOSED, messages=messages),
                )
        self._hass.bus.async_fire(
            EVENT_CONVERSATION_CLOSED,
            {
                "id": child_id,
                "messages": messages,
                "chars": chars,
                "satellite": self._index.satellite_of.get(child_id),
            },
        )

    def on_ask_parent(self, child_id: str, text: str) -> None:
        """Keep the question and fire the ask-parent event (ids only, never the text).

        Home Assistant records every event's data in its database: the text (the
        model's words about what people said) is read with ``question`` instead,
        by those allowed to (``rtvoice.get_question``).
        """
        question_id = ulid_now()
        self._questions[(child_id, question_id)] = text
        while len(self._questions) > MAX_QUESTIONS:
            self._questions.popitem(last=False)
        self._hass.bus.async_fire(
            EVENT_ASK_PARENT,
            {
                "id": child_id,
                "question_id": question_id,
                "chars": len(text),
                "satellite": self._index.satellite_of.get(child_id),
            },
        )

    def question(self, conversation_id: str, question_id: str) -> str | None:
        """Return the text of an ask-parent question (None: unknown or forgotten)."""
        return self._questions.get((self.resolve(conversation_id), question_id))

    def on_state(self, child_id: str, state: str) -> None:
        """Tell the sensors that a conversation changed state."""
        if (session := self._index.sessions.get(child_id)) is not None:
            self._lifecycle.send_update(session)
        elif child_id in self._index.duplex:
            self._duplex_update(child_id)

    def on_text_pause(self, child_id: str, seq: int) -> None:
        """Kernel callback: round ``seq``'s text waits for its tool calls.

        Where HA streams the answer to TTS, the waiting turn's feed ends the text so
        far with a space, so the TTS engine's sentence splitter speaks the preamble
        ("Let me check.") now instead of after the tools return.
        """
        session = self._index.sessions.get(child_id)
        if session is None or session.key is None or not compat.tts_streams_answers():
            return
        if (turn := session.current_turn()) is not None and turn.seq == seq:
            turn.feed.pause()

    def on_tool_result(self, child_id: str, call: ToolCall, result: str) -> None:
        """Kernel callback: record a finished tool call in the waiting turn's chat log."""
        if (session := self._index.sessions.get(child_id)) is not None:
            session.record_tool_result(call, result)
