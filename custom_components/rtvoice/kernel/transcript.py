"""The full conversation as a parent reads it: text lines or raw JSON pages."""

from __future__ import annotations

from dataclasses import dataclass, replace
import json
from typing import Any, Literal

from .errors import KernelError
from .types import Message

TOOL_RESULT_MAX_CHARS = 500
ARGUMENT_MAX_CHARS = 80
DEFAULT_PAGE_LIMIT = 40


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _argument_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return _clip(text, ARGUMENT_MAX_CHARS)


def _label(message: Message) -> str:
    flags = [
        flag
        for flag, on in (
            ("interrupted", message.interrupted),
            ("failed", message.failed),
        )
        if on
    ]
    return ", ".join([message.role, *flags])


def format_transcript(messages: list[Message]) -> str:
    """One line per message: user/assistant verbatim, tool calls and cut results.

    An assistant line names its status when it has one: ``[assistant, interrupted]``
    (the user heard only this much) or ``[assistant, failed]`` (what the user was
    told when the round failed).
    """
    lines: list[str] = []
    for message in messages:
        if message.role == "tool":
            lines.append(
                f"[tool_result] {_clip(message.content, TOOL_RESULT_MAX_CHARS)}"
            )
            continue
        if message.content or not message.tool_calls:
            lines.append(f"[{_label(message)}] {message.content}")
        for call in message.tool_calls or ():
            args = " ".join(
                f"{key}={_argument_text(call.arguments[key])}"
                for key in sorted(call.arguments)
            )
            lines.append(f"[tool_call] {call.name} {args}".rstrip())
    return "\n".join(lines)


def message_to_dict(message: Message) -> dict[str, Any]:
    """JSON-ready form of a message (empty optional fields left out)."""
    data: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        data["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        data["tool_call_id"] = message.tool_call_id
    if message.interrupted:
        data["interrupted"] = True
    if message.failed:
        data["failed"] = True
    return data


@dataclass
class TranscriptPage:
    """One page of a transcript: ``messages[offset:offset+limit]`` of ``total``."""

    id: str
    offset: int
    total: int
    messages: list[Message]

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form (the ``raw`` format)."""
        return {
            "id": self.id,
            "offset": self.offset,
            "total": self.total,
            "messages": [message_to_dict(m) for m in self.messages],
        }


def page_of(
    child_id: str,
    messages: list[Message],
    offset: int = 0,
    limit: int = DEFAULT_PAGE_LIMIT,
) -> TranscriptPage:
    """Cut a page out of a transcript; its messages are copies."""
    if offset < 0:
        raise KernelError(f"offset must be >= 0, got {offset}")
    if limit <= 0:
        limit = DEFAULT_PAGE_LIMIT
    page = [copy_message(m) for m in messages[offset : offset + limit]]
    return TranscriptPage(child_id, offset, len(messages), page)


def format_page(page: TranscriptPage, fmt: Literal["text", "raw"] = "text") -> str:
    """Render a page in ``text`` (lines) or ``raw`` (JSON) format."""
    if fmt == "raw":
        return json.dumps(page.as_dict(), ensure_ascii=False)
    if fmt != "text":
        raise KernelError(f"unknown transcript format {fmt!r} (use 'text' or 'raw')")
    return format_transcript(page.messages)


def transcript_page(
    child_id: str,
    messages: list[Message],
    offset: int = 0,
    limit: int = DEFAULT_PAGE_LIMIT,
    fmt: Literal["text", "raw"] = "text",
) -> str:
    """One page of a transcript in ``text`` or ``raw`` (JSON) format."""
    return format_page(page_of(child_id, messages, offset, limit), fmt)


def copy_message(message: Message) -> Message:
    """Return a copy that shares nothing mutable with ``message``."""
    return replace(
        message,
        tool_calls=[replace(c, arguments=dict(c.arguments)) for c in message.tool_calls]
        if message.tool_calls
        else None,
    )
