"""Kernel error types.

Each failure has its own type so the message says which side to fix: the channel
(unknown / not realtime), the agent (not realtime) or the caller (channels not paired).
"""

from __future__ import annotations


class KernelError(Exception):
    """Base class of every error the kernel raises."""


class ChannelUnknownError(KernelError):
    """No channel with that name is registered."""


class ChannelNotRealtimeError(KernelError):
    """The channel does not declare the RT capability."""


class AgentNotRealtimeError(KernelError):
    """The target agent cannot hold realtime channels (e.g. the parent)."""


class ChannelsNotPairedError(KernelError):
    """A realtime child needs an input and an output channel, both RT."""
