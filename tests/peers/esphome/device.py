"""``EmulatedDevice``: an ESPHome voice satellite on 127.0.0.1 speaking the native API.

One TCP server (random port); every accepted connection gets its own framing
(plaintext or Noise) and ``Connection`` that answers the client's requests as the
firmware's ``APIConnection`` does. The voice assistant (``voice.VoiceAssistant``), the
speaker and the record are device-wide, so a client can drop and reconnect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
import contextlib
from dataclasses import replace
from types import TracebackType
from typing import Any, Self

from aioesphomeapi import api_pb2
import aiohttp
from google.protobuf.message import Message

from . import profiles, proto
from .actions import DeviceActions
from .config import DeviceConfig
from .connection import (
    MEDIA_IDLE,
    MEDIA_PLAYER_KEY,
    MEDIA_PLAYING,
    SWITCH_KEY_BASE,
    Connection,
    object_id,
)
from .framing import generate_psk
from .i2s import SpeakerPath
from .record import Entry, Kind, Record
from .runs import EventType, Interrupt, Run, State
from .speaker import Playback, Speaker
from .voice import VoiceAssistant


class EmulatedDevice:
    """An emulated ESPHome voice satellite; see the package docstring for usage."""

    def __init__(
        self,
        config: DeviceConfig | None = None,
        *,
        encrypted: bool = False,
        profile: str | None = None,
        **overrides: Any,
    ) -> None:
        """Configure; ``encrypted=True`` generates a Noise key unless one is given.

        ``profile`` starts from a device profile (``profiles.PROFILES``) instead of
        ``config``.
        """
        if profile is not None:
            config = profiles.profile(profile)
        config = replace(config or DeviceConfig(), **overrides)
        if encrypted and config.encryption_key is None:
            config = replace(config, encryption_key=generate_psk())
        self.config = config
        self.host = "127.0.0.1"
        self.port = 0
        self.switch_states: dict[str, bool] = dict.fromkeys(config.switches, False)
        self.media_playing = False
        self._connections: dict[int, Connection] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._accepted = 0
        self._server: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._events: Record | None = None
        self._voice: VoiceAssistant | None = None
        self.actions = DeviceActions(self)
        self.on_start: list[Callable[[], None]] = []
        """The YAML's ``voice_assistant: on_start`` automations (``actions.py``)."""
        """User-defined API actions and HA events (``actions.ProjectFirmware`` adds some)."""

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> Self:
        """Start listening on 127.0.0.1 (random port)."""
        loop = asyncio.get_running_loop()
        self._events = Record(loop)
        self._session = aiohttp.ClientSession()
        self._voice = VoiceAssistant(
            self.config, self._events, self._make_speaker, self._media_state
        )
        self._voice.on_start = self.on_start
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop serving, drop clients, cancel every task the device started."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections.values()):
            connection.abort()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._voice is not None:
            await self._voice.aclose()
        if self._server is not None:
            await self._server.wait_closed()
        if self._session is not None:
            await self._session.close()

    async def _accept(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._accepted += 1
        connection = Connection(self, self._accepted, reader, writer)
        self._connections[connection.number] = connection
        self.events.add(
            Kind.CONNECTED,
            connection=connection.number,
            peer=writer.get_extra_info("peername"),
        )
        reason = "connection lost"
        try:
            reason = await connection.serve()
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            reason = f"connection lost: {type(err).__name__}"
        finally:
            connection.closed = True
            self._connections.pop(connection.number, None)
            self.voice.client_gone(connection)
            writer.close()
            self.events.add(
                Kind.DISCONNECTED, connection=connection.number, reason=reason
            )
            self._tasks.discard(task)

    def _make_speaker(self) -> Speaker:
        assert self._session is not None
        return Speaker(self._session, self.config.speed)

    def _media_state(self, playing: bool) -> None:
        self.media_playing = playing
        self._broadcast(self._media_player_state())

    def _broadcast(self, message: Message) -> None:
        for connection in list(self._connections.values()):
            if connection.states_subscribed:
                connection.send(message)

    # -- what the device reports -----------------------------------------------

    @property
    def events(self) -> Record:
        """Everything the device saw and did, with ``loop.time()`` stamps."""
        if self._events is None:
            raise RuntimeError("device not started (use `async with`)")
        return self._events

    @property
    def voice(self) -> VoiceAssistant:
        """The voice assistant state machine."""
        if self._voice is None:
            raise RuntimeError("device not started (use `async with`)")
        return self._voice

    @property
    def noise_psk(self) -> str | None:
        """The base64 Noise key, or None for a plaintext device."""
        return self.config.encryption_key

    @property
    def connections(self) -> list[Connection]:
        """The open API connections."""
        return list(self._connections.values())

    @property
    def connection_count(self) -> int:
        """Open API connections."""
        return len(self._connections)

    @property
    def state(self) -> State:
        """Voice assistant state."""
        return self.voice.state

    @property
    def runs(self) -> list[Run]:
        """Every run the device started, oldest first."""
        return self.voice.runs

    @property
    def playbacks(self) -> list[Playback]:
        """Everything the speaker played (URLs fetched, raw API audio)."""
        return self.voice.playbacks

    @property
    def loudspeaker(self) -> SpeakerPath | None:
        """The firmware speaker path (``DeviceConfig.firmware_speaker``): what was heard."""
        return self.voice.speaker_path

    @property
    def conversation_id(self) -> str:
        """Conversation id the next run will send."""
        return self.voice.conversation_id

    def device_info(self) -> api_pb2.DeviceInfoResponse:
        """``DeviceInfoResponse`` for this configuration."""
        config = self.config
        info = api_pb2.DeviceInfoResponse(
            name=config.name,
            friendly_name=config.friendly_name,
            mac_address=config.mac_address,
            esphome_version=config.esphome_version,
            compilation_time="Jan  1 2025, 00:00:00",
            model=config.model,
            manufacturer=config.manufacturer,
            project_name=config.project_name,
            project_version=config.project_version,
            suggested_area=config.suggested_area,
            voice_assistant_feature_flags=int(config.features),
        )
        if config.legacy_device_info:  # gone from ESPHome 2026.x's DeviceInfoResponse
            info.uses_password = False
            info.legacy_voice_assistant_version = 2 if config.features else 0
        return info

    def entity_listings(self) -> list[Message]:
        """``ListEntities*Response`` for the media player and the switches."""
        listings: list[Message] = []
        if self.config.uses_media_player:
            player = proto.build(
                api_pb2.ListEntitiesMediaPlayerResponse,
                object_id="media_player",
                key=MEDIA_PLAYER_KEY,
                name="Media Player",
                unique_id=f"{self.config.name}media_playermedia_player",
                supports_pause=True,
            )
            for fmt in self.config.media_formats:
                player.supported_formats.append(
                    api_pb2.MediaPlayerSupportedFormat(
                        format=fmt.format,
                        sample_rate=fmt.sample_rate,
                        num_channels=fmt.num_channels,
                        purpose=1 if fmt.announcement else 0,
                        sample_bytes=fmt.sample_bytes,
                    )
                )
            listings.append(player)
        for index, name in enumerate(self.config.switches):
            listings.append(
                proto.build(
                    api_pb2.ListEntitiesSwitchResponse,
                    object_id=object_id(name),
                    key=SWITCH_KEY_BASE + index,
                    name=name,
                    unique_id=f"{self.config.name}switch{object_id(name)}",
                )
            )
        return listings

    def entity_states(self) -> list[Message]:
        """Return the current state of every entity."""
        states: list[Message] = []
        if self.config.uses_media_player:
            states.append(self._media_player_state())
        for index, name in enumerate(self.config.switches):
            states.append(
                api_pb2.SwitchStateResponse(
                    key=SWITCH_KEY_BASE + index, state=self.switch_states[name]
                )
            )
        return states

    def _media_player_state(self) -> api_pb2.MediaPlayerStateResponse:
        return api_pb2.MediaPlayerStateResponse(
            key=MEDIA_PLAYER_KEY,
            state=MEDIA_PLAYING if self.media_playing else MEDIA_IDLE,
            volume=1.0,
            muted=False,
        )

    # -- acting as the device --------------------------------------------------

    def set_switch(self, name: str, state: bool) -> None:
        """Change a switch on the device (a button press) and report it."""
        index = self.config.switches.index(name)
        self.set_switch_by_key(SWITCH_KEY_BASE + index, state)

    def set_switch_by_key(self, key: int, state: bool) -> None:
        """Change the switch with ``key`` and report it to state subscribers."""
        index = key - SWITCH_KEY_BASE
        if not 0 <= index < len(self.config.switches):
            self.events.add(Kind.NOTE, what=f"command for unknown key {key}")
            return
        name = self.config.switches[index]
        self.switch_states[name] = state
        self.events.add(Kind.SWITCH, key=key, name=name, state=state)
        self._broadcast(api_pb2.SwitchStateResponse(key=key, state=state))

    def wake(
        self,
        wake_word: str = "Okay Nabu",
        *,
        conversation_id: str | None = None,
        interrupt: Interrupt | str = Interrupt.FIRMWARE,
    ) -> Run | None:
        """Hear the wake word; returns the run it started (None when busy, see ``Interrupt``).

        The mic hears queued speech, then silence.
        """
        return self.voice.wake(
            wake_word, conversation_id=conversation_id, interrupt=Interrupt(interrupt)
        )

    def say(
        self,
        pcm: bytes,
        *,
        wake_word: str | None = "Okay Nabu",
        end: bool = False,
        conversation_id: str | None = None,
        interrupt: Interrupt | str = Interrupt.FIRMWARE,
    ) -> Run | None:
        """Speak ``pcm`` (16 kHz mono s16le) after a wake word: a new run streams it.

        Returns the run, or None when the wake word started none (then the words are
        lost, as they would be). ``wake_word=None`` only queues the speech for the mic
        (a run already listening, or the next one, e.g. after ``continue_conversation``).
        ``end=True`` sends ``VoiceAssistantAudio(end=True)`` after the last speech frame
        (otherwise the mic streams silence until the client's VAD ends the utterance);
        it stays in force for later runs until the next ``say``.
        """
        self.voice.end_after_speech = end
        if wake_word is None:
            self.voice.mic.queue(pcm)
            return None
        run = self.wake(wake_word, conversation_id=conversation_id, interrupt=interrupt)
        if run is not None:  # the mic captures its first frame 32 ms from now
            self.voice.mic.clear()
            self.voice.mic.queue(pcm)
        return run

    def press_button(self) -> None:
        """Press the board's button (``packages/voice.yaml`` ``on_button``: stop, then start)."""
        self.voice.press_button()

    def end_utterance(self) -> None:
        """Send ``VoiceAssistantAudio(end=True)`` now (the run continues to STT end)."""
        self.voice.end_utterance()

    def abort(self) -> None:
        """Stop the run as the firmware's ``voice_assistant.stop`` (``start=False``)."""
        self.voice.abort()

    def drop_connection(self) -> int:
        """Abort every client TCP connection; returns how many were dropped."""
        connections = list(self._connections.values())
        for connection in connections:
            self.events.add(Kind.NOTE, connection=connection.number, what="dropped")
            connection.abort()
        return len(connections)

    def request_disconnect(self) -> None:
        """Ask every client to disconnect (``DisconnectRequest``), as a rebooting device."""
        for connection in list(self._connections.values()):
            connection.send(api_pb2.DisconnectRequest())

    # -- waiting ---------------------------------------------------------------

    def mark(self) -> int:
        """Index of the next entry: pass as ``since`` to wait only for newer ones."""
        return len(self.events)

    async def wait_for(self, predicate: Any, since: int = 0) -> Entry:
        """First entry (past or future) at ``since`` or later matching ``predicate``."""
        return await self.events.wait_for(predicate, since)

    async def wait_for_event(self, event_type: int, since: int = 0) -> Entry:
        """First ``VoiceAssistantEventResponse`` of ``event_type`` at ``since`` or later."""
        return await self.events.wait_for(
            lambda e: e.kind is Kind.VOICE_EVENT and e.detail["type"] == event_type,
            since,
        )

    async def wait_for_message(self, name: str, since: int = 0) -> Entry:
        """First message named ``name`` (e.g. ``"PingRequest"``) received from a client."""
        return await self.events.wait_for(
            lambda e: e.kind is Kind.RECEIVED and e.name == name, since
        )

    async def wait_for_voice_client(self, since: int = 0) -> Entry:
        """Wait until a connection owns the voice assistant."""
        return await self.events.wait_for(
            lambda e: e.kind is Kind.VOICE_OWNER and e.detail["owner"], since
        )

    async def wait_for_state(self, state: State, since: int = 0) -> Entry:
        """Wait until the voice assistant enters ``state``."""
        return await self.events.wait_for(
            lambda e: e.kind is Kind.STATE and e.detail["state"] == state, since
        )

    async def wait_for_disconnect(self, since: int = 0) -> Entry:
        """Wait until a connection ended."""
        return await self.events.wait_for(lambda e: e.kind is Kind.DISCONNECTED, since)


__all__ = ["EmulatedDevice", "EventType", "Interrupt", "State"]
