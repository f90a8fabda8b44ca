"""A loopback Wyoming server: one task per connection, events in, events out.

Subclasses answer ``describe`` (``_info``) and handle the other events
(``_handle``); ``Records`` keeps what they answered, awaitable by count. Stopping
the server cancels every connection task and waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import contextlib
import logging
from types import TracebackType
from typing import Self

from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info

__all__ = ["Records", "WyomingServer"]

_LOGGER = logging.getLogger(__name__)


class Records[T]:
    """Answered requests in order, awaitable by count.

    ``keep=False`` (long-running command-line servers) stores nothing.
    """

    def __init__(self, *, keep: bool) -> None:
        """Start empty; ``keep=False`` stores nothing."""
        self.items: list[T] = []
        self._keep = keep
        self._changed = asyncio.Condition()

    async def add(self, item: T) -> None:
        """Record an answered request and wake the waiters."""
        if not self._keep:
            return
        async with self._changed:
            self.items.append(item)
            self._changed.notify_all()

    async def wait_for(self, count: int) -> T:
        """Return the ``count``-th request once it was recorded."""
        if not self._keep:
            raise RuntimeError("this server does not record requests")
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.items) >= count)
            return self.items[count - 1]

    async def wait_for_match(self, match: Callable[[T], bool]) -> T:
        """Return the first request (past or future) that ``match`` accepts."""
        if not self._keep:
            raise RuntimeError("this server does not record requests")
        async with self._changed:
            await self._changed.wait_for(lambda: any(map(match, self.items)))
            return next(item for item in self.items if match(item))


class WyomingServer:
    """A loopback TCP server that reads Wyoming events per connection."""

    def __init__(self, *, host: str, port: int) -> None:
        """Prepare to listen on ``host``:``port`` (0: a free port)."""
        self.host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        """The bound port (the requested one, or the free one picked for port 0)."""
        if self._server is None:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def uri(self) -> str:
        """``tcp://host:port``, as Wyoming tools spell a server."""
        return f"tcp://{self.host}:{self.port}"

    async def start(self) -> None:
        """Start listening."""
        if self._server is None:
            self._server = await asyncio.start_server(
                self._connected, self.host, self._port
            )

    async def stop(self) -> None:
        """Stop listening and end every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop the server."""
        await self.stop()

    async def _connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if self._server is not None:  # else accepted while stopping: close it
                await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        except Exception:
            # A bug or a failed espeak-ng: the client sees the connection close
            # (as with a crashed add-on); the test sees the log.
            _LOGGER.exception("%s connection failed", type(self).__name__)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while (event := await async_read_event(reader)) is not None:
            if Describe.is_type(event.type):
                await async_write_event(self._info().event(), writer)
            else:
                await self._handle(event, writer)

    def _info(self) -> Info:
        """Return what ``describe`` answers."""
        raise NotImplementedError

    async def _handle(self, event: Event, writer: asyncio.StreamWriter) -> None:
        """Handle one event other than ``describe``."""
        raise NotImplementedError
