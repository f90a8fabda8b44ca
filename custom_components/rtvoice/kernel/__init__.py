"""The realtime kernel of Realtime Voice: pure asyncio, no Home Assistant imports.

Latest input wins, tools are critical sections, output streams delta by delta, the
history holds what the user heard, and the whole conversation is kept and handed off
when a child closes. DESIGN §4.
"""

from __future__ import annotations

from .channels import Capability, Channel, ChannelDef, ChannelRegistry
from .child import ChildOptions, ChildState, ChildStats, Delivery
from .context import (
    INTERRUPTED_MARKER,
    drop_unpaired_tool_calls,
    estimate_tokens,
    trim_to_window,
)
from .errors import (
    AgentNotRealtimeError,
    ChannelNotRealtimeError,
    ChannelsNotPairedError,
    ChannelUnknownError,
    KernelError,
)
from .kernel import (
    ASK_PARENT_TOOL,
    DEFAULT_SYSTEM_PROMPT,
    NOT_RUN_INTERRUPTED,
    NOT_RUN_STOPPED,
    Kernel,
    Ticket,
    current_child_id,
    current_round_seq,
)
from .prompts import PromptRegistry, PromptSection
from .transcript import TranscriptPage, format_transcript
from .types import ChatProvider, Delta, Message, Outcome, ToolCall, ToolRunner, ToolSpec

__all__ = [
    "ASK_PARENT_TOOL",
    "DEFAULT_SYSTEM_PROMPT",
    "INTERRUPTED_MARKER",
    "NOT_RUN_INTERRUPTED",
    "NOT_RUN_STOPPED",
    "AgentNotRealtimeError",
    "Capability",
    "Channel",
    "ChannelDef",
    "ChannelNotRealtimeError",
    "ChannelRegistry",
    "ChannelUnknownError",
    "ChannelsNotPairedError",
    "ChatProvider",
    "ChildOptions",
    "ChildState",
    "ChildStats",
    "Delivery",
    "Delta",
    "Kernel",
    "KernelError",
    "Message",
    "Outcome",
    "PromptRegistry",
    "PromptSection",
    "Ticket",
    "ToolCall",
    "ToolRunner",
    "ToolSpec",
    "TranscriptPage",
    "current_child_id",
    "current_round_seq",
    "drop_unpaired_tool_calls",
    "estimate_tokens",
    "format_transcript",
    "trim_to_window",
]
