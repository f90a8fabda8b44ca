"""Answer audio for firmware without raw API audio: an HTTP stream a media player plays.

ESPHome before 2026.9 does not play ``send_voice_assistant_audio`` while the mic
streams; its media player does play a URL. For such a device each answer becomes a
media-player announcement of a live stream served by Home Assistant:

- ``AnswerStream`` holds one answer's audio until the device fetches it; the body
  is a WAV header with unknown length (data size ``0xFFFFFFFF``, what a live
  encoder writes to a pipe; ESPHome's WAV decoder reads frames until the body
  ends) and then the 16 kHz mono PCM frames *as the paced player sends them*:
  nothing is written ahead of the player's lead, so the device holds no more
  than that lead plus its own pipeline.
- ``StreamRegistry`` hands out streams under unguessable one-answer tokens and
  serves them (``handle``). The token is the credential, as for HA's TTS proxy
  (``/api/tts_proxy/{token}``, ``requires_auth = False``): a device cannot send
  HA's auth header, and a signed path would expire mid-conversation. A token
  serves one reader only: the first GET claims the stream, a later one (a
  replayed URL) gets 409 and takes nothing over; when the device's address is
  known (``open(peer=...)``, an IP address), a GET from elsewhere gets 403. The
  token is kept out of logs: aioesphomeapi's debug log of the media command
  and HA's debug log of view requests show the URL with ``***`` for it
  (``TokenFilter``).
- ``MediaStreamOutput`` is the ``AnswerOutput`` of such a device: the first frame
  of an answer opens a stream and asks the device's media player to play its URL
  (an announcement); ``send`` waits (bounded) until the device fetched it, so the
  answer does not pile up while the device connects; ``finish`` ends the body (the
  device plays out what it holds), ``stop`` ends it and stops the device's player.
  ``pause``/``resume`` keep the stream open: the body just stalls (ESPHome's
  reader waits up to 30 s for data), so a false barge-in resumes in place.
- ``DuplexStreamView`` is the Home Assistant side (``async_stream_registry``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import ipaddress
import logging
import re
import secrets
import struct
from typing import Protocol

from aiohttp import web

from homeassistant.components.http import HomeAssistantView
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers.network import get_url

_LOGGER = logging.getLogger(__name__)

STREAM_PATH = "/api/rtvoice/duplex_stream"
CONTENT_TYPE = "audio/wav"
SAMPLE_RATE = 16000
UNKNOWN_LENGTH = 0xFFFFFFFF
MAX_BUFFERED = SAMPLE_RATE * 2 * 30  # 30 s unfetched: the device is not coming
FETCH_TIMEOUT = 5.0  # seconds a first frame waits for the device's GET


def wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """Return a 44-byte WAV header (mono s16le) for a stream of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_LENGTH)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", UNKNOWN_LENGTH)
    )


class AnswerStream:
    """One answer's audio on its way to the device's HTTP fetch."""

    def __init__(self, token: str, url: str, peer: str | None = None) -> None:
        """Bind the stream to its token, the URL and the reader's address (if known)."""
        self.token = token
        self.url = url
        self.peer = peer  # only this address may fetch it (None: any)
        self.refused = 0  # GETs refused: a second reader, or the wrong address
        self.fetched = asyncio.Event()  # the device's GET arrived
        self.settled = asyncio.Event()  # fetched, or ended before that
        self.ended = False  # no more audio will be written
        self.written_bytes = 0  # PCM handed to the HTTP body
        self.dropped_bytes = 0  # PCM dropped (nobody fetched it)
        self._buffer = bytearray()
        self._changed = asyncio.Event()
        self._reader = 0  # fetches that claimed the stream: one, at most

    def write(self, pcm: bytes) -> None:
        """Queue PCM for the body (written out at once while the device reads)."""
        if self.ended:
            return
        if len(self._buffer) + len(pcm) > MAX_BUFFERED:
            self.dropped_bytes += len(pcm)
            return
        self._buffer += pcm
        self._changed.set()

    def end(self, *, drop: bool = False) -> None:
        """No more audio: the body ends after what is queued (``drop``: at once)."""
        if drop:
            self.dropped_bytes += len(self._buffer)
            self._buffer.clear()
        self.ended = True
        self.settled.set()
        self._changed.set()

    async def serve(self, request: web.BaseRequest) -> web.StreamResponse:
        """Write the body to the one fetch that claims it; refuse any other."""
        if self.peer is not None and request.remote != self.peer:
            self.refused += 1
            return web.Response(status=403)
        if self._reader:
            self.refused += 1  # a replayed URL: the device's fetch keeps the stream
            return web.Response(status=409)
        self._reader += 1
        reader = self._reader
        response = web.StreamResponse(
            headers={"Content-Type": CONTENT_TYPE, "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        self.fetched.set()
        self.settled.set()
        try:
            await response.write(wav_header())
            while reader == self._reader:
                if self._buffer:
                    data = bytes(self._buffer)
                    self._buffer.clear()
                    await response.write(data)
                    self.written_bytes += len(data)
                    continue
                if self.ended:
                    await response.write_eof()
                    break
                self._changed.clear()
                await self._changed.wait()
        except ConnectionError:
            _LOGGER.debug("The device closed the answer stream")
            self.end(drop=True)
        return response


class StreamRegistry:
    """Answer streams by token, and the handler that serves them."""

    def __init__(self, base_url: Callable[[], str]) -> None:
        """``base_url()`` is where the device reaches the server (no trailing /)."""
        self._base_url = base_url
        self._streams: dict[str, AnswerStream] = {}

    def open(self, peer: str | None = None) -> AnswerStream:
        """Return a new stream under a fresh token (``close`` it when done).

        ``peer``: the device's host; an IP address binds the stream to it (a
        host name binds nothing: the GET's address cannot be checked against it).
        """
        token = secrets.token_urlsafe(16)
        stream = AnswerStream(
            token, f"{self._base_url()}{STREAM_PATH}/{token}.wav", _address(peer)
        )
        self._streams[token] = stream
        return stream

    def close(self, stream: AnswerStream) -> None:
        """Forget ``stream``: a later fetch of its URL gets 404."""
        self._streams.pop(stream.token, None)

    def __len__(self) -> int:
        """Streams open now."""
        return len(self._streams)

    async def handle(self, request: web.BaseRequest, token: str) -> web.StreamResponse:
        """Serve the stream ``token`` names (404 when unknown or closed)."""
        stream = self._streams.get(token)
        if stream is None:
            return web.Response(status=404)
        return await stream.serve(request)


def _address(host: str | None) -> str | None:
    """Return ``host`` as a normalised IP address, or None when it is not one."""
    if host is None:
        return None
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


_TOKEN_IN_URL = re.compile(re.escape(STREAM_PATH) + r"/[A-Za-z0-9_\-]+\.wav")


def hide_tokens(text: str) -> str:
    """Return ``text`` with every answer-stream token replaced by ``***``."""
    return _TOKEN_IN_URL.sub(f"{STREAM_PATH}/***.wav", text)


class TokenFilter(logging.Filter):
    """Masks answer-stream tokens in the records of a logger it is added to."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite a record that names a stream URL; keep every record."""
        message = record.getMessage()
        if STREAM_PATH in message:
            record.msg, record.args = hide_tokens(message), None
        return True


# Loggers that may print an answer-stream URL: aioesphomeapi's debug log of every
# message it sends (the media player command carries the URL), HA's debug log of
# each view request ("Serving <path> to <address>"), aiohttp's access log.
TOKEN_LOGGERS = (
    "aioesphomeapi.connection",
    "homeassistant.helpers.http",
    "aiohttp.access",
)
_TOKEN_FILTER = TokenFilter()


def install_token_filter() -> None:
    """Mask stream tokens in ``TOKEN_LOGGERS`` (idempotent: one filter object)."""
    for name in TOKEN_LOGGERS:
        logging.getLogger(name).addFilter(_TOKEN_FILTER)


class StreamOpener(Protocol):
    """What ``MediaStreamOutput`` needs: streams with URLs the device can fetch."""

    def open(self, peer: str | None = None) -> AnswerStream:
        """Return a new stream (bound to ``peer``'s address, if one)."""

    def close(self, stream: AnswerStream) -> None:
        """Forget a stream."""


class MediaStreamOutput:
    """Answer audio as media-player announcements of live HTTP streams (one per answer).

    ``play(url)`` asks the device's media player to play a URL as an announcement;
    ``stop()`` stops that player. Both are fire-and-forget device commands.
    """

    def __init__(
        self,
        streams: StreamOpener,
        *,
        play: Callable[[str], None],
        stop: Callable[[], None],
        fetch_timeout: float = FETCH_TIMEOUT,
        peer: str | None = None,
    ) -> None:
        """Bind the stream registry and the device's media player commands.

        ``peer``: the device's host (its streams only serve that address, if an IP).
        """
        self._streams = streams
        self._peer = peer
        self._play = play
        self._stop = stop
        self._fetch_timeout = fetch_timeout
        self.stream: AnswerStream | None = None  # the answer playing now
        self.announcements = 0

    async def send(self, frame: bytes) -> None:
        """Write one frame; the first of an answer starts the announcement."""
        stream = self.stream
        if stream is None:
            stream = self.stream = self._streams.open(self._peer)
            self.announcements += 1
            self._play(stream.url)
            try:
                async with asyncio.timeout(self._fetch_timeout):
                    await stream.settled.wait()
            except TimeoutError:
                _LOGGER.warning(
                    "The satellite's media player did not fetch the answer within %s s",
                    self._fetch_timeout,
                )
            if self.stream is not stream:
                return  # stopped while the device connected
        stream.write(frame)

    def pause(self) -> None:
        """Stop feeding (the player sends no frame): the body stalls, the stream stays."""

    def resume(self) -> None:
        """Feed again: the same stream, the device plays on where it stalled."""

    def finish(self) -> None:
        """End the body (the answer played to its end): the device plays out its tail."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.end()
            self._streams.close(stream)

    def stop(self) -> None:
        """End the body now and stop the device's player (the answer was cut)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.end(drop=True)
            self._streams.close(stream)
            self._stop()

    async def aclose(self) -> None:
        """Stop whatever plays; nothing is left open."""
        self.stop()


# --------------------------------------------------------------------------- HA side

DATA_STREAMS = "rtvoice_duplex_streams"


@callback
def async_register_streams(hass: HomeAssistant) -> None:
    """Serve answer streams (once, from the integration's ``async_setup``).

    Registered when the integration is set up, as views are: a test server's
    router takes no new routes once it started (HA's own never freezes).
    """
    if DATA_STREAMS not in hass.data:
        registry = StreamRegistry(lambda: get_url(hass))
        hass.data[DATA_STREAMS] = registry
        hass.http.register_view(DuplexStreamView(registry))
        install_token_filter()


def async_stream_registry(hass: HomeAssistant) -> StreamRegistry:
    """Return the registry of answer streams (registered by ``async_setup``)."""
    async_register_streams(hass)
    registry: StreamRegistry = hass.data[DATA_STREAMS]
    return registry


class DuplexStreamView(HomeAssistantView):
    """Serves answer streams to satellites (the one-answer token is the credential)."""

    requires_auth = False
    url = STREAM_PATH + "/{token}.wav"
    name = "api:rtvoice:duplex_stream"

    def __init__(self, registry: StreamRegistry) -> None:
        """Serve ``registry``'s streams."""
        self.registry = registry

    async def get(self, request: web.Request, token: str) -> web.StreamResponse:
        """Stream the answer ``token`` names, at the pace it is spoken."""
        return await self.registry.handle(request, token)
