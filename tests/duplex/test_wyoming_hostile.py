"""A hostile Wyoming satellite against the link (issue 16 §2): bounded memory and time.

The peer is a raw loopback socket (tests/peers/hostile_wyoming.py) that writes events
with whatever header it likes; the link is the real ``WyomingSatelliteLink``. Peak
memory is measured with tracemalloc around the hostile part; the link's idle timeout
is set far beyond the safety timeout, so a link that waits for an announced payload
instead of refusing it fails the test. Before the bounded reader: two 4 KB chunks
claiming ``rate=1`` peaked at ~130 MB, and 24 MB sent after a ``payload_length`` of
256 MB were all buffered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
import contextlib
import logging
import tracemalloc
from typing import cast

import pytest
from wyoming.audio import AudioStop

from custom_components.rtvoice.duplex_link import DuplexBinding
from custom_components.rtvoice.wyoming_link import LinkOptions, WyomingSatelliteLink
from custom_components.rtvoice.wyoming_proto import (
    MAX_DATA_BYTES,
    MAX_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    WyomingConnection,
)
from tests.duplex.conftest import epoll_loop, selector_keys_epoll_lost
from tests.peers.hostile_wyoming import (
    HostileWyoming,
    Script,
    event_bytes,
    header,
    read_event_type,
    until_closed,
)

pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY = 30.0  # a broken test fails instead of hanging; never a pass condition
MB = 1024 * 1024
GOOD = {"rate": 16000, "width": 2, "channels": 1}


@contextlib.asynccontextmanager
async def linked(
    script: Script,
) -> AsyncIterator[tuple[HostileWyoming, WyomingSatelliteLink]]:
    """Run a link against a hostile peer; no reconnect within a test."""
    async with HostileWyoming(script) as peer:
        link = WyomingSatelliteLink(
            peer.host,
            peer.port,
            cast(DuplexBinding, None),  # no wake word: no conversation opens
            satellite_wake=False,
            link_options=LinkOptions(
                reconnect_min_s=SAFETY * 10,
                reconnect_max_s=SAFETY * 10,
                idle_timeout_s=SAFETY * 10,
            ),
        )
        link.start()
        try:
            yield peer, link
        finally:
            await link.aclose()


@contextlib.contextmanager
def peak_memory() -> Iterator[list[int]]:
    """Measure the peak of traced memory inside the block (bytes, in the list)."""
    peak: list[int] = []
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


async def test_audio_in_an_unsupported_format_is_refused_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """rate=1, width 7, 9 channels, half a frame: dropped, logged once, link stays."""
    ponged = asyncio.Event()
    refused = [
        event_bytes("audio-chunk", {**GOOD, "rate": 1}, b"\0" * 4096),
        event_bytes("audio-chunk", {**GOOD, "rate": 1}, b"\0" * 4096),
        event_bytes("audio-chunk", {**GOOD, "width": 7}, b"\0" * 7 * 64),
        event_bytes("audio-chunk", {**GOOD, "channels": 9}, b"\0" * 18 * 64),
        event_bytes("audio-chunk", {**GOOD, "rate": "fast"}, b"\0" * 64),
        event_bytes("audio-chunk", GOOD, b"\0" * 1023),  # half a sample at the end
    ]

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        for event in refused:
            writer.write(event)
        writer.write(event_bytes("audio-chunk", GOOD, b"\0" * 1024))
        writer.write(event_bytes("ping", {"text": "after the audio"}))
        await writer.drain()
        while (event_type := await read_event_type(reader)) not in (None, "pong"):
            pass
        if event_type == "pong":
            ponged.set()  # every event before the ping was handled
        await until_closed(reader)

    caplog.set_level(logging.WARNING, "custom_components.rtvoice.wyoming_link")
    with peak_memory() as peak:
        async with linked(script) as (_peer, link):
            async with asyncio.timeout(SAFETY):
                await ponged.wait()
            stats = link.stats
    assert peak[0] < 4 * MB, f"peak {peak[0] / MB:.1f} MB"
    assert stats.refused_chunks == len(refused)
    assert stats.mic_chunks == 1  # the good one
    assert stats.disconnects == 0  # refused chunks are not a broken connection
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


@pytest.mark.parametrize(
    "announced",
    [
        {"type": "audio-chunk", "data": GOOD, "payload_length": 256 * MB},
        {"type": "info", "data_length": 256 * MB},
        {"type": "audio-chunk", "data": GOOD, "payload_length": MAX_PAYLOAD_BYTES + 1},
        {"type": "info", "data_length": MAX_DATA_BYTES + 1},
        {"type": "audio-chunk", "payload_length": -5},
        {"type": "x" * 1000},
    ],
    ids=[
        "payload-256MB",
        "data-256MB",
        "payload-cap+1",
        "data-cap+1",
        "negative",
        "type",
    ],
)
async def test_announced_length_beyond_the_limits_ends_the_connection(
    announced: dict[str, object],
) -> None:
    """The link drops the connection at the header, not after reading what follows."""
    chunk = b"\0" * MB

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(header(announced))
        for _ in range(24):  # 24 MB of the announced body, if the link reads it
            writer.write(chunk)
            await writer.drain()
        await until_closed(reader)

    with peak_memory() as peak:
        async with linked(script) as (peer, link):
            async with asyncio.timeout(SAFETY):
                await peer.served.wait()
            stats = link.stats
    assert peak[0] < 8 * MB, f"peak {peak[0] / MB:.1f} MB"
    assert stats.protocol_errors == 1
    assert stats.disconnects == 1


async def test_a_header_line_beyond_the_limit_ends_the_connection() -> None:
    """A header line that never ends is cut at ``MAX_HEADER_BYTES``."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(b'{"type": "info", "data": {"x": "')
        for _ in range(64):
            writer.write(b"y" * MAX_HEADER_BYTES)
            await writer.drain()
        await until_closed(reader)

    with peak_memory() as peak:
        async with linked(script) as (peer, link):
            async with asyncio.timeout(SAFETY):
                await peer.served.wait()
            stats = link.stats
    assert peak[0] < 8 * MB, f"peak {peak[0] / MB:.1f} MB"
    assert stats.disconnects == 1


async def test_a_malformed_info_ends_the_connection_cleanly() -> None:
    """An ``info`` that is not an object, or a satellite that is a string: an error."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(header({"type": "info", "data": {"satellite": "kitchen"}}))
        await writer.drain()
        await until_closed(reader)

    async with linked(script) as (peer, link):
        async with asyncio.timeout(SAFETY):
            await peer.served.wait()
        assert link.stats.protocol_errors == 1
        assert link.info is None


async def test_a_closing_connection_is_not_written_to() -> None:
    """Writes to a failed connection raise and leave the loop's selector sound.

    ``wyoming`` writes with ``writelines``, which on CPython 3.13 registers a
    writer even for a lost connection; the socket then closes with the writer
    still in the selector, and the next socket given that fd number never hears
    that it can write.
    """
    loop = epoll_loop()
    accepted: list[asyncio.StreamWriter] = []

    async def accept(
        _reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        connection = WyomingConnection("127.0.0.1", port)
        await connection.connect()
        writer = connection._writer  # noqa: SLF001
        assert writer is not None
        writer.transport.abort()  # what a failed write or read does to it
        for _ in range(3):
            with pytest.raises(ConnectionError):
                await connection.write_event(AudioStop().event())
        await connection.disconnect()
        assert selector_keys_epoll_lost(loop) == []
    finally:
        for peer in accepted:
            peer.close()
        server.close()
        await server.wait_closed()
