"""User-defined API actions and Home Assistant events of the emulated firmware.

As ESPHome 2026.10.0 does it (the C++ in the pinned ``esphome`` wheel):

- each ``api: actions:`` entry is listed during ``ListEntitiesRequest`` as a
  ``ListEntitiesServicesResponse`` (``api/user_services.cpp``:
  ``UserServiceStatic::encode_list_service_response_``), its key the 32-bit FNV-1
  hash of its name (``core/helpers.cpp``: ``fnv1_hash``; the generated
  ``main.cpp`` passes it to ``api::UserServiceTrigger``);
- an ``ExecuteServiceRequest`` runs every action whose key matches, from any
  client: there is no owner check (``api_connection.cpp``:
  ``APIConnection::on_execute_service_request``);
- ``homeassistant.event`` sends a ``HomeassistantActionRequest`` (29.x:
  ``HomeassistantServiceResponse``) with ``is_event`` set to every client that
  sent ``SubscribeHomeassistantServicesRequest``
  (``APIConnection::on_subscribe_homeassistant_services_request`` sets
  ``service_call_subscription``; ``APIServer::send_homeassistant_action`` in
  ``api_server.cpp`` loops over the clients, and logs "dropped" when none did).

``ProjectFirmware`` is this project's firmware on top of that: the actions and
scripts of ``firmware/packages/base.yaml`` and ``voice.yaml`` as written
(``on_wake_word``, ``on_button``, ``end_run``; ``rtvoice_duplex``,
``rtvoice_stop_speaker``, ``rtvoice_silence_speaker``, ``rtvoice_unmute_speaker``,
``start_listening``, ``stop_listening``; ``on_start``: ``speaker.mute_off``).
``legacy=True`` is the firmware before the silence and unmute actions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
import enum
from typing import TYPE_CHECKING, Any

from aioesphomeapi import api_pb2

from . import proto
from .record import Kind
from .runs import Interrupt, Run, State

if TYPE_CHECKING:
    from .connection import Connection
    from .device import EmulatedDevice


class ArgType(enum.IntEnum):
    """``ServiceArgType`` (``api.proto``)."""

    BOOL = 0
    INT = 1
    FLOAT = 2
    STRING = 3


_ARG_FIELDS = {
    ArgType.BOOL: "bool_",
    ArgType.INT: "int_",
    ArgType.FLOAT: "float_",
    ArgType.STRING: "string_",
}


def fnv1_hash(name: str) -> int:
    """ESPHome's ``fnv1_hash`` (``core/helpers.cpp``): the key of an action."""
    value = 2166136261
    for byte in name.encode():
        value = (value * 16777619) & 0xFFFFFFFF
        value ^= byte
    return value


@dataclass
class Action:
    """One ``api: actions:`` entry: its name, arguments and what it does."""

    name: str
    run: Callable[[dict[str, Any]], None]
    args: tuple[tuple[str, ArgType], ...] = ()

    @property
    def key(self) -> int:
        """The key clients call it by."""
        return fnv1_hash(self.name)


@dataclass(frozen=True)
class ActionCall:
    """An executed action: when, by which connection, with what arguments."""

    at: float
    name: str
    connection: int
    data: dict[str, Any] = field(default_factory=dict)


class DeviceActions:
    """The device's user-defined actions and its Home Assistant events."""

    def __init__(self, device: EmulatedDevice) -> None:
        """Serve ``device``'s connections (none registered until ``add``)."""
        self._device = device
        self.actions: dict[int, Action] = {}
        self.calls: list[ActionCall] = []

    def add(self, action: Action) -> None:
        """Offer ``action`` (listed from the next ``ListEntitiesRequest`` on)."""
        self.actions[action.key] = action

    def listings(self) -> list[Any]:
        """``ListEntitiesServicesResponse`` of every action."""
        return [
            api_pb2.ListEntitiesServicesResponse(
                name=action.name,
                key=action.key,
                args=[
                    api_pb2.ListEntitiesServicesArgument(name=name, type=int(kind))
                    for name, kind in action.args
                ],
            )
            for action in self.actions.values()
        ]

    def on_message(self, connection: Connection, message: Any) -> None:
        """Handle ``SubscribeHomeassistantServicesRequest`` / ``ExecuteServiceRequest``."""
        if isinstance(message, api_pb2.SubscribeHomeassistantServicesRequest):
            connection.services_subscribed = True
        else:
            self.execute(connection, message)

    def execute(self, connection: Connection, message: Any) -> None:
        """Run the action ``message`` names (``ExecuteServiceRequest``), if any."""
        action = self.actions.get(message.key)
        if action is None:
            self._device.events.add(
                Kind.NOTE, connection=connection.number, what="unknown action"
            )
            return
        data = {
            name: getattr(arg, _ARG_FIELDS[kind])
            for (name, kind), arg in zip(action.args, message.args, strict=False)
        }
        self.calls.append(
            ActionCall(
                asyncio.get_running_loop().time(),
                action.name,
                connection.number,
                data,
            )
        )
        self._device.events.add(
            Kind.NOTE,
            connection=connection.number,
            what=f"action {action.name}",
            data=data,
        )
        action.run(data)

    def fire_event(self, event: str, data: dict[str, str] | None = None) -> int:
        """Send ``homeassistant.event`` to the subscribed clients; how many got it."""
        message = proto.HomeassistantAction(service=event, is_event=True)
        for key, value in (data or {}).items():
            message.data.append(api_pb2.HomeassistantServiceMap(key=key, value=value))
        sent = 0
        for connection in self._device.connections:
            if connection.services_subscribed:
                connection.send(message)
                sent += 1
        if not sent:
            self._device.events.add(Kind.NOTE, what=f"event {event} dropped")
        return sent


# Names in firmware/packages/*.yaml.
EVENT_BARGE_IN = "esphome.rtvoice_barge_in"
EVENT_START = "esphome.rtvoice_start"
STOP_WORD = "Stop"


class ProjectFirmware:
    """``firmware/packages`` on the emulated device: its actions and its scripts.

    Install on a started device (``ProjectFirmware(device)``); then drive it with
    ``wake_word``, ``stop_word`` and ``button`` instead of ``device.wake``.
    ``duplex`` is the YAML's ``rtvoice_duplex`` global: set by the action of the
    same name, cleared by ``on_client_disconnected`` (the voice assistant's client
    went: modelled as "the owner is no longer the one it was set under").
    """

    def __init__(self, device: EmulatedDevice, *, legacy: bool = False) -> None:
        """Register the firmware's actions on ``device`` (``legacy``: no silence)."""
        self._device = device
        self._duplex = False
        self._duplex_owner: object = None
        self._scripts: set[asyncio.Task[None]] = set()
        actions = device.actions
        actions.add(Action("start_listening", self._start_listening))
        actions.add(Action("stop_listening", lambda _data: device.abort()))
        actions.add(
            Action("rtvoice_duplex", self._set_duplex, (("enabled", ArgType.BOOL),))
        )
        actions.add(Action("rtvoice_stop_speaker", self._stop_speaker))
        if not legacy:
            actions.add(Action("rtvoice_silence_speaker", self._silence_speaker))
            actions.add(Action("rtvoice_unmute_speaker", self._unmute_speaker))
        device.on_start.append(lambda: self._mute(False))  # on_start: mute_off

    @property
    def duplex(self) -> bool:
        """The ``rtvoice_duplex`` global (False once its client has gone)."""
        return self._duplex and self._duplex_owner is self._device.voice.owner

    def _set_duplex(self, data: dict[str, Any]) -> None:
        self._duplex = bool(data.get("enabled"))
        self._duplex_owner = self._device.voice.owner

    def _stop_speaker(self, _data: dict[str, Any]) -> None:
        """``speaker.stop: va_speaker``: what the speaker holds is not heard."""
        self._device.voice.stop_speaker()

    def _mute(self, muted: bool) -> None:
        """``speaker.mute_on`` / ``speaker.mute_off: va_speaker`` (``i2s.py``)."""
        path = self._device.voice.speaker_path
        if path is not None:
            path.muted = muted

    def _silence_speaker(self, _data: dict[str, Any]) -> None:
        """``rtvoice_silence_speaker``: ``speaker.mute_on``, then ``speaker.stop``."""
        self._mute(True)
        self._device.voice.stop_speaker()

    def _unmute_speaker(self, _data: dict[str, Any]) -> None:
        """``rtvoice_unmute_speaker``: ``speaker.mute_off``."""
        self._mute(False)

    def _start_listening(self, _data: dict[str, Any]) -> None:
        """``start_listening``: ``voice_assistant.start`` unless running."""
        voice = self._device.voice
        if voice.state == State.IDLE and voice.owner is not None:
            voice.start(wake_word_phrase=None)

    def _running(self) -> bool:
        return self._device.voice.state != State.IDLE

    def wake_word(self, phrase: str = "Okay Nabu") -> Run | None:
        """``on_wake_word``: report a barge-in (duplex, running), else stop → start."""
        if self.duplex and self._running():
            self._device.actions.fire_event(
                EVENT_BARGE_IN, {"trigger": "wake_word", "wake_word": phrase}
            )
            return None
        self._device.actions.fire_event(EVENT_START, {"trigger": "wake_word"})
        if self._device.voice.owner is None:
            return None  # "No API client connected": the firmware only logs
        return self._device.wake(phrase, interrupt=Interrupt.STOP_FIRST)

    def stop_word(self) -> None:
        """``on_wake_word`` with the stop model: report (duplex), else end the run."""
        if self.duplex and self._running():
            self._device.actions.fire_event(
                EVENT_BARGE_IN, {"trigger": "stop", "wake_word": STOP_WORD}
            )
        elif self._running():
            self._device.abort()

    def button(self) -> Run | None:
        """``on_button``: report a barge-in (duplex, running), else stop → start."""
        if self.duplex and self._running():
            self._device.actions.fire_event(EVENT_BARGE_IN, {"trigger": "button"})
            return None
        self._device.actions.fire_event(EVENT_START, {"trigger": "button"})
        if self._device.voice.owner is None:
            return None
        return self._device.wake("", interrupt=Interrupt.STOP_FIRST)


__all__ = [
    "EVENT_BARGE_IN",
    "EVENT_START",
    "Action",
    "ActionCall",
    "ArgType",
    "DeviceActions",
    "ProjectFirmware",
    "fnv1_hash",
]
