r"""Device side of the ESPHome native API framing: plaintext and Noise.

A ``Framing`` owns one TCP stream after it was accepted: ``handshake()`` (Noise only),
then ``read()`` -> ``(message type, payload)`` and ``encode(type, payload)`` -> bytes to
write. Mismatches behave as ESPHome firmware does, so the real ``aioesphomeapi`` client
raises the same errors it raises against a real device:

- a plaintext device that receives a Noise hello (indicator ``0x01``) writes the raw bytes
  ``b"\x00Bad indicator byte"`` and closes -> ``EncryptionPlaintextAPIError``;
- a Noise device that receives a plaintext frame (indicator ``0x00``) sends the explicit
  handshake reject ``[0x01, "Bad indicator byte"]`` -> ``RequiresEncryptionAPIError``;
- a Noise handshake with the wrong PSK is rejected with ``"Handshake MAC failure"``
  -> ``InvalidEncryptionKeyAPIError``.

Each of these raises ``FramingError`` here after the reply was written; the caller closes
the connection.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import secrets
from typing import Protocol

from cryptography.exceptions import InvalidTag
from noise.connection import NoiseConnection

NOISE_PROTOCOL = b"Noise_NNpsk0_25519_ChaChaPoly_SHA256"
NOISE_PROLOGUE = b"NoiseAPIInit\x00\x00"
PLAINTEXT_REJECT = b"\x00Bad indicator byte"
HANDSHAKE_MAX_LEN = 128
"""Firmware limit for a frame before the Noise handshake finished."""


class FramingError(Exception):
    """The stream violated the framing; the device already answered as firmware does."""


class Framing(Protocol):
    """One connection's framing."""

    async def handshake(self) -> None:
        """Complete the transport handshake (no-op for plaintext)."""

    async def read(self) -> tuple[int, bytes]:
        """Read one message: (type, protobuf payload)."""

    def encode(self, msg_type: int, payload: bytes) -> bytes:
        """Frame one message for writing."""


def varint(value: int) -> bytes:
    """Encode an unsigned protobuf varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


async def _read_varint(reader: asyncio.StreamReader) -> int:
    result = 0
    shift = 0
    while True:
        byte = (await reader.readexactly(1))[0]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result
        shift += 7
        if shift > 35:
            raise FramingError("varint too long")


def generate_psk() -> str:
    """Return a fresh base64 32-byte key, as ``api: encryption: key:`` holds."""
    return base64.b64encode(secrets.token_bytes(32)).decode()


class PlaintextFraming:
    """``0x00``, varint length, varint type, payload."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Wrap an accepted stream."""
        self._reader = reader
        self._writer = writer

    async def handshake(self) -> None:
        """Plaintext has no handshake."""

    async def read(self) -> tuple[int, bytes]:
        """Read one frame."""
        indicator = (await self._reader.readexactly(1))[0]
        if indicator != 0x00:
            self._writer.write(PLAINTEXT_REJECT)
            await self._writer.drain()
            raise FramingError(f"Bad indicator byte {indicator}")
        length = await _read_varint(self._reader)
        msg_type = await _read_varint(self._reader)
        payload = await self._reader.readexactly(length) if length else b""
        return msg_type, payload

    def encode(self, msg_type: int, payload: bytes) -> bytes:
        """Frame one message."""
        return b"\x00" + varint(len(payload)) + varint(msg_type) + payload


class NoiseFraming:
    """``Noise_NNpsk0_25519_ChaChaPoly_SHA256`` as the firmware's responder."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        psk: str,
        name: str,
        mac: str,
    ) -> None:
        """Wrap an accepted stream; ``psk`` is the base64 key."""
        self._reader = reader
        self._writer = writer
        self._name = name
        self._mac = mac
        try:
            key = binascii.a2b_base64(psk)
        except binascii.Error as err:
            raise ValueError("noise PSK must be base64") from err
        if len(key) != 32:
            raise ValueError("noise PSK must decode to 32 bytes")
        self._noise = NoiseConnection.from_name(NOISE_PROTOCOL)
        self._noise.set_as_responder()
        self._noise.set_psks(key)
        self._noise.set_prologue(NOISE_PROLOGUE)
        self._ready = False

    async def _read_frame(self) -> bytes:
        header = await self._reader.readexactly(3)
        if header[0] != 0x01:
            await self._reject("Bad indicator byte")
            raise FramingError(f"Bad indicator byte {header[0]}")
        size = (header[1] << 8) | header[2]
        if not self._ready and size > HANDSHAKE_MAX_LEN:
            await self._reject("Bad handshake packet len")
            raise FramingError(f"Bad packet len for handshake: {size}")
        return await self._reader.readexactly(size) if size else b""

    def _frame(self, data: bytes) -> bytes:
        return bytes((0x01, (len(data) >> 8) & 0xFF, len(data) & 0xFF)) + data

    async def _reject(self, reason: str) -> None:
        self._writer.write(self._frame(b"\x01" + reason.encode()))
        await self._writer.drain()

    async def handshake(self) -> None:
        """Client hello, server hello, then the NNpsk0 exchange."""
        await self._read_frame()  # client hello: contents ignored, as firmware does
        self._writer.write(
            self._frame(
                b"\x01" + self._name.encode() + b"\x00" + self._mac.encode() + b"\x00"
            )
        )
        await self._writer.drain()
        self._noise.start_handshake()
        message = await self._read_frame()
        if not message:
            await self._reject("Empty handshake message")
            raise FramingError("Empty handshake message")
        if message[0] != 0x00:
            await self._reject("Bad handshake error byte")
            raise FramingError("Bad handshake error byte")
        try:
            self._noise.read_message(message[1:])
        except InvalidTag as err:
            await self._reject("Handshake MAC failure")
            raise FramingError("Handshake MAC failure") from err
        except Exception as err:
            await self._reject("Handshake error")
            raise FramingError("Handshake error") from err
        self._writer.write(self._frame(b"\x00" + bytes(self._noise.write_message())))
        await self._writer.drain()
        self._ready = True

    async def read(self) -> tuple[int, bytes]:
        """Read and decrypt one data frame."""
        frame = await self._read_frame()
        try:
            message = bytes(self._noise.decrypt(frame))
        except Exception as err:
            raise FramingError("Decryption failed") from err
        if len(message) < 4:
            raise FramingError("Bad data packet: too short")
        msg_type = (message[0] << 8) | message[1]
        length = (message[2] << 8) | message[3]
        return msg_type, message[4 : 4 + length]

    def encode(self, msg_type: int, payload: bytes) -> bytes:
        """Encrypt and frame one message."""
        header = bytes(
            (
                (msg_type >> 8) & 0xFF,
                msg_type & 0xFF,
                (len(payload) >> 8) & 0xFF,
                len(payload) & 0xFF,
            )
        )
        return self._frame(bytes(self._noise.encrypt(header + payload)))
