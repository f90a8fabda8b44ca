"""The answer-stream URL (issue 16 §2): one reader per token, its address, no logs.

A media player fetches each answer from ``/api/rtvoice/duplex_stream/<token>.wav``
(no auth header: the token is the credential). Before: a replayed GET of the URL
during the answer took the stream over from the device. Served here the way HA's
view serves it (``StreamRegistry.handle``) on 127.0.0.1, fetched with aiohttp.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
import logging

import aiohttp
from aiohttp import web
import pytest

from custom_components.rtvoice.duplex_stream import (
    STREAM_PATH,
    TOKEN_LOGGERS,
    StreamRegistry,
    TokenFilter,
    hide_tokens,
    install_token_filter,
)

pytestmark = pytest.mark.usefixtures("socket_enabled")

SAFETY = 30.0
HEADER_BYTES = 44


@contextlib.asynccontextmanager
async def served() -> AsyncIterator[StreamRegistry]:
    """Serve a ``StreamRegistry`` as HA's view does, on 127.0.0.1."""
    base: list[str] = []
    registry = StreamRegistry(lambda: base[0])

    async def handle(request: web.Request) -> web.StreamResponse:
        return await registry.handle(request, request.match_info["token"])

    app = web.Application()
    app.router.add_get(STREAM_PATH + "/{token}.wav", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]  # noqa: SLF001
    base.append(f"http://127.0.0.1:{port}")
    try:
        yield registry
    finally:
        await runner.cleanup()


async def test_a_replayed_get_does_not_take_the_stream_over() -> None:
    """The device's fetch keeps the stream; the replay gets 409 and no audio."""
    async with served() as registry, aiohttp.ClientSession() as http:
        stream = registry.open()
        async with asyncio.timeout(SAFETY):
            device = await http.get(stream.url)
            assert device.status == 200
            await device.content.readexactly(HEADER_BYTES)
            replay = await http.get(stream.url)
            assert replay.status == 409
            replay.release()
            stream.write(b"\1\2" * 100)
            stream.end()
            assert (
                await device.content.read() == b"\1\2" * 100
            )  # all of it, to the device
            device.release()
        assert stream.refused == 1
        registry.close(stream)


async def test_a_stream_bound_to_the_device_refuses_other_addresses() -> None:
    """Opened for 192.0.2.7: a GET from 127.0.0.1 gets 403; for 127.0.0.1 it plays."""
    async with served() as registry, aiohttp.ClientSession() as http:
        elsewhere = registry.open(peer="192.0.2.7")
        here = registry.open(peer="127.0.0.1")
        by_name = registry.open(peer="kitchen.local")  # a name binds nothing
        async with asyncio.timeout(SAFETY):
            response = await http.get(elsewhere.url)
            assert response.status == 403
            response.release()
            for stream in (here, by_name):
                stream.end()
                response = await http.get(stream.url)
                assert response.status == 200
                assert len(await response.read()) == HEADER_BYTES
                response.release()
        assert elsewhere.refused == 1
        assert not elsewhere.fetched.is_set()


def test_tokens_are_kept_out_of_logs(caplog: pytest.LogCaptureFixture) -> None:
    """A logged media command shows the stream URL with ``***`` for the token."""
    registry = StreamRegistry(lambda: "http://ha.local:8123")
    stream = registry.open()
    logger = logging.getLogger("tests.stream_token")
    logger.addFilter(TokenFilter())
    caplog.set_level(logging.DEBUG, "tests.stream_token")
    logger.debug("Sending MediaPlayerCommandRequest: media_url: %s", stream.url)
    assert stream.token not in caplog.text
    assert f"{STREAM_PATH}/***.wav" in caplog.text
    assert stream.token not in hide_tokens(f"url={stream.url}")


@pytest.mark.parametrize("name", TOKEN_LOGGERS)
def test_the_loggers_that_print_urls_mask_tokens(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """HA's request log, aioesphomeapi's message log: the token shows as ``***``."""
    install_token_filter()
    install_token_filter()  # set up twice (a reload): still one filter
    logger = logging.getLogger(name)
    assert sum(isinstance(f, TokenFilter) for f in logger.filters) == 1
    stream = StreamRegistry(lambda: "http://ha.local:8123").open()
    caplog.set_level(logging.DEBUG, name)
    logger.debug("Serving %s to %s (auth: %s)", stream.url, "10.0.0.9", False)
    assert stream.token not in caplog.text
    assert "10.0.0.9" in caplog.text
