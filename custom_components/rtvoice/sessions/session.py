"""One conversation's state: its ids and channels, its newest input, its waiting turn.

A *session* is one realtime child of the entry's kernel (its id is the conversation
id handed to Home Assistant). This module holds what the other parts of ``sessions``
read and write about one session, and what its output does to that state: each delta
of the child's answer grows the newest input's answer, and a finished tool call
starts a new part of it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from homeassistant.core import CALLBACK_TYPE

from ..chat_feed import ChatLogFeed
from ..kernel import ChildStats, Outcome, Ticket, ToolCall
from ..speech import join_parts


@dataclass
class SessionInput:
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
class Turn:
    """One ``async_converse`` call waiting for its round, and its chat log feed."""

    seq: int
    feed: ChatLogFeed


@dataclass
class Session:
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
    last_input: SessionInput | None = None
    turn: Turn | None = None
    turns_running: int = 0
    idle_unsub: CALLBACK_TYPE | None = None
    close_task: asyncio.Task[int] | None = None  # set once: the one teardown

    @property
    def closing(self) -> bool:
        """Whether the session's teardown has begun (it is out of every map)."""
        return self.close_task is not None

    def barged_in(self) -> None:
        """HA cancelled a turn of the session: its next unknown id continues it."""
        if not self.closing:
            self.adopt_new_id = True

    def current_turn(self) -> Turn | None:
        """Return the turn waiting for the round of the newest input, if any."""
        turn = self.turn
        newest = self.last_input
        if turn is None or newest is None or turn.seq != newest.ticket.seq:
            return None
        return turn

    def spoken(self, ticket: Ticket, outcome: Outcome) -> str:
        """Return the spoken answer of a round: its parts joined, not glued."""
        newest = self.last_input
        if newest is not None and newest.ticket is ticket:
            return newest.spoken()
        return outcome.text

    def record_delta(self, delta: str) -> SessionInput | None:
        """Grow the newest input's answer by a delta of the child; return that input."""
        if (newest := self.last_input) is not None:
            newest.parts[-1].append(delta)
            newest.emitted += delta
        return newest

    def record_tool_result(self, call: ToolCall, result: str) -> None:
        """Start a new part after a finished tool call; the waiting turn records it."""
        if (newest := self.last_input) is not None and newest.parts[-1]:
            newest.parts.append([])  # the text after the call is a new utterance
        if (turn := self.current_turn()) is not None:
            turn.feed.tool(call, result)


@dataclass(frozen=True)
class Conversation:
    """A live conversation as the control plane lists it."""

    id: str
    satellite: str | None
    device_id: str | None
    stats: ChildStats


class DuplexHandle(Protocol):
    """What a duplex satellite's manager lets the sessions do to one conversation."""

    @property
    def live(self) -> bool:
        """Whether a session listens now (an answer is spoken on the satellite)."""

    async def aclose(self) -> None:
        """Close the conversation through its link (hand-off), once."""

    def continue_next_start(self) -> bool:
        """Let the satellite's next ``start_conversation`` continue this conversation.

        False when the satellite cannot start a conversation (nothing changes).
        """


@dataclass
class DuplexConversationEntry:
    """A duplex satellite's conversation: its link runs it, the index knows it.

    Its kernel child is spawned by the link (``duplex_link``); the sessions only
    list it, push into it, close it (``handle``) and read its counters.
    """

    id: str  # the kernel child's id
    satellite: str | None  # the satellite's entity id
    device_id: str | None
    owner: str | None
    handle: DuplexHandle
    last_stats: ChildStats | None = None
    close_task: asyncio.Task[int] | None = None  # set once: a stop's one close
    messages: int | None = None  # handed off at the close
