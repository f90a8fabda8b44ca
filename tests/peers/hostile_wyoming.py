"""A Wyoming peer that says what it likes: raw bytes on a loopback socket.

For tests of what the integration accepts from the network (issue 16 §2). The
test gives a coroutine that gets the connection's reader and writer and writes
whatever it wants (events with any header, any length, or no event at all)::

    async def script(reader, writer):
        writer.write(header({"type": "info", "data_length": 256 * 1024**2}))
        await writer.drain()
        await until_closed(reader)

    async with HostileWyoming(script) as peer:
        peer.host, peer.port          # give these to the link or the probe
        await peer.served.wait()      # the script ended (or the connection broke)

``event_bytes`` writes an event the way the ``wyoming`` package does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
import contextlib
import json
from types import TracebackType
from typing import Any, Self

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def header(fields: dict[str, Any]) -> bytes:
    """Return one JSON header line."""
    return json.dumps(fields).encode() + b"\n"


def event_bytes(
    event_type: str, data: dict[str, Any] | None = None, payload: bytes = b""
) -> bytes:
    """Return an event as the wyoming package frames it (data after the header)."""
    fields: dict[str, Any] = {"type": event_type, "version": "1.5.4"}
    body = json.dumps(data).encode() if data else b""
    if body:
        fields["data_length"] = len(body)
    if payload:
        fields["payload_length"] = len(payload)
    return header(fields) + body + payload


async def read_event_type(reader: asyncio.StreamReader) -> str | None:
    """Read one event the integration wrote; return its type (None at EOF)."""
    line = await reader.readline()
    if not line:
        return None
    fields = json.loads(line)
    await reader.readexactly(fields.get("data_length") or 0)
    await reader.readexactly(fields.get("payload_length") or 0)
    return str(fields["type"])


async def until_closed(reader: asyncio.StreamReader) -> None:
    """Return once the integration closed the connection (reads and drops)."""
    with contextlib.suppress(ConnectionError):
        while await reader.read(65536):
            pass


class HostileWyoming:
    """A loopback TCP server that runs ``script`` on every connection."""

    def __init__(self, script: Script) -> None:
        """Not listening yet."""
        self._script = script
        self.host = "127.0.0.1"
        self.port = 0
        self.connections = 0
        self.served = asyncio.Event()  # a script ran to its end
        self.closed_by_peer = asyncio.Event()  # the integration closed a connection
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        """Listen on a free loopback port."""
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop listening and drop the connections."""
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(AttributeError):
            self._server.close_clients()
        await self._server.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        try:
            await self._script(reader, writer)
        except ConnectionError:
            self.closed_by_peer.set()
        finally:
            self.served.set()
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
