"""What a Wyoming peer may send us, and a reader that holds it to that.

The one place that says what the integration accepts from a Wyoming peer (a
satellite link, a probe of a discovered service); HA-free (pydantic and the
``wyoming`` package's ``Event``). The ``wyoming`` package's ``async_read_event``
allocates whatever a peer announces (a ``payload_length`` of 256 MB is read into
memory) and its ``Info.from_event`` trusts the shape of ``info``; here:

- ``EventHeader``: the JSON line of an event: a type, ``data_length`` and
  ``payload_length`` within ``MAX_DATA_BYTES`` / ``MAX_PAYLOAD_BYTES``; the line
  itself at most ``MAX_HEADER_BYTES`` (the stream reader's limit);
- ``AudioFormat``: the format of an ``audio-chunk``: 8–48 kHz, 1–4 bytes a sample,
  1–2 channels, whole frames (``audio_chunk``: a checked ``AudioChunk``);
- ``PeerInfo``: the part of ``info`` the integration uses (is it a satellite, its
  name and version: cleaned and truncated by ``device_text``);
- ``read_event``: one event off a ``StreamReader``, every length checked before
  anything is read; ``WyomingConnection``: a TCP connection that reads so.

Each failure is a ``WyomingProtocolError`` (a ``ValueError``): the link drops the
connection, a probe says "not a satellite". Works with wyoming 1.5.4 (HA 2025.4)
and 1.10.x (HA 2026.11): only ``Event``, ``AudioChunk`` and ``async_write_event``
are used, which both have.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated, Any, Final

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from wyoming.audio import AudioChunk
from wyoming.event import Event, async_write_event

from .device_text import device_text

MAX_HEADER_BYTES: Final = 64 * 1024  # the JSON line (type, lengths, inline data)
MAX_DATA_BYTES: Final = 1024 * 1024  # extra JSON data (a TTS server's voice list)
MAX_PAYLOAD_BYTES: Final = 256 * 1024  # binary payload: 1.3 s of 48 kHz stereo s16
MIN_RATE: Final = 8000
MAX_RATE: Final = 48000
MAX_NAME_CHARS: Final = 64


class WyomingProtocolError(ValueError):
    """A peer sent what the protocol (or our limits) does not allow."""


def _no_none(value: Any) -> Any:
    return 0 if value is None else value


_Length = Annotated[int, BeforeValidator(_no_none)]


class EventHeader(BaseModel):
    """The JSON line that starts every event."""

    model_config = ConfigDict(extra="ignore", strict=False)

    type: str = Field(min_length=1, max_length=128)
    data: dict[str, Any] | None = None
    data_length: _Length = Field(default=0, ge=0, le=MAX_DATA_BYTES)
    payload_length: _Length = Field(default=0, ge=0, le=MAX_PAYLOAD_BYTES)


class AudioFormat(BaseModel):
    """The format an ``audio-chunk`` (or ``audio-start``) claims."""

    model_config = ConfigDict(extra="ignore")

    rate: int = Field(ge=MIN_RATE, le=MAX_RATE)
    width: int = Field(ge=1, le=4)
    channels: int = Field(ge=1, le=2)


def _text(limit: int) -> BeforeValidator:
    """Validate a text field: a string (or None), cleaned and cut to ``limit``."""

    def clean(value: Any) -> str | None:
        if value is not None and not isinstance(value, str):
            raise ValueError("not a string")
        return device_text(value, limit)

    return BeforeValidator(clean)


class SatelliteInfo(BaseModel):
    """The ``satellite`` part of ``info``."""

    model_config = ConfigDict(extra="ignore")

    name: Annotated[str, _text(MAX_NAME_CHARS)] = ""
    installed: bool = False
    version: Annotated[str | None, _text(32)] = None
    area: Annotated[str | None, _text(MAX_NAME_CHARS)] = None


class PeerInfo(BaseModel):
    """The part of a peer's ``info`` the integration uses."""

    model_config = ConfigDict(extra="ignore")

    satellite: SatelliteInfo | None = None

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("info is not an object")  # noqa: TRY004 - pydantic wants ValueError
        return data

    @property
    def is_satellite(self) -> bool:
        """Return True when the peer is an installed satellite."""
        return self.satellite is not None and self.satellite.installed


def _error(what: str, err: ValidationError) -> WyomingProtocolError:
    """Return a protocol error naming the fields, never their (peer-chosen) values."""
    fields = ", ".join(
        sorted({".".join(str(part) for part in e["loc"]) or what for e in err.errors()})
    )
    return WyomingProtocolError(f"{what}: {fields}")


def peer_info(event: Event) -> PeerInfo:
    """Return the checked ``info`` of an ``info`` event."""
    try:
        return PeerInfo.model_validate(event.data)
    except ValidationError as err:
        raise _error("info", err) from None


def audio_chunk(event: Event) -> AudioChunk:
    """Return the ``AudioChunk`` of an ``audio-chunk`` event, its format checked."""
    try:
        audio_format = AudioFormat.model_validate(event.data or {})
    except ValidationError as err:
        raise _error("audio format", err) from None
    audio = event.payload or b""
    if len(audio) % (audio_format.width * audio_format.channels):
        raise WyomingProtocolError("audio: not a whole number of frames")
    return AudioChunk(
        rate=audio_format.rate,
        width=audio_format.width,
        channels=audio_format.channels,
        audio=audio,
    )


def _json(raw: bytes, what: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise WyomingProtocolError(f"{what}: not JSON") from None


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """Read one event; None at the end of the stream.

    The header line is bounded by the reader's ``limit`` (open it with
    ``limit=MAX_HEADER_BYTES``) and every length is checked before it is read, so
    one event costs at most the limits' sum. Raises ``WyomingProtocolError``.
    """
    try:
        line = await reader.readline()
    except ValueError:  # LimitOverrunError: the line is longer than the limit
        raise WyomingProtocolError("header: too long") from None
    if not line:
        return None
    if not line.endswith(b"\n"):
        return None  # the stream ended inside the header
    if len(line) > MAX_HEADER_BYTES:
        raise WyomingProtocolError("header: too long")
    try:
        header = EventHeader.model_validate(_json(line, "header"))
    except ValidationError as err:
        raise _error("header", err) from None
    data = dict(header.data or {})
    try:
        if header.data_length:
            extra = _json(await reader.readexactly(header.data_length), "data")
            if not isinstance(extra, dict):
                raise WyomingProtocolError("data: not an object")
            data.update(extra)
        payload = (
            await reader.readexactly(header.payload_length)
            if header.payload_length
            else None
        )
    except asyncio.IncompleteReadError:
        return None  # the peer went away mid-event
    return Event(type=header.type, data=data, payload=payload)


class WyomingConnection:
    """A TCP connection to a Wyoming peer that reads events with ``read_event``."""

    def __init__(self, host: str, port: int) -> None:
        """Not connected yet (``connect``)."""
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """Open the connection (the caller bounds the time)."""
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, limit=MAX_HEADER_BYTES
        )

    async def read_event(self) -> Event | None:
        """Read one bounded event; None when the peer closed the connection."""
        if self._reader is None:
            raise ConnectionError("not connected")
        return await read_event(self._reader)

    async def write_event(self, event: Event) -> None:
        """Write one event; ConnectionError once the connection failed.

        A closing transport is never written to: ``wyoming`` writes with
        ``writelines``, which in the CPython 3.13 we run does not check for a lost
        connection (python/cpython#136234) and leaves a writer registered for the
        closed socket's fd, so the next socket given that fd number never hears
        that it can write.
        """
        writer = self._writer
        if writer is None:
            raise ConnectionError("not connected")
        if writer.is_closing():
            raise ConnectionError("the connection is closing")
        await async_write_event(event, writer)

    async def disconnect(self) -> None:
        """Close the connection (idempotent)."""
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()
