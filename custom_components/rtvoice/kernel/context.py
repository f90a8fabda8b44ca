"""What the model sees: token estimate, window trim and tool-call pairing hygiene.

All functions are pure: they never modify the history they are given.
"""

from __future__ import annotations

import json
import logging

from .types import Message

_LOGGER = logging.getLogger(__name__)

# Per-message structural overhead (role, separators) in tokens.
MESSAGE_OVERHEAD_TOKENS = 4

# Put after the heard text of an interrupted answer in requests only: the model
# learns that it was cut off and where. Never in transcripts, outcomes or speech.
# ASCII on purpose: the token estimate of pure ASCII text is the fast path.
INTERRUPTED_MARKER = "... [cut off here: the user heard only this far]"


def _is_wide(code: int) -> bool:
    """CJK ideographs, kana, hangul and full-width forms: about one token each."""
    return (
        0x2E80 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x2FA1F
    )


def estimate_tokens(text: str) -> int:
    """Estimate tokens without a tokenizer: ~4 Latin chars or 1 CJK char per token."""
    if not text:
        return 0
    if text.isascii():
        return (len(text) + 3) // 4
    wide = 0
    for char in text:
        if _is_wide(ord(char)):
            wide += 1
    return wide + (len(text) - wide + 3) // 4


def message_tokens(message: Message) -> int:
    """Estimated tokens of one message, tool calls included.

    The estimate is cached on the message (history messages are never edited; the
    cache is keyed on the content object and the tool-call list so an edit still
    re-estimates). Every model call trims the whole history, so this is a hot path.
    """
    cached = message.__dict__.get("_token_cache")
    if (
        cached is not None
        and cached[0] is message.content
        and cached[1] is message.tool_calls
    ):
        return cached[2]  # type: ignore[no-any-return]
    tokens = MESSAGE_OVERHEAD_TOKENS + estimate_tokens(message.content)
    if message.tool_calls:
        for call in message.tool_calls:
            tokens += estimate_tokens(call.name) + estimate_tokens(
                json.dumps(call.arguments, ensure_ascii=False)
            )
    message.__dict__["_token_cache"] = (message.content, message.tool_calls, tokens)
    return tokens


def _last_user_index(messages: list[Message]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return index
    return len(messages)


def trim_to_window(messages: list[Message], window: int) -> list[Message]:
    """Drop the oldest whole groups until the messages fit ``window`` tokens.

    A group is an assistant message with tool calls plus the tool results that follow
    it; any other message is a group of its own. The leading system message, the last
    user message and everything after it are never dropped. Returns ``messages``
    itself when nothing needs dropping, else a new list.
    """
    if window <= 0 or not messages:
        return messages
    start = 1 if messages[0].role == "system" else 0
    tail = _last_user_index(messages)
    if tail <= start:
        return messages
    sizes = [message_tokens(m) for m in messages]
    total = sum(sizes)
    if total <= window:
        return messages
    cut = start  # first kept index of the droppable middle
    while cut < tail and total > window:
        end = cut + 1
        if messages[cut].role == "assistant" and messages[cut].tool_calls:
            while end < tail and messages[end].role == "tool":
                end += 1
        total -= sum(sizes[cut:end])
        cut = end
    # Never start the kept middle with stray tool results.
    while cut < tail and messages[cut].role == "tool":
        cut += 1
    return messages[:start] + messages[cut:]


def _is_clean(messages: list[Message]) -> bool:
    """Read-only scan: every call answered right after it, no orphan, no empty."""
    calls: list | None = None  # tool calls of the assistant owning the current block
    for index, message in enumerate(messages):
        role = message.role
        if role == "tool":
            if calls is None:
                return False
            for call in calls:
                if call.id == message.tool_call_id:
                    break
            else:
                return False
            continue
        calls = None
        if role != "assistant":
            continue
        if not message.tool_calls:
            if not message.content:
                return False
            continue
        calls = message.tool_calls
        for call in calls:
            probe = index + 1
            while probe < len(messages) and messages[probe].role == "tool":
                if messages[probe].tool_call_id == call.id:
                    break
                probe += 1
            else:
                return False
    return True


def drop_unpaired_tool_calls(messages: list[Message]) -> list[Message]:
    """Make tool-call pairing valid before a request.

    Assistant tool calls without a result in the tool messages right after them are
    removed, orphan tool results are removed, and an assistant message left empty is
    removed. The clean case returns the same list object without allocating.
    """
    if _is_clean(messages):
        return messages
    out: list[Message] = []
    dropped: list[str] = []
    index = 0
    while index < len(messages):
        message = messages[index]
        if message.role == "tool":
            dropped.append(f"result {message.tool_call_id}")  # orphan
            index += 1
            continue
        if message.role != "assistant" or not message.tool_calls:
            if message.role == "assistant" and not message.content:
                index += 1
                continue
            out.append(message)
            index += 1
            continue
        block_end = index + 1
        while block_end < len(messages) and messages[block_end].role == "tool":
            block_end += 1
        results = messages[index + 1 : block_end]
        answered = {r.tool_call_id for r in results}
        kept_calls = [c for c in message.tool_calls if c.id in answered]
        dropped.extend(c.name for c in message.tool_calls if c.id not in answered)
        kept_ids = {c.id for c in kept_calls}
        if kept_calls:
            out.append(
                Message(
                    role="assistant",
                    content=message.content,
                    tool_calls=kept_calls,
                    interrupted=message.interrupted,
                )
                if len(kept_calls) != len(message.tool_calls)
                else message
            )
        elif message.content:
            out.append(
                Message(
                    role="assistant",
                    content=message.content,
                    interrupted=message.interrupted,
                )
            )
        seen: set[str | None] = set()
        for result in results:
            if result.tool_call_id in kept_ids and result.tool_call_id not in seen:
                seen.add(result.tool_call_id)
                out.append(result)
            else:
                dropped.append(f"result {result.tool_call_id}")
        index = block_end
    _LOGGER.warning(
        "Removed %d unpaired tool message(s) before the request: %s",
        len(dropped),
        dropped[:8],
    )
    return out


def needs_marker(message: Message) -> bool:
    """Whether the model is shown ``message`` with :data:`INTERRUPTED_MARKER`."""
    return message.interrupted and message.role == "assistant" and bool(message.content)


def model_view(message: Message) -> Message:
    """Return a history message as the model is shown it.

    An interrupted assistant answer gets :data:`INTERRUPTED_MARKER` after its heard
    text; every other message is returned as it is. The view is cached on the
    message (keyed on its content object), so its token estimate is cached too.
    """
    if not needs_marker(message):
        return message
    cached = message.__dict__.get("_model_view")
    if cached is not None and cached[0] is message.content:
        return cached[1]  # type: ignore[no-any-return]
    view = Message(
        "assistant",
        message.content.rstrip() + INTERRUPTED_MARKER,
        tool_calls=message.tool_calls,
        interrupted=True,
    )
    message.__dict__["_model_view"] = (message.content, view)
    return view


def joins(previous: Message, view: Message) -> bool:
    """Whether two consecutive shown messages become one (plain assistant texts)."""
    return (
        view.role == "assistant"
        and previous.role == "assistant"
        and not view.tool_calls
        and not previous.tool_calls
    )


def joined(previous: Message, view: Message) -> Message:
    """Join two consecutive plain assistant messages into one."""
    return Message(
        "assistant",
        f"{previous.content} {view.content}",
        interrupted=previous.interrupted or view.interrupted,
        failed=previous.failed or view.failed,
    )


def render_for_model(history: list[Message]) -> list[Message]:
    """Return ``history`` as the model is shown it (a new list).

    Interrupted answers carry the marker (:func:`model_view`), and consecutive
    plain assistant messages (a heard partial, then what the user was told when
    the round failed) are joined into one, since some chat templates insist on
    alternating roles.
    """
    out: list[Message] = []
    for message in history:
        view = model_view(message)
        if out and joins(out[-1], view):
            out[-1] = joined(out[-1], view)
        else:
            out.append(view)
    return out
