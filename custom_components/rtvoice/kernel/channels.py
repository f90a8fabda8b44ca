"""Channel registry: named inputs and outputs, their capabilities and owners.

A realtime child is bound to one RT input and one RT output (a *pair*). The RT
binding path checks both sides and rolls back to the previous owners on any failure;
the plain ``assign`` path does no RT checks (a non-RT channel may still be given to a
realtime child). When a child stops its channels keep pointing at it ("dangling").
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
import enum
import logging
from typing import Literal

from .errors import (
    AgentNotRealtimeError,
    ChannelNotRealtimeError,
    ChannelsNotPairedError,
    ChannelUnknownError,
    KernelError,
)

_LOGGER = logging.getLogger(__name__)

OutputHandler = Callable[[str], Awaitable[None] | None]


class Capability(enum.IntFlag):
    """What a channel can carry."""

    TEXT = 1
    AUDIO = 2
    RT = 4  # realtime: a new value voids the old one


@dataclass(frozen=True)
class ChannelDef:
    """How a channel was declared by its provider."""

    realtime: bool = False
    no_memory: bool = False  # never written to long-term memory


@dataclass
class Channel:
    """A registered channel."""

    name: str
    kind: Literal["input", "output"]
    capabilities: Capability
    owner: str = ""
    definition: ChannelDef = field(default_factory=ChannelDef)
    handler: OutputHandler | None = None


class ChannelRegistry:
    """Holds every channel by name."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._channels: dict[str, Channel] = {}

    def register_input(self, name: str, definition: ChannelDef = ChannelDef()) -> None:
        """Register (or re-declare) an input channel; an existing owner is kept."""
        caps = Capability.RT if definition.realtime else Capability.TEXT
        self._put(Channel(name, "input", caps, definition=definition))

    def register_output(
        self,
        name: str,
        handler: OutputHandler,
        capabilities: Capability = Capability.TEXT,
        definition: ChannelDef = ChannelDef(),
    ) -> None:
        """Register (or re-declare) an output channel whose handler gets text deltas."""
        if definition.realtime:
            capabilities |= Capability.RT
        self._put(
            Channel(
                name, "output", capabilities, definition=definition, handler=handler
            )
        )

    def _put(self, channel: Channel) -> None:
        if not channel.name:
            raise ValueError("channel name must not be empty")
        if (old := self._channels.get(channel.name)) is not None:
            channel.owner = old.owner
        self._channels[channel.name] = channel

    def lookup(self, name: str) -> Channel | None:
        """Return the channel called ``name``, or None."""
        return self._channels.get(name)

    def assign(self, name: str, owner: str) -> None:
        """Plain assignment: no RT checks."""
        channel = self._channels.get(name)
        if channel is None:
            raise ChannelUnknownError(f"channel {name!r} is not registered")
        channel.owner = owner

    def unregister(self, name: str) -> None:
        """Forget a channel (no error when it is unknown)."""
        self._channels.pop(name, None)

    def list(self) -> list[Channel]:
        """Every channel, sorted by name."""
        return [self._channels[name] for name in sorted(self._channels)]

    def realtime_names(self) -> builtins.list[str]:
        """Names of RT channels with their owners, for actionable error messages."""
        return [
            f"{ch.name} ({ch.kind}, owner: {ch.owner or 'unassigned'})"
            for ch in self.list()
            if Capability.RT in ch.capabilities
        ]

    def bind_realtime_pair(
        self, input_name: str, output_name: str, owner: str, *, owner_is_realtime: bool
    ) -> None:
        """Give an RT input + RT output to a realtime owner, all or nothing.

        On any failure every channel touched goes back to its previous owner.
        """
        if not input_name or not output_name:
            raise ChannelsNotPairedError(
                "a realtime child needs both an input and an output channel"
                f" (input={input_name!r}, output={output_name!r})"
            )
        previous: dict[str, str] = {}
        try:
            for name, kind in ((input_name, "input"), (output_name, "output")):
                channel = self._realtime_channel(name, kind, owner, owner_is_realtime)
                previous[name] = channel.owner
                channel.owner = owner
        except KernelError:
            for name, old_owner in previous.items():
                self._channels[name].owner = old_owner
            raise

    def _realtime_channel(
        self, name: str, kind: str, owner: str, owner_is_realtime: bool
    ) -> Channel:
        """Return channel ``name`` if it may be one side of an RT pair, else raise."""
        channel = self._channels.get(name)
        if channel is None:
            raise ChannelUnknownError(f"channel {name!r} is not registered")
        if channel.kind != kind:
            raise ChannelsNotPairedError(
                f"channel {name!r} is an {channel.kind} channel;"
                f" the pair needs an {kind} channel there"
            )
        if Capability.RT not in channel.capabilities:
            raise ChannelNotRealtimeError(
                f"channel {name!r} does not declare the RT capability"
            )
        if not owner_is_realtime:
            raise AgentNotRealtimeError(
                f"agent {owner!r} is not a realtime child;"
                " only realtime children hold RT channels"
            )
        return channel

    def output_handler(self, name: str) -> OutputHandler | None:
        """Return the handler of output channel ``name`` (None when unknown)."""
        channel = self._channels.get(name)
        return channel.handler if channel is not None else None

    def report_dangling(self, owner: str) -> builtins.list[str]:
        """Channels still owned by a stopped child; logged, not handed back."""
        names = [ch.name for ch in self.list() if ch.owner == owner]
        if names:
            _LOGGER.debug("Channels %s keep dangling owner %s", names, owner)
        return names
