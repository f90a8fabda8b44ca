"""Conversations: one kernel child each, routed by satellite, device or id.

A *session* is one realtime child of the entry's kernel (its id is the conversation
id handed to Home Assistant). This module keeps routing, the lifecycle of sessions,
carry-over and the idle timer; HA's chat log is written by ``chat_feed`` and the
control plane (actions, the control LLM API) lives in ``control``.

Routing (DESIGN §5.3): a turn is found by the satellite it comes from, else by the
device, else by the conversation id.

- One session per satellite (or device). A turn with a conversation id the session
  does not know is a new conversation on that satellite: the old child is closed
  (transcript hand-off) and a new one spawned. Two exceptions keep a call together:
  the first turn after Home Assistant cancelled a turn of the session (a barge-in,
  also one that came while the turn was being routed or prepared: a cancelled
  pipeline run never stores its chat session, so HA hands the next run a fresh id),
  and the first turn after a conversation was started by the control plane. The new
  id then becomes an alias of the session.
- Routing locks per satellite (device, or id): closing a conversation may wait for a
  running device action, and that holds up only its own satellite.
- A session is closed once: the close takes it out of every map at once and runs one
  teardown task that every caller awaits (shielded), so a cancelled caller never
  leaves a half-closed child behind.
- ``async_converse`` pushes the text (with a carried-over superseded input) and
  awaits the outcome of its round, shielded. If HA cancels the caller, the round is
  interrupted (tools still complete) and the cancellation propagates.
- Every session has exactly one idle timer while it lives, reset on every turn; when
  it expires the session closes (hand-off). It is the only timer, and it exists only
  while a conversation does.

Wiring goes one way: the session manager registers the satellites' channel pairs
with its own output handler when the satellite directory reports them, and the
runtime hands it the kernel it built.

The brain's availability is logged once per change (``availability``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
import contextlib
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
import logging
from typing import Any, Final

from homeassistant.components.conversation import (
    ChatLog,
    ConversationInput,
    ConversationResult,
)
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import CALLBACK_TYPE, Context, HomeAssistant, callback
from homeassistant.exceptions import TemplateError
from homeassistant.helpers import template
from homeassistant.helpers.dispatcher import async_dispatcher_send
from homeassistant.helpers.event import async_call_later
from homeassistant.util.ulid import ulid_now

from . import compat
from .availability import BrainAvailability
from .brain import Brain
from .chat_feed import (
    APOLOGY,
    ChatLogFeed,
    conversation_result,
    interrupted_speech,
    not_understood_result,
)
from .const import (
    CONF_CARRY_OVER,
    CONF_CONTEXT_WINDOW,
    CONF_IDLE_TIMEOUT,
    CONF_MAX_TOOL_TURNS,
    CONF_PROMPT,
    DEFAULT_CARRY_OVER,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_MAX_TOOL_TURNS,
    DOMAIN,
    EVENT_ASK_PARENT,
    EVENT_CONVERSATION_CLOSED,
    SIGNAL_SESSION_UPDATE,
    STATE_CLOSED,
)
from .errors import EmptyInputError, UnknownConversationError
from .kernel import (
    Capability,
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    ChildStats,
    Delivery,
    Kernel,
    KernelError,
    Outcome,
    Ticket,
    ToolCall,
)
from .satellites import SATELLITE_CHANNEL, SatelliteDirectory, channel_names
from .speech import complete_sentences_end, join_parts
from .turn import TurnContext

_LOGGER = logging.getLogger(__name__)

_ADHOC_CHANNEL: Final = ChannelDef(realtime=True)


@dataclass
class _Input:
    """The newest input pushed into a session, for carry-over and routing of output.

    ``parts`` are the texts of its answer, one per model call: a finished tool call
    starts a new part, so the spoken answer can be joined as a person reads it.
    """

    text: str
    ticket: Ticket
    parts: list[list[str]] = field(default_factory=lambda: [[]])
    emitted: str = ""  # every delta of its round, as the kernel counts characters

    def spoken(self) -> str:
        """Return the answer so far, its parts joined as one utterance."""
        return join_parts("".join(part) for part in self.parts)


@dataclass
class _Turn:
    """One ``async_converse`` call waiting for its round, and its chat log feed."""

    seq: int
    feed: ChatLogFeed


@dataclass
class _Session:
    """One conversation = one kernel child."""

    id: str
    satellite: str | None
    device_id: str | None
    key: str | None  # satellite entity id or "device:<id>"; None = by id only
    input_channel: str
    output_channel: str
    adhoc: bool  # the channel pair was registered for this session
    prompt_scope: str  # the satellite, else the session's own id
    owner: str | None  # the HA user it belongs to (None: a satellite's, the system's)
    ids: set[str] = field(default_factory=set)  # own id + aliases HA used
    adopt_new_id: bool = False  # the next unknown id on this key continues it
    dialog_user: str | None = None  # started by an id-less turn of this user
    in_flight: int = 0  # async_converse calls routed here and not yet answered
    last_input: _Input | None = None
    turn: _Turn | None = None
    turns_running: int = 0
    idle_unsub: CALLBACK_TYPE | None = None
    close_task: asyncio.Task[int] | None = None  # set once: the one teardown

    @property
    def closing(self) -> bool:
        """Whether the session's teardown has begun (it is out of every map)."""
        return self.close_task is not None


@dataclass(frozen=True)
class Conversation:
    """A live conversation as the control plane lists it."""

    id: str
    satellite: str | None
    device_id: str | None
    stats: ChildStats


class _KeyLocks:
    """One lock per routing key, alive while a caller holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold the lock of ``key`` (cancellation while waiting is safe)."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)


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
        self._channels = channels
        self._satellites = satellites
        self._prompt_template = ""
        self._context_window = DEFAULT_CONTEXT_WINDOW
        self._max_tool_turns = DEFAULT_MAX_TOOL_TURNS
        self._idle_timeout = float(DEFAULT_IDLE_TIMEOUT)
        self._carry_over = DEFAULT_CARRY_OVER
        self.configure(entry.options)
        self._signal = SIGNAL_SESSION_UPDATE.format(entry.entry_id)
        self._sessions: dict[str, _Session] = {}  # by session id
        self._by_alias: dict[str, _Session] = {}  # every id a session answers to
        self._by_key: dict[str, _Session] = {}  # satellite / device key
        self._satellite_of: dict[str, str | None] = {}  # also for closed ids
        self._owner_of: dict[str, str | None] = {}  # also for closed ids
        self._satellite_pairs: set[str] = set()  # satellites whose pair we hold
        self._locks = _KeyLocks()
        self._close_tasks: set[asyncio.Task[Any]] = set()
        self._unsubs: list[CALLBACK_TYPE] = []
        self._shut_down = False
        self._availability = BrainAvailability(entry, brain.kind)

    # ── wiring ────────────────────────────────────────────────────────────

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
        self._idle_timeout = float(options.get(CONF_IDLE_TIMEOUT, DEFAULT_IDLE_TIMEOUT))
        self._carry_over = bool(options.get(CONF_CARRY_OVER, DEFAULT_CARRY_OVER))

    def start(self, kernel: Kernel) -> None:
        """Use ``kernel`` (built by the runtime) and follow the satellites.

        Call before the directory starts: it reports every satellite it finds, and
        each gets its RT channel pair here, with this manager's output handler.
        """
        self._kernel = kernel
        self._unsubs.append(
            self._satellites.async_add_listener(self._on_satellite_change)
        )

    @callback
    def _on_satellite_change(self, entity_id: str, present: bool) -> None:
        input_name, output_name = channel_names(entity_id)
        if present:
            self._satellite_pairs.add(entity_id)
            self._channels.register_input(input_name, SATELLITE_CHANNEL)
            self._channels.register_output(
                output_name,
                partial(self._on_satellite_delta, entity_id),
                definition=SATELLITE_CHANNEL,
            )
            return
        self._satellite_pairs.discard(entity_id)
        self._channels.unregister(input_name)
        self._channels.unregister(output_name)
        if (session := self._by_key.get(entity_id)) is not None:
            _LOGGER.debug("Satellite %s is gone; closing %s", entity_id, session.id)
            self._close(session)

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
            _satellite, key = self._route_key(user_input)
            self._barged_in(self._by_key.get(key) if key is not None else None)
            raise
        try:
            return await self._async_answer(session, user_input, chat_log, agent_id)
        finally:
            session.in_flight -= 1

    async def _async_answer(
        self,
        session: _Session,
        user_input: ConversationInput,
        chat_log: ChatLog,
        agent_id: str,
    ) -> ConversationResult:
        """Push a routed turn's words and answer it (``async_converse``)."""
        self._brain.set_turn(
            session.id,
            TurnContext(
                context=user_input.context,
                language=user_input.language,
                device_id=user_input.device_id,
                satellite_id=session.satellite,
                conversation_id=session.id,
                prompt_scope=session.prompt_scope,
            ),
        )
        try:
            await self._brain.async_prepare(session.id)
        except asyncio.CancelledError:
            self._barged_in(session)
            raise
        ticket = self._push(session, user_input.text)
        # Read when the round ends, before a next round can commit anything.
        round_tools: list[str] = []
        ticket.outcome.add_done_callback(
            partial(self._collect_round_tools, session, round_tools)
        )
        turn = _Turn(
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
            await self._async_end_turn(session, turn, cancel=True)
            raise
        await self._async_end_turn(session, turn, cancel=False)
        speech = self._spoken(session, ticket, outcome)
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

    @staticmethod
    def _spoken(session: _Session, ticket: Ticket, outcome: Outcome) -> str:
        """Return the spoken answer of a round: its parts joined, not glued."""
        newest = session.last_input
        if newest is not None and newest.ticket is ticket:
            return newest.spoken()
        return outcome.text

    def _collect_round_tools(
        self, session: _Session, into: list[str], future: asyncio.Future[Outcome]
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

    def _barged_in(self, session: _Session | None) -> None:
        """HA cancelled a turn of the session: its next unknown id continues it."""
        if session is not None and not session.closing:
            session.adopt_new_id = True

    def _caller_cancelled(self, session: _Session, ticket: Ticket) -> None:
        """HA cancelled the caller: take its input back (tools still complete)."""
        self._barged_in(session)
        if ticket.outcome.done():
            return  # the answer was complete already: nothing to cut
        with contextlib.suppress(KernelError):  # closing: the close settles the ticket
            if self._kernel.withdraw(session.id, ticket.seq):
                self._send_update(session)

    def _route_key(
        self, user_input: ConversationInput
    ) -> tuple[str | None, str | None]:
        """Return the satellite of a turn and its routing key (None: by id only)."""
        satellite = compat.satellite_id(user_input)
        device_id = user_input.device_id
        if satellite is None and device_id:
            satellite = self._satellites.entity_for_device(device_id)
        return satellite, satellite or (f"device:{device_id}" if device_id else None)

    async def _async_route(
        self, user_input: ConversationInput, chat_log: ChatLog
    ) -> _Session:
        """Find or start the session of a turn (a new id on a satellite closes the old)."""
        session = await self._async_find_or_spawn(user_input, chat_log)
        session.in_flight += 1  # no await since the lookup: it cannot have closed
        return session

    async def _async_find_or_spawn(
        self, user_input: ConversationInput, chat_log: ChatLog
    ) -> _Session:
        satellite, key = self._route_key(user_input)
        wanted = {
            i for i in (user_input.conversation_id, chat_log.conversation_id) if i
        }
        user_id = user_input.context.user_id
        # The browser's Assist dialog learns its conversation id only when a turn
        # ends: a message sent while its first turn still runs comes without one
        # (the pipeline then makes up a fresh id). Keyless turns of one user are
        # routed one at a time.
        lock_key = key or (
            f"dialog:{user_id}" if user_id else f"id:{chat_log.conversation_id}"
        )
        dialog_user: str | None = None
        async with self._locks.hold(lock_key):
            if key is None:
                for conversation_id in wanted:
                    if (session := self._by_alias.get(conversation_id)) is not None:
                        return session
                if user_id and not any(self._kernel.transcript(i) for i in wanted):
                    # No id we know (live or ended): a dialog without its id yet.
                    dialog_user = user_id
                    if (session := self._open_dialog(user_id)) is not None:
                        session.adopt_new_id = False
                        _LOGGER.debug(
                            "Conversation %s: a message sent during its first answer",
                            session.id,
                        )
                        self._add_aliases(session, wanted)
                        return session
            elif (session := self._by_key.get(key)) is not None:
                if wanted & session.ids:
                    return session
                if session.adopt_new_id:
                    session.adopt_new_id = False
                    self._add_aliases(session, wanted)
                    return session
                _LOGGER.debug("New conversation on %s: closing %s", key, session.id)
                await self._async_close(session)
            session = await self._async_spawn(
                self._new_id(chat_log.conversation_id),
                satellite=satellite,
                device_id=user_input.device_id,
                key=key,
                system_prompt=self._render_prompt(),
                extra_prompt=user_input.extra_system_prompt,
                adopt_new_id=False,
                owner=user_id,
            )
            session.dialog_user = dialog_user
            return session

    def _open_dialog(self, user_id: str) -> _Session | None:
        """Return the user's id-less Assist dialog that a new message continues.

        Same user, same agent (this entry), no satellite or device, started by a
        turn without conversation id, and a turn of it is still being answered or
        was just cancelled by Home Assistant: the dialog cannot know its id yet.
        (The frontend of HA 2025.4 cancels the running turn when the next message
        is sent, so the cancelled turn may end before the new one arrives.) Once a
        turn of it has been answered, the dialog has its id, so an id-less turn
        then is a new dialog.
        """
        for session in self._sessions.values():
            if (
                session.dialog_user == user_id
                and (session.in_flight > 0 or session.adopt_new_id)
                and not session.closing
            ):
                return session
        return None

    def _add_aliases(self, session: _Session, ids: set[str]) -> None:
        for alias in ids:
            session.ids.add(alias)
            self._by_alias[alias] = session

    def _new_id(self, proposed: str | None) -> str:
        """HA's conversation id when it is free, else a new ULID.

        An id that names a closed conversation's transcript is not free: reusing
        it would mix two conversations under one id and the next close would
        replace the first transcript (docs/how-it-works.md). HA itself replaces
        an expired conversation id too; the answer carries the new one.
        """
        if not proposed or proposed == self._kernel.parent_id:
            return ulid_now()
        if proposed not in self._by_alias and self._kernel.transcript(proposed) is None:
            return proposed
        new_id = ulid_now()
        _LOGGER.debug(
            "Conversation %s has ended (its transcript keeps the id): continuing as %s",
            proposed,
            new_id,
        )
        return new_id

    # ── what the control plane uses ───────────────────────────────────────

    async def async_open(
        self,
        satellite: str | None,
        system_prompt: str | None,
        language: str,
        owner: str | None = None,
        extra_prompt: str | None = None,
    ) -> str:
        """Start a conversation on a known satellite (or ad hoc); its id.

        A conversation already on the satellite is closed first (hand-off). The
        first turn HA routes to the satellite continues the new conversation.
        ``extra_prompt`` is added to its system prompt (e.g. what it said first).
        """
        info = self._satellites.info(satellite) if satellite is not None else None
        async with self._locks.hold(satellite or f"open:{ulid_now()}"):
            if satellite is not None and (old := self._by_key.get(satellite)):
                await self._async_close(old)
            session = await self._async_spawn(
                ulid_now(),
                satellite=satellite,
                device_id=info.device_id if info else None,
                key=satellite,
                system_prompt=system_prompt
                if system_prompt is not None
                else self._render_prompt(),
                extra_prompt=extra_prompt,
                adopt_new_id=True,
                owner=owner,
            )
        self._brain.set_turn(
            session.id,
            TurnContext(
                context=Context(),
                language=language,
                device_id=session.device_id,
                satellite_id=satellite,
                conversation_id=session.id,
                prompt_scope=session.prompt_scope,
            ),
        )
        await self._brain.async_prepare(session.id)
        return session.id

    def push(self, conversation_id: str, text: str) -> Ticket:
        """Push ``text`` into a live conversation (interrupting it).

        Raises ``EmptyInputError`` for blank text (before looking at the id),
        ``UnknownConversationError`` when no live conversation has the id.
        """
        if not text.strip():
            raise EmptyInputError("the text is empty")
        return self._push(self._live(conversation_id), text)

    def spoken(self, conversation_id: str, ticket: Ticket, outcome: Outcome) -> str:
        """Return the spoken answer of a pushed input (its parts joined)."""
        session = self._sessions.get(conversation_id)
        return self._spoken(session, ticket, outcome) if session else outcome.text

    async def async_close(self, conversation_id: str) -> int:
        """Close a live conversation with hand-off; the number of messages handed off."""
        return await self._async_close(self._live(conversation_id))

    def conversations(self) -> list[Conversation]:
        """Live conversations with their counters, by id."""
        return [
            Conversation(s.id, s.satellite, s.device_id, self._stats(s))
            for s in sorted(self._sessions.values(), key=lambda s: s.id)
        ]

    def owner(self, conversation_id: str) -> str | None:
        """Return the user a conversation belongs to, live or archived (None: none)."""
        if (session := self._by_alias.get(conversation_id)) is not None:
            return session.owner
        return self._owner_of.get(conversation_id)

    def satellite(self, conversation_id: str) -> str | None:
        """Return the satellite of a live conversation (None: none, or not live)."""
        session = self._by_alias.get(conversation_id)
        return session.satellite if session is not None else None

    def resolve(self, conversation_id: str) -> str:
        """Return the session id of any id a live conversation answers to."""
        if (session := self._by_alias.get(conversation_id)) is not None:
            return session.id
        return conversation_id

    def known_ids(self) -> list[str]:
        """Ids of live and archived conversations."""
        return sorted({*self._sessions, *self._kernel.archived()})

    def knows(self, conversation_id: str) -> bool:
        """Whether the id names a live conversation (any of its ids) or an archive."""
        return (
            conversation_id in self._by_alias
            or conversation_id in self._kernel.archived()
        )

    def stats(self, satellite: str) -> ChildStats | None:
        """Counters of the live conversation of a satellite (or of that id), or None."""
        session = self._by_key.get(satellite) or self._by_alias.get(satellite)
        return self._stats(session) if session is not None else None

    async def async_shutdown(self) -> None:
        """Close every conversation (hand-off), cancel timers, tasks and listeners."""
        self._shut_down = True
        while self._unsubs:
            self._unsubs.pop()()
        for session in self._sessions.values():
            self._cancel_idle(session)
        sessions = list(self._sessions.values())
        if sessions:
            await asyncio.gather(*(self._async_close(s) for s in sessions))
        # Closes already under way (idle timer, vanished satellite).
        if self._close_tasks:
            await asyncio.wait(self._close_tasks)
        for entity_id in self._satellite_pairs:
            for name in channel_names(entity_id):
                self._channels.unregister(name)
        self._satellite_pairs.clear()
        # A safety net: no child outlives the entry, whatever happened above.
        await self._kernel.close_all()

    # ── sessions ──────────────────────────────────────────────────────────

    def _render_prompt(self) -> str:
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

    async def _async_spawn(
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
    ) -> _Session:
        if satellite is not None and satellite in self._satellite_pairs:
            input_channel, output_channel = channel_names(satellite)
            adhoc = False
        else:
            input_channel = f"conversation.{session_id}:in"
            output_channel = f"conversation.{session_id}:out"
            adhoc = True
        session = _Session(
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
                    context_window=self._context_window,
                    prompt_scope=session.prompt_scope,
                    carry_over=self._carry_over,
                    delivery=self._delivery(session),
                )
            )
        except KernelError:  # pragma: no cover - the pair and id were checked above
            if adhoc:
                self._channels.unregister(input_channel)
                self._channels.unregister(output_channel)
            raise
        self._sessions[session_id] = session
        self._by_alias[session_id] = session
        if key is not None:
            self._by_key[key] = session
        self._satellite_of[session_id] = satellite
        self._owner_of[session_id] = owner
        self._arm_idle(session)
        _LOGGER.debug(
            "Conversation %s started (satellite=%s, channels=%s)",
            session_id,
            satellite,
            "ad-hoc" if adhoc else "satellite",
        )
        self._send_update(session)
        return session

    async def _async_close(self, session: _Session) -> int:
        """Close a session and wait for it; the number of messages handed off.

        Every caller awaits the same teardown; a cancelled caller stops waiting but
        the teardown still completes (it is a task of the entry).
        """
        return await asyncio.shield(self._close(session))

    def _close(self, session: _Session) -> asyncio.Task[int]:
        """Start the session's teardown (once) and return it.

        The session leaves every map right here, synchronously, so a turn routed
        meanwhile starts a new conversation instead of finding a closing one.
        """
        if session.close_task is not None:
            return session.close_task
        self._cancel_idle(session)
        self._sessions.pop(session.id, None)
        for alias in session.ids:
            if self._by_alias.get(alias) is session:
                del self._by_alias[alias]
        if session.key is not None and self._by_key.get(session.key) is session:
            del self._by_key[session.key]
        task = session.close_task = self._entry.async_create_task(
            self._hass, self._async_teardown(session), f"{DOMAIN} close {session.id}"
        )
        if not task.done():
            self._close_tasks.add(task)
            task.add_done_callback(self._close_tasks.discard)
        return task

    async def _async_teardown(self, session: _Session) -> int:
        """Stop the session's child, hand off its transcript, free its pair."""
        final = self._stats(session)
        messages = await self._kernel.close(session.id)
        if session.adhoc:
            self._channels.unregister(session.input_channel)
            self._channels.unregister(session.output_channel)
        self._brain.forget(session.id)
        known = {*self._kernel.archived(), *self._sessions}
        for closed_id in [i for i in self._satellite_of if i not in known]:
            del self._satellite_of[closed_id]
            self._owner_of.pop(closed_id, None)
        _LOGGER.debug("Conversation %s closed (%d messages)", session.id, messages)
        async_dispatcher_send(
            self._hass,
            self._signal,
            session.satellite,
            replace(final, state=STATE_CLOSED, messages=messages),
        )
        return messages

    def _live(self, conversation_id: str) -> _Session:
        session = self._by_alias.get(conversation_id)
        if session is None or session.closing:
            # Never name other conversations: their ids are not every caller's.
            raise UnknownConversationError(f"no live conversation {conversation_id!r}")
        return session

    # ── input ─────────────────────────────────────────────────────────────

    def _push(self, session: _Session, text: str) -> Ticket:
        """Push the newest input (the kernel carries a superseded one over)."""
        if session.closing:
            raise UnknownConversationError(f"conversation {session.id!r} is closing")
        try:
            ticket = self._kernel.push(session.id, text)
        except KernelError as err:  # pragma: no cover - live sessions have a child
            raise UnknownConversationError(str(err)) from err
        ticket.outcome.add_done_callback(self._availability.round_ended)
        session.last_input = _Input(text=text, ticket=ticket)
        self._arm_idle(session)
        self._send_update(session)
        return ticket

    # ── output ────────────────────────────────────────────────────────────

    def _on_satellite_delta(self, entity_id: str, delta: str) -> None:
        """Output handler of a satellite's channel: a delta of its child."""
        if (session := self._by_key.get(entity_id)) is not None:
            self._on_delta(session, delta)

    def _current_turn(self, session: _Session) -> _Turn | None:
        """Return the turn waiting for the round of the newest input, if any."""
        turn = session.turn
        newest = session.last_input
        if turn is None or newest is None or turn.seq != newest.ticket.seq:
            return None
        return turn

    def _delivery(self, session: _Session) -> Delivery:
        """Return what counts as heard in a session's history (DESIGN §4.4).

        A text caller (the browser's Assist dialog, an API call) shows every delta:
        emitted text is delivered. A voice satellite hears only what its TTS spoke:
        on HA versions whose pipeline speaks the finished answer only, a cut answer
        was never heard; where TTS streams the chat log, the sentences handed to it
        were (``_on_delta`` acknowledges them).
        """
        return "acknowledged" if session.key is not None else "emitted"

    def _on_delta(self, session: _Session, delta: str) -> None:
        if (newest := session.last_input) is not None:
            newest.parts[-1].append(delta)
            newest.emitted += delta
            if session.key is not None and compat.tts_streams_answers():
                heard = complete_sentences_end(newest.emitted)
                self._kernel.acknowledge(session.id, newest.ticket.seq, heard)
        if (turn := self._current_turn(session)) is not None:
            turn.feed.delta(delta)

    def on_tool_result(self, child_id: str, call: ToolCall, result: str) -> None:
        """Kernel callback: record a finished tool call in the waiting turn's chat log."""
        session = self._sessions.get(child_id)
        if session is None:
            return
        if (newest := session.last_input) is not None and newest.parts[-1]:
            newest.parts.append([])  # the text after the call is a new utterance
        if (turn := self._current_turn(session)) is not None:
            turn.feed.tool(call, result)

    async def _async_end_turn(
        self, session: _Session, turn: _Turn, *, cancel: bool
    ) -> None:
        """Forget the turn and let its feed finish (or cut it); the feed never lingers."""
        if session.turn is turn:
            session.turn = None
        session.turns_running -= 1
        self._arm_idle(session)
        if (err := await turn.feed.async_finish(cancel=cancel)) is not None:
            _LOGGER.warning(
                "Conversation %s: writing the chat log failed: %s",
                session.id,
                type(err).__name__,
            )

    # ── idle timer ────────────────────────────────────────────────────────

    def _arm_idle(self, session: _Session) -> None:
        """(Re)start the single idle timer of a live session."""
        self._cancel_idle(session)
        if session.closing or self._shut_down:
            return
        session.idle_unsub = async_call_later(
            self._hass, self._idle_timeout, partial(self._idle_expired, session)
        )

    def _cancel_idle(self, session: _Session) -> None:
        if session.idle_unsub is not None:
            session.idle_unsub()
            session.idle_unsub = None

    @callback
    def _idle_expired(self, session: _Session, _now: datetime) -> None:
        session.idle_unsub = None
        if session.closing:  # pragma: no cover - closing cancels the timer
            return
        if session.turns_running:
            self._arm_idle(session)  # a turn is still waiting for its round
            return
        _LOGGER.debug("Conversation %s idle: closing", session.id)
        self._close(session)

    # ── kernel callbacks (the runtime registers them) ─────────────────────

    def on_closed(self, child_id: str, messages: int, chars: int) -> None:
        """Fire the closed event (id and counts, never the text)."""
        self._hass.bus.async_fire(
            EVENT_CONVERSATION_CLOSED,
            {
                "id": child_id,
                "messages": messages,
                "chars": chars,
                "satellite": self._satellite_of.get(child_id),
            },
        )

    def on_ask_parent(self, child_id: str, text: str) -> None:
        """Fire the ask-parent event."""
        self._hass.bus.async_fire(
            EVENT_ASK_PARENT,
            {
                "id": child_id,
                "text": text,
                "satellite": self._satellite_of.get(child_id),
            },
        )

    def on_state(self, child_id: str, state: str) -> None:
        """Tell the sensors that a conversation changed state."""
        if (session := self._sessions.get(child_id)) is not None:
            self._send_update(session)

    def _stats(self, session: _Session) -> ChildStats:
        stats = self._kernel.stats(session.id)
        if stats is None:  # pragma: no cover - only live sessions are asked
            return ChildStats(
                session.id, 0, 0, 0, False, 0, 0, 0, 0, state=STATE_CLOSED
            )
        return stats

    def _send_update(self, session: _Session) -> None:
        async_dispatcher_send(
            self._hass, self._signal, session.satellite, self._stats(session)
        )
