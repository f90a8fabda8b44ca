"""Messages, deltas and the protocols the kernel talks to.

The kernel only knows these shapes; providers (LLM endpoints) and tool runners (Home
Assistant's LLM API, test doubles) adapt to them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass
class ToolCall:
    """One complete tool call requested by the model."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    # Set by a provider when the model sent arguments that are not a JSON object; the
    # kernel then answers the call with a tool error instead of running the tool.
    error: str | None = None


@dataclass
class Message:
    """One chat message in OpenAI-compatible shape."""

    role: str
    content: str = ""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant answer cut off where the user stopped hearing it.
    interrupted: bool = False
    # What the user was told when a round failed (e.g. an apology), not the model.
    failed: bool = False


@dataclass
class Delta:
    """A piece of a streamed model answer.

    ``tool_calls`` are complete calls: the provider assembles streamed fragments.
    """

    content: str = ""
    tool_calls: list[ToolCall] | None = None


@dataclass
class ToolSpec:
    """A tool offered to the model; ``parameters`` is a JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@runtime_checkable
class ChatProvider(Protocol):
    """A streaming chat model.

    The kernel closes the iterator (``aclose``) when the round is cancelled; a
    provider must release its HTTP response then so the upstream stops generating.
    """

    def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Stream the answer to ``messages`` with ``tools`` offered."""


@runtime_checkable
class ToolRunner(Protocol):
    """Runs the tools the model may call."""

    def specs(self) -> list[ToolSpec]:
        """Tools currently offered to the model."""

    async def call(self, call: ToolCall) -> str:
        """Run one call and return its result text (JSON welcome)."""


OutcomeStatus = Literal["completed", "interrupted", "superseded", "failed"]


@dataclass
class Outcome:
    """How the round for one pushed input ended.

    A failed round carries the error's message and the name of its type
    (``error_type``, e.g. ``ProviderConnectionError``). A superseded input of a
    child with ``carry_over`` names the input that carries it on
    (``carried_into``, a seq; None when no newer input exists yet).
    """

    status: OutcomeStatus
    text: str = ""
    error: str | None = None
    error_type: str | None = None
    carried_into: int | None = None
