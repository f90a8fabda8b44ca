"""Routing: which session a turn belongs to (DESIGN §5.3).

A turn is found by the satellite it comes from, else by the device, else by the
conversation id.

- One session per satellite (or device): its *routing key*. A turn with a
  conversation id the session does not know is a new conversation on that
  satellite (the caller closes the old session and spawns a new one). Two
  exceptions keep a call together: the first turn after Home Assistant cancelled a
  turn of the session (a barge-in: a cancelled pipeline run never stores its chat
  session, so HA hands the next run a fresh id), and the first turn after a
  conversation was started by the control plane. The new id then becomes an alias
  of the session.
- The browser's Assist dialog learns its conversation id only when a turn ends: a
  message sent while its first turn still runs comes without one. Such id-less
  turns of one user continue that user's open dialog.
- Owners: a turn joins a live conversation only when it belongs to the turn's
  user, or the turn has no user (the satellite itself, an automation) or an
  administrator's. Any other turn that names a conversation (by id, or by a
  satellite's or device's key) gets a new conversation of its own: it never
  reads or continues someone else's, and never closes it (docs/actions.md).
- Routing locks per key (satellite, device, dialog user or id): closing a
  conversation may wait for a running device action, and that holds up only its
  own satellite.

``SessionIndex`` is the one place that knows every live session by id, by every id
it answers to and by key, and the satellite and owner of ended ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
from dataclasses import dataclass
import logging

from homeassistant.components.conversation import ChatLog, ConversationInput
from homeassistant.util.ulid import ulid_now

from .. import compat
from ..kernel import Kernel
from ..satellites.directory import SatelliteDirectory
from .session import DuplexConversationEntry, Session

_LOGGER = logging.getLogger(__name__)


class KeyLocks:
    """One lock per routing key, alive while a caller holds or waits for it."""

    def __init__(self) -> None:
        """Start with no locks."""
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


def route_key(
    user_input: ConversationInput, satellites: SatelliteDirectory
) -> tuple[str | None, str | None]:
    """Return the satellite of a turn and its routing key (None: by id only)."""
    satellite = compat.satellite_id(user_input)
    device_id = user_input.device_id
    if satellite is None and device_id:
        satellite = satellites.entity_for_device(device_id)
    return satellite, satellite or (f"device:{device_id}" if device_id else None)


def lock_key(key: str | None, user_id: str | None, chat_log: ChatLog) -> str:
    """Return the lock a turn is routed under.

    Keyless turns of one user are routed one at a time: the browser's Assist dialog
    sends a message during its first answer without an id (the pipeline then makes
    up a fresh one).
    """
    return key or (f"dialog:{user_id}" if user_id else f"id:{chat_log.conversation_id}")


@dataclass(frozen=True)
class Route:
    """Where a turn goes: a live session, or a new one after closing ``replaces``."""

    session: Session | None
    replaces: Session | None = None
    dialog_user: str | None = None  # a new session is this user's id-less dialog
    # The key's (or the id's) conversation is someone else's: the new session is
    # this user's own, bound to no satellite or device key.
    foreign: bool = False


class SessionIndex:
    """Live sessions by id, by every id they answer to and by routing key."""

    def __init__(self) -> None:
        """Start empty."""
        self.sessions: dict[str, Session] = {}  # by session id
        self.by_alias: dict[str, Session] = {}  # every id a session answers to
        self.by_key: dict[str, Session] = {}  # satellite / device key
        self.satellite_of: dict[str, str | None] = {}  # also for closed ids
        self.owner_of: dict[str, str | None] = {}  # also for closed ids
        # Duplex satellites' conversations (their links run them), by child id.
        self.duplex: dict[str, DuplexConversationEntry] = {}

    def add_duplex(self, entry: DuplexConversationEntry) -> None:
        """Index a duplex conversation its link opened."""
        self.duplex[entry.id] = entry
        self.satellite_of[entry.id] = entry.satellite
        self.owner_of[entry.id] = entry.owner

    def duplex_of(self, satellite: str) -> DuplexConversationEntry | None:
        """Return the newest duplex conversation of a satellite (entity id)."""
        found = [e for e in self.duplex.values() if e.satellite == satellite]
        return found[-1] if found else None

    def add(self, session: Session) -> None:
        """Index a spawned session under its id and key."""
        self.sessions[session.id] = session
        self.by_alias[session.id] = session
        if session.key is not None:
            self.by_key[session.key] = session
        self.satellite_of[session.id] = session.satellite
        self.owner_of[session.id] = session.owner

    def remove(self, session: Session) -> None:
        """Take a closing session out of every map (its satellite and owner stay)."""
        self.sessions.pop(session.id, None)
        for alias in session.ids:
            if self.by_alias.get(alias) is session:
                del self.by_alias[alias]
        if session.key is not None and self.by_key.get(session.key) is session:
            del self.by_key[session.key]

    def forget_ended(self, known: set[str]) -> None:
        """Forget the satellite and owner of ids that are neither live nor archived."""
        for closed_id in [i for i in self.satellite_of if i not in known]:
            del self.satellite_of[closed_id]
            self.owner_of.pop(closed_id, None)

    def add_aliases(self, session: Session, ids: set[str]) -> None:
        """Let ``session`` answer to ``ids`` too."""
        for alias in ids:
            session.ids.add(alias)
            self.by_alias[alias] = session

    def route(
        self,
        kernel: Kernel,
        key: str | None,
        wanted: set[str],
        user_id: str | None,
        *,
        admin: bool = False,
    ) -> Route:
        """Find the session of a turn, or say which one a new session replaces.

        ``wanted`` are the conversation ids the turn came with; ``admin``: the
        turn's user is an administrator (a turn without user may join any
        conversation too). Call under the turn's routing lock.
        """

        def may_join(session: Session) -> bool:
            return admin or user_id is None or session.owner == user_id

        if key is None:
            for conversation_id in wanted:
                if (session := self.by_alias.get(conversation_id)) is not None:
                    if not may_join(session):
                        _LOGGER.debug(
                            "Conversation %s is not the turn's user's: a new one",
                            session.id,
                        )
                        return Route(None, foreign=True)
                    return Route(session)
            if user_id and not any(kernel.transcript(i) for i in wanted):
                # No id we know (live or ended): a dialog without its id yet.
                if (session := self._open_dialog(user_id)) is not None:
                    session.adopt_new_id = False
                    _LOGGER.debug(
                        "Conversation %s: a message sent during its first answer",
                        session.id,
                    )
                    self.add_aliases(session, wanted)
                    return Route(session)
                return Route(None, dialog_user=user_id)
            return Route(None)
        if (session := self.by_key.get(key)) is None:
            return Route(None)
        if not may_join(session):
            _LOGGER.debug("The conversation on %s is not the turn's user's", key)
            return Route(None, foreign=True)
        if wanted & session.ids:
            return Route(session)
        if session.adopt_new_id:
            session.adopt_new_id = False
            self.add_aliases(session, wanted)
            return Route(session)
        _LOGGER.debug("New conversation on %s: closing %s", key, session.id)
        return Route(None, replaces=session)

    def _open_dialog(self, user_id: str) -> Session | None:
        """Return the user's id-less Assist dialog that a new message continues.

        Same user, same agent (this entry), no satellite or device, started by a
        turn without conversation id, and a turn of it is still being answered or
        was just cancelled by Home Assistant: the dialog cannot know its id yet.
        (The frontend of HA 2025.4 cancels the running turn when the next message
        is sent, so the cancelled turn may end before the new one arrives.) Once a
        turn of it has been answered, the dialog has its id, so an id-less turn
        then is a new dialog.
        """
        for session in self.sessions.values():
            if (
                session.dialog_user == user_id
                and (session.in_flight > 0 or session.adopt_new_id)
                and not session.closing
            ):
                return session
        return None

    def new_id(self, kernel: Kernel, proposed: str | None) -> str:
        """HA's conversation id when it is free, else a new ULID.

        An id that names a closed conversation's transcript is not free: reusing
        it would mix two conversations under one id and the next close would
        replace the first transcript (docs/how-it-works.md). HA itself replaces
        an expired conversation id too; the answer carries the new one.
        """
        if not proposed or proposed == kernel.parent_id:
            return ulid_now()
        if proposed not in self.by_alias and kernel.transcript(proposed) is None:
            return proposed
        new_id = ulid_now()
        _LOGGER.debug(
            "Conversation %s has ended (its transcript keeps the id): continuing as %s",
            proposed,
            new_id,
        )
        return new_id
