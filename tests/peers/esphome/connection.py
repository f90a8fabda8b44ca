"""One API client connection, answered as the firmware's ``APIConnection`` does."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aioesphomeapi import api_pb2
from aioesphomeapi.core import MESSAGE_TYPE_TO_PROTO
from google.protobuf.message import Message

from . import proto
from .framing import Framing, FramingError, NoiseFraming, PlaintextFraming
from .record import Entry, Kind

if TYPE_CHECKING:
    from .device import EmulatedDevice

PROTO_TO_TYPE: dict[type[Message], int] = {
    cls: number for number, cls in MESSAGE_TYPE_TO_PROTO.items()
}
MEDIA_PLAYER_KEY = 1
SWITCH_KEY_BASE = 100
MEDIA_IDLE = 1
MEDIA_PLAYING = 2
MEDIA_COMMAND_STOP = 2


def object_id(name: str) -> str:
    """Derive an ESPHome object id from an entity name."""
    return "".join(ch if ch.isalnum() else "_" for ch in name.lower())


class Connection:
    """One API client connection, answering as ``APIConnection`` does."""

    def __init__(
        self,
        device: EmulatedDevice,
        number: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """Wrap an accepted stream as connection number ``number`` of ``device``."""
        self.number = number
        self._device = device
        self._reader = reader
        self._writer = writer
        self.framing: Framing | None = None
        self.states_subscribed = False
        self.services_subscribed = False  # gets homeassistant.event (actions.py)
        self.closed = False

    def send(self, message: Message) -> None:
        """Frame and write one message (dropped once the connection closed)."""
        if self.closed or self.framing is None or self._writer.is_closing():
            return
        msg_type = PROTO_TO_TYPE[type(message)]
        self._writer.write(self.framing.encode(msg_type, message.SerializeToString()))
        self._device.events.add(Kind.SENT, connection=self.number, message=message)

    def abort(self) -> None:
        """Drop the TCP connection without a goodbye (Wi-Fi lost, power cut)."""
        self.closed = True
        self._writer.transport.abort()

    def close(self) -> None:
        """Close the TCP connection after what was written."""
        self.closed = True
        self._writer.close()

    async def serve(self) -> str:
        """Handshake, then read and handle messages until the stream ends."""
        config = self._device.config
        if config.encryption_key is not None:
            self.framing = NoiseFraming(
                self._reader,
                self._writer,
                psk=config.encryption_key,
                name=config.name,
                mac=config.mac_address,
            )
        else:
            self.framing = PlaintextFraming(self._reader, self._writer)
        try:
            await self.framing.handshake()
        except FramingError as err:
            self._device.events.add(
                Kind.HANDSHAKE_FAILED, connection=self.number, reason=str(err)
            )
            return f"handshake failed: {err}"
        while not self.closed:
            try:
                msg_type, payload = await self.framing.read()
            except FramingError as err:
                self._device.events.add(
                    Kind.HANDSHAKE_FAILED, connection=self.number, reason=str(err)
                )
                return f"framing error: {err}"
            cls = MESSAGE_TYPE_TO_PROTO.get(msg_type)
            if cls is None:
                self._device.events.add(
                    Kind.NOTE, connection=self.number, what=f"unknown type {msg_type}"
                )
                continue
            message = cls()
            message.ParseFromString(payload)
            entry = self._device.events.add(
                Kind.RECEIVED, connection=self.number, message=message
            )
            self._handle(entry, message)
            await self._writer.drain()
        return "closed by device"

    def _handle(self, entry: Entry, message: Message) -> None:
        device = self._device
        voice = device.voice
        owner = voice.owner is self
        match message:
            case api_pb2.HelloRequest():
                device.events.add(
                    Kind.HELLO, connection=self.number, client_info=message.client_info
                )
                major, minor = device.config.api_version
                self.send(
                    api_pb2.HelloResponse(
                        api_version_major=major,
                        api_version_minor=minor,
                        server_info=(
                            f"{device.config.name} "
                            f"(esphome v{device.config.esphome_version})"
                        ),
                        name=device.config.name,
                    )
                )
            case proto.ConnectRequest():
                if device.config.answers_login:
                    self.send(proto.ConnectResponse(invalid_password=False))
            case api_pb2.DisconnectRequest():
                self.send(api_pb2.DisconnectResponse())
                self.close()
            case api_pb2.DisconnectResponse():
                self.close()
            case api_pb2.PingRequest():
                self.send(api_pb2.PingResponse())
            case api_pb2.DeviceInfoRequest():
                self.send(device.device_info())
            case api_pb2.ListEntitiesRequest():
                for listing in [*device.entity_listings(), *device.actions.listings()]:
                    self.send(listing)
                self.send(api_pb2.ListEntitiesDoneResponse())
            case api_pb2.SubscribeStatesRequest():
                self.states_subscribed = True
                for state in device.entity_states():
                    self.send(state)
            case (
                api_pb2.SubscribeHomeassistantServicesRequest()
                | api_pb2.ExecuteServiceRequest()
            ):
                device.actions.on_message(self, message)
            case api_pb2.SwitchCommandRequest():
                device.set_switch_by_key(message.key, message.state)
            case api_pb2.MediaPlayerCommandRequest():
                if message.has_media_url:
                    voice.play_media(message.media_url)
                elif message.has_command and message.command == MEDIA_COMMAND_STOP:
                    voice.stop_media()
            case api_pb2.SubscribeVoiceAssistantRequest():
                voice.subscribe(self, message.subscribe)
            case api_pb2.VoiceAssistantConfigurationRequest():
                self.send(voice.configuration(self))
            case api_pb2.VoiceAssistantResponse() if owner:
                voice.on_response(message)
            case api_pb2.VoiceAssistantEventResponse() if owner:
                data = {item.name: item.value for item in message.data}
                event = device.events.add(
                    Kind.VOICE_EVENT,
                    connection=self.number,
                    message=message,
                    type=message.event_type,
                    data=data,
                )
                voice.on_event(event, message)
            case api_pb2.VoiceAssistantAudio() if owner:
                voice.on_audio(message)
            case api_pb2.VoiceAssistantTimerEventResponse() if owner:
                voice.on_timer(message)
            case api_pb2.VoiceAssistantAnnounceRequest() if owner:
                voice.on_announce(message)
            case api_pb2.VoiceAssistantSetConfiguration() if owner:
                voice.set_configuration(message)
            case _:
                pass  # accepted and ignored, as a device does (subscriptions, time ...)
