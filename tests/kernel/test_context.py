"""Pure helpers of DESIGN 4.5: trim_to_window, drop_unpaired_tool_calls, estimate_tokens."""

from __future__ import annotations

import copy

import pytest

from custom_components.rtvoice.kernel import (
    Message,
    ToolCall,
    drop_unpaired_tool_calls,
    estimate_tokens,
    trim_to_window,
)


def tc(id_: str, name: str = "f") -> ToolCall:
    """Build a tool call."""
    return ToolCall(id=id_, name=name, arguments={"x": 1})


def sys_(text: str = "system prompt") -> Message:
    """Build a system message."""
    return Message("system", text)


def user(text: str) -> Message:
    """Build a user message."""
    return Message("user", text)


def asst(text: str = "", *calls: ToolCall) -> Message:
    """Build an assistant message, optionally with tool calls."""
    return Message("assistant", text, tool_calls=list(calls) if calls else None)


def tool(id_: str, text: str = "result") -> Message:
    """Build a tool result message."""
    return Message("tool", text, tool_call_id=id_)


# --------------------------------------------------------------------------- pairing


def test_clean_messages_return_the_same_list_object() -> None:
    """Clean messages return the same list object."""
    messages = [
        sys_(),
        user("hi"),
        asst("", tc("a"), tc("b")),
        tool("a"),
        tool("b"),
        asst("done"),
        user("again"),
    ]
    assert drop_unpaired_tool_calls(messages) is messages
    empty: list[Message] = []
    assert drop_unpaired_tool_calls(empty) is empty
    plain = [sys_(), user("x"), asst("y")]
    assert drop_unpaired_tool_calls(plain) is plain


def test_unanswered_call_is_removed_and_others_kept() -> None:
    """Unanswered call is removed and others kept."""
    messages = [sys_(), user("hi"), asst("", tc("a"), tc("b")), tool("a"), asst("ok")]
    snapshot = copy.deepcopy(messages)
    out = drop_unpaired_tool_calls(messages)
    assert out is not messages
    assert [m.role for m in out] == ["system", "user", "assistant", "tool", "assistant"]
    assert out[2].tool_calls is not None
    assert [c.id for c in out[2].tool_calls] == ["a"]
    assert drop_unpaired_tool_calls(out) is out
    # never in place: the caller's list and messages are untouched
    assert messages == snapshot


def test_assistant_left_empty_is_removed() -> None:
    """Assistant left empty is removed."""
    messages = [sys_(), user("hi"), asst("", tc("a")), user("next")]
    out = drop_unpaired_tool_calls(messages)
    assert [(m.role, m.content) for m in out] == [
        ("system", "system prompt"),
        ("user", "hi"),
        ("user", "next"),
    ]


def test_assistant_with_text_is_kept_when_its_calls_go() -> None:
    """Assistant with text is kept when its calls go."""
    messages = [sys_(), user("hi"), asst("let me check", tc("a")), user("next")]
    out = drop_unpaired_tool_calls(messages)
    assert [(m.role, m.content) for m in out] == [
        ("system", "system prompt"),
        ("user", "hi"),
        ("assistant", "let me check"),
        ("user", "next"),
    ]
    assert not out[2].tool_calls


def test_orphan_tool_result_is_removed() -> None:
    """Orphan tool result is removed."""
    messages = [sys_(), user("hi"), tool("ghost"), asst("answer")]
    out = drop_unpaired_tool_calls(messages)
    assert [m.role for m in out] == ["system", "user", "assistant"]


def test_result_must_follow_its_call_immediately() -> None:
    # a user message between call and result breaks the pair: both go
    """Result must follow its call immediately."""
    messages = [sys_(), user("hi"), asst("", tc("a")), user("interjection"), tool("a")]
    out = drop_unpaired_tool_calls(messages)
    assert [m.role for m in out] == ["system", "user", "user"]
    assert drop_unpaired_tool_calls(out) is out


def test_mixed_damage_is_repaired_in_one_pass() -> None:
    """Mixed damage is repaired in one pass."""
    messages = [
        sys_(),
        user("1"),
        asst("", tc("a"), tc("b")),
        tool("b"),
        tool("zzz"),  # orphan inside a tool run
        asst("x"),
        user("2"),
        asst("", tc("c")),
        tool("c"),
    ]
    out = drop_unpaired_tool_calls(messages)
    assert drop_unpaired_tool_calls(out) is out
    assert [(m.role, m.tool_call_id) for m in out] == [
        ("system", None),
        ("user", None),
        ("assistant", None),
        ("tool", "b"),
        ("assistant", None),
        ("user", None),
        ("assistant", None),
        ("tool", "c"),
    ]
    assert out[2].tool_calls is not None
    assert [c.id for c in out[2].tool_calls] == ["b"]


# --------------------------------------------------------------------------- trimming


def _history(rounds: int, size: int = 200) -> list[Message]:
    body = "word " * (size // 5)
    out: list[Message] = [sys_("S")]
    for i in range(rounds):
        out += [
            user(f"q{i} {body}"),
            asst("", tc(f"c{i}a"), tc(f"c{i}b")),
            tool(f"c{i}a", f"ra{i} {body}"),
            tool(f"c{i}b", f"rb{i} {body}"),
            asst(f"a{i} {body}"),
        ]
    out.append(user("current question"))
    return out


def test_large_window_keeps_everything() -> None:
    """Large window keeps everything."""
    messages = _history(3)
    out = trim_to_window(messages, 10**9)
    assert out == messages


def test_trim_does_not_touch_the_input_list() -> None:
    """Trim does not touch the input list."""
    messages = _history(5)
    snapshot = copy.deepcopy(messages)
    out = trim_to_window(messages, 50)
    assert messages == snapshot
    assert len(out) < len(messages)


def test_tiny_window_keeps_system_and_last_user() -> None:
    """Tiny window keeps system and last user."""
    messages = _history(5)
    out = trim_to_window(messages, 1)
    assert out == [messages[0], messages[-1]]


def test_everything_after_the_last_user_is_kept() -> None:
    """Everything after the last user is kept."""
    messages = _history(3)
    messages += [asst("", tc("now")), tool("now", "big " * 500)]
    out = trim_to_window(messages, 1)
    assert out == [messages[0], messages[-3], messages[-2], messages[-1]]


@pytest.mark.parametrize("window", [1, 50, 100, 200, 400, 800, 1600, 3200, 10**9])
def test_trim_drops_oldest_whole_groups(window: int) -> None:
    """Trim drops oldest whole groups."""
    messages = _history(6)
    out = trim_to_window(messages, window)
    assert out[0] == messages[0]
    assert out[-1] == messages[-1]
    kept = out[1:-1]
    middle = messages[1:-1]
    # the kept part is a suffix of the middle: only the oldest messages go
    assert kept == middle[len(middle) - len(kept) :]
    # never cut inside a group: the pairing stays valid
    assert drop_unpaired_tool_calls(out) is out
    if kept:
        assert kept[0].role != "tool"


def test_trim_is_monotonic_in_the_window() -> None:
    """Trim is monotonic in the window."""
    messages = _history(6)
    sizes = [len(trim_to_window(messages, w)) for w in (1, 100, 300, 900, 2700, 10**9)]
    assert sizes == sorted(sizes)
    assert sizes[0] == 2
    assert sizes[-1] == len(messages)
    assert len(set(sizes)) > 2  # partial trimming exists between the extremes


def test_trim_result_fits_the_window_when_possible() -> None:
    """Trim result fits the window when possible."""
    messages = _history(6)
    full = trim_to_window(messages, 10**9)
    minimum = trim_to_window(messages, 1)

    def cost(ms: list[Message]) -> int:
        return sum(estimate_tokens(m.content) for m in ms)

    window = (cost(full) + cost(minimum)) // 2
    out = trim_to_window(messages, window)
    assert len(minimum) < len(out) < len(full)
    # the content alone must not exceed the window (structure overhead aside)
    assert cost(out) <= window


# --------------------------------------------------------------------------- tokens


def test_cjk_weighs_more_than_latin() -> None:
    """Cjk weighs more than latin."""
    latin = "abcd" * 50
    cjk = "你好世界" * 50
    assert len(latin) == len(cjk)
    assert estimate_tokens(cjk) > estimate_tokens(latin)
    assert estimate_tokens("こんにちは" * 20) > estimate_tokens("hello" * 20)
    assert estimate_tokens("안녕하세요" * 20) > estimate_tokens("hello" * 20)


def test_estimate_tokens_grows_with_text() -> None:
    """Estimate tokens grows with text."""
    assert estimate_tokens("") <= estimate_tokens("a")
    short = estimate_tokens("turn on the kitchen light")
    long = estimate_tokens("turn on the kitchen light " * 10)
    assert 0 < short < long
    # plausible scale for English: a few characters per token
    assert 100 <= estimate_tokens("word " * 200) <= 1000


# --------------------------------------------------------------------------- edges


def test_trim_without_a_window_or_messages_returns_the_input() -> None:
    """A window of 0 (no limit) or no messages: the very same list comes back."""
    messages = [sys_(), user("x" * 4000)]
    assert trim_to_window(messages, 0) is messages
    empty: list[Message] = []
    assert trim_to_window(empty, 10) is empty


def test_trim_without_a_user_message_may_drop_everything_but_system() -> None:
    """With no user message nothing is protected except the system message."""
    messages = [sys_(), asst("a" * 2000), asst("b" * 2000)]
    assert trim_to_window(messages, 20) == [messages[0]]


def test_trim_never_starts_the_kept_part_with_a_tool_result() -> None:
    """A tool result left at the cut (its call already gone) is dropped with it."""
    messages = [sys_(), user("old " * 500), tool("gone"), user("now")]
    assert trim_to_window(messages, 30) == [messages[0], messages[3]]


def test_result_of_another_call_is_not_clean() -> None:
    """A result after an assistant whose calls do not include its id is removed."""
    messages = [user("u"), asst("", tc("a")), tool("a"), tool("b"), asst("done")]
    assert drop_unpaired_tool_calls(messages) == [
        messages[0],
        messages[1],
        messages[2],
        messages[4],
    ]


def test_empty_assistant_without_calls_is_removed() -> None:
    """An assistant message with neither text nor calls never reaches the model."""
    messages = [user("u"), asst(""), user("again")]
    assert drop_unpaired_tool_calls(messages) == [messages[0], messages[2]]
