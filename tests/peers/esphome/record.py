"""What the emulated device saw and did, stamped with the loop clock.

``Record`` is an append-only list of ``Entry`` objects plus event-driven waiting:
``await record.wait_for(predicate, since=n)`` returns the first entry at index ``n`` or
later that matches, whether it is already there or arrives later. No polling, no sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
import enum
from typing import Any

from google.protobuf.message import Message


class Kind(enum.StrEnum):
    """What an entry is about."""

    CONNECTED = "connected"
    """A TCP client connected (``detail["peer"]``)."""
    HANDSHAKE_FAILED = "handshake_failed"
    """The framing rejected the client (``detail["reason"]``)."""
    HELLO = "hello"
    """HelloRequest answered (``detail["client_info"]``)."""
    DISCONNECTED = "disconnected"
    """A connection ended (``detail["reason"]``)."""
    RECEIVED = "received"
    """A message from the client (``message``); mic/speaker audio included."""
    SENT = "sent"
    """A message the device sent (``message``)."""
    VOICE_EVENT = "voice_event"
    """A VoiceAssistantEventResponse (``detail["type"]``, ``detail["data"]``)."""
    VOICE_OWNER = "voice_owner"
    """A connection became (or stopped being: ``detail["owner"]`` False) the voice client."""
    STATE = "state"
    """The voice assistant changed state (``detail["state"]``)."""
    MIC_START = "mic_start"
    """The device began streaming mic audio to the client."""
    MIC_STOP = "mic_stop"
    """The device stopped streaming mic audio (``detail["frames"]``, ``detail["why"]``)."""
    PLAYBACK = "playback"
    """A speaker playback finished (``detail["playback"]``: a ``Playback``)."""
    SPEAKER_AUDIO = "speaker_audio"
    """Raw API speaker audio from the client (``detail["bytes"]``, ``["silent"]``)."""
    TIMER = "timer"
    """A timer event (``detail["timer"]``)."""
    SWITCH = "switch"
    """A switch changed state (``detail["key"]``, ``detail["state"]``)."""
    NOTE = "note"
    """Anything else worth knowing (``detail["what"]``)."""


@dataclass(frozen=True)
class Entry:
    """One thing the device saw or did."""

    index: int
    at: float
    """``loop.time()`` when it happened."""
    kind: Kind
    connection: int = 0
    """Connection number (1, 2, ... in accept order); 0 for device-wide entries."""
    message: Message | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Protobuf message name, or the kind."""
        return type(self.message).__name__ if self.message is not None else self.kind


type Predicate = Callable[[Entry], bool]

WAIT_SAFETY_S = 60.0
"""A wait on the record fails after this long (a hung test fails, CI goes on)."""


class Record:
    """Append-only record with event-driven waits."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Create an empty record stamped by ``loop``."""
        self._loop = loop
        self._entries: list[Entry] = []
        self._waiters: list[tuple[Predicate, int, asyncio.Future[Entry]]] = []

    def __len__(self) -> int:
        """Return the number of entries."""
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        """Iterate over a snapshot of the entries."""
        return iter(list(self._entries))

    def __getitem__(self, index: int) -> Entry:
        """Entry by index."""
        return self._entries[index]

    def add(
        self,
        kind: Kind,
        *,
        connection: int = 0,
        message: Message | None = None,
        **detail: Any,
    ) -> Entry:
        """Append an entry now and wake matching waiters."""
        entry = Entry(
            index=len(self._entries),
            at=self._loop.time(),
            kind=kind,
            connection=connection,
            message=message,
            detail=detail,
        )
        self._entries.append(entry)
        if self._waiters:
            still: list[tuple[Predicate, int, asyncio.Future[Entry]]] = []
            for predicate, since, future in self._waiters:
                if future.done():
                    continue
                if entry.index >= since and predicate(entry):
                    future.set_result(entry)
                else:
                    still.append((predicate, since, future))
            self._waiters = still
        return entry

    def find(self, predicate: Predicate, since: int = 0) -> Entry | None:
        """First recorded entry at ``since`` or later matching ``predicate``."""
        for entry in self._entries[since:]:
            if predicate(entry):
                return entry
        return None

    def select(self, predicate: Predicate, since: int = 0) -> list[Entry]:
        """All recorded entries at ``since`` or later matching ``predicate``."""
        return [entry for entry in self._entries[since:] if predicate(entry)]

    async def wait_for(self, predicate: Predicate, since: int = 0) -> Entry:
        """Return the first entry (past or future) at ``since`` or later that matches.

        Cancelling the caller only withdraws its wait. After ``WAIT_SAFETY_S`` the
        wait fails with the last entries: a safety net against a hung test, never a
        synchronisation.
        """
        if (found := self.find(predicate, since)) is not None:
            return found
        future: asyncio.Future[Entry] = self._loop.create_future()
        self._waiters.append((predicate, since, future))
        try:
            async with asyncio.timeout(WAIT_SAFETY_S):
                return await future
        except TimeoutError as err:
            last = ", ".join(
                f"{e.index}:{e.name}{e.detail or ''}" for e in self._entries[-12:]
            )
            raise AssertionError(
                f"nothing matched since entry {since} in {WAIT_SAFETY_S:.0f} s;"
                f" the last entries: {last}"
            ) from err
        finally:
            if not future.done():
                future.cancel()
