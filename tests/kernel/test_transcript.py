"""Transcript format and paging: DESIGN 4.6."""

from __future__ import annotations

import json

import pytest

from custom_components.rtvoice.kernel import (
    KernelError,
    Message,
    ToolCall,
    TranscriptPage,
    format_transcript,
)
from custom_components.rtvoice.kernel.transcript import transcript_page
from tests.kernel.fakes import (
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    call,
    outcome,
)

LONG_RESULT = "".join(chr(ord("a") + i % 26) for i in range(1200))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_format_transcript_lines() -> None:
    """Format transcript lines."""
    messages = [
        Message("user", "Turn on the kitchen light"),
        Message(
            "assistant",
            "",
            tool_calls=[
                ToolCall(
                    "c1", "light_on", {"entity": "light.kitchen", "brightness": 50}
                )
            ],
        ),
        Message("tool", LONG_RESULT, tool_call_id="c1"),
        Message("assistant", "Done, the light is on."),
    ]
    lines = _lines(format_transcript(messages))
    assert len(lines) == 4
    assert lines[0] == "[user] Turn on the kitchen light"
    assert lines[1].startswith("[tool_call] light_on")
    assert "entity=light.kitchen" in lines[1]
    assert "brightness=50" in lines[1]
    assert lines[2].startswith("[tool_result] ")
    payload = lines[2][len("[tool_result] ") :]
    assert payload.startswith(LONG_RESULT[:497])
    assert len(payload) <= 503  # cut to 500 characters (an ellipsis allowed)
    assert LONG_RESULT[:600] not in payload
    assert lines[3] == "[assistant] Done, the light is on."


def test_format_transcript_keeps_user_and_assistant_verbatim() -> None:
    """Format transcript keeps user and assistant verbatim."""
    long_user = "please " * 300  # far beyond 500 characters
    messages = [Message("user", long_user.strip()), Message("assistant", "x" * 2000)]
    lines = _lines(format_transcript(messages))
    assert lines[0] == "[user] " + long_user.strip()
    assert lines[1] == "[assistant] " + "x" * 2000


def test_format_transcript_short_tool_result_is_not_cut() -> None:
    """Format transcript short tool result is not cut."""
    messages = [
        Message("assistant", "", tool_calls=[ToolCall("c1", "temp", {})]),
        Message("tool", '{"temperature": 21}', tool_call_id="c1"),
    ]
    lines = _lines(format_transcript(messages))
    assert lines[0].startswith("[tool_call] temp")
    assert lines[1] == '[tool_result] {"temperature": 21}'


def test_format_transcript_lists_every_tool_call() -> None:
    """Format transcript lists every tool call."""
    messages = [
        Message(
            "assistant",
            "One moment.",
            tool_calls=[
                ToolCall("a", "first", {"k": "v"}),
                ToolCall("b", "second", {}),
            ],
        ),
    ]
    text = format_transcript(messages)
    assert "[assistant] One moment." in text
    assert "[tool_call] first k=v" in text
    assert "[tool_call] second" in text


async def _child_with_history(
    rig: Rig, provider: ScriptedProvider, rounds: int
) -> None:
    await rig.spawn("c1")
    for i in range(rounds):
        provider.add([Text(f"answer {i}")])
        assert (
            await outcome(rig.kernel.push("c1", f"question {i}"))
        ).status == "completed"


async def test_page_text_and_raw_of_a_live_child() -> None:
    """Page text and raw of a live child."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result=LONG_RESULT)})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light", entity="light.kitchen"))], [Text("Done.")]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "Turn on the light"))

        text = rig.kernel.transcript_page("c1")
        lines = _lines(text)
        assert "[user] Turn on the light" in lines
        assert any(
            line.startswith("[tool_call] light") and "entity=light.kitchen" in line
            for line in lines
        )
        results = [line for line in lines if line.startswith("[tool_result] ")]
        assert len(results) == 1
        assert len(results[0]) <= len("[tool_result] ") + 503
        assert "[assistant] Done." in lines

        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert set(raw) >= {"id", "offset", "total", "messages"}
        assert raw["id"] == "c1"
        assert raw["offset"] == 0
        assert raw["total"] == 4
        assert [m["role"] for m in raw["messages"]] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert raw["messages"][0]["content"] == "Turn on the light"
        assert raw["messages"][2]["content"] == LONG_RESULT  # raw is not cut
        assert raw["messages"][2]["tool_call_id"] == "t1"
        assert raw["messages"][1]["tool_calls"][0]["name"] == "light"


async def test_paging_offset_limit_and_default_limit_40() -> None:
    """Paging offset limit and default limit 40."""
    provider = ScriptedProvider()
    async with Rig(provider) as rig:
        await _child_with_history(rig, provider, 23)  # 46 messages

        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert raw["total"] == 46
        assert len(raw["messages"]) == 40
        assert raw["messages"][0]["content"] == "question 0"

        rest = json.loads(rig.kernel.transcript_page("c1", offset=40, fmt="raw"))
        assert rest["offset"] == 40
        assert [m["content"] for m in rest["messages"]] == [
            "question 20",
            "answer 20",
            "question 21",
            "answer 21",
            "question 22",
            "answer 22",
        ]

        page = json.loads(
            rig.kernel.transcript_page("c1", offset=4, limit=3, fmt="raw")
        )
        assert [m["content"] for m in page["messages"]] == [
            "question 2",
            "answer 2",
            "question 3",
        ]

        text = rig.kernel.transcript_page("c1", offset=4, limit=3)
        lines = _lines(text)
        assert "[user] question 2" in lines
        assert "[assistant] answer 2" in lines
        assert "[user] question 3" in lines
        assert "[assistant] answer 3" not in lines
        assert "[user] question 1" not in lines

        default_text = rig.kernel.transcript_page("c1")
        assert "[user] question 19" in _lines(default_text)
        assert "[user] question 20" not in _lines(default_text)


async def test_page_of_unknown_id_raises_kernel_error() -> None:
    """Page of unknown id raises kernel error."""
    async with Rig() as rig:
        with pytest.raises(KernelError):
            rig.kernel.transcript_page("ghost")
        with pytest.raises(KernelError):
            rig.kernel.transcript_page("ghost", fmt="raw")


async def test_transcript_stays_retrievable_after_close() -> None:
    """Transcript stays retrievable after close."""
    provider = ScriptedProvider()
    async with Rig(provider) as rig:
        await _child_with_history(rig, provider, 2)
        before = rig.kernel.transcript("c1")
        assert before is not None
        count = await rig.kernel.close("c1")
        assert count == 4
        assert rig.kernel.children() == []
        after = rig.kernel.transcript("c1")
        assert after is not None
        assert [(m.role, m.content) for m in after] == [
            (m.role, m.content) for m in before
        ]
        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert raw["total"] == 4
        assert "[user] question 1" in _lines(rig.kernel.transcript_page("c1"))
        # a copy, also when archived
        after.clear()
        again = rig.kernel.transcript("c1")
        assert again is not None and len(again) == 4


def test_page_edges() -> None:
    """Raw pages mark cut answers; a limit <= 0 means 40; bad arguments raise."""
    messages = [Message("user", f"u{i}") for i in range(45)]
    messages.append(Message("assistant", "Hel", interrupted=True))
    raw = json.loads(transcript_page("c1", messages, offset=44, fmt="raw"))
    assert raw["messages"] == [
        {"role": "user", "content": "u44"},
        {"role": "assistant", "content": "Hel", "interrupted": True},
    ]
    assert len(_lines(transcript_page("c1", messages, limit=0))) == 40
    with pytest.raises(KernelError, match="offset must be >= 0"):
        transcript_page("c1", messages, offset=-1)
    with pytest.raises(KernelError, match="unknown transcript format 'xml'"):
        transcript_page("c1", messages, fmt="xml")  # type: ignore[arg-type]


def test_format_transcript_names_the_status_of_an_answer() -> None:
    """Interrupted and failed answers say so; the raw page carries the flags."""
    messages = [
        Message("user", "weather"),
        Message("assistant", "It is", interrupted=True),
        Message("assistant", "Sorry.", failed=True),
        Message("assistant", "Sunny."),
    ]
    assert format_transcript(messages).splitlines() == [
        "[user] weather",
        "[assistant, interrupted] It is",
        "[assistant, failed] Sorry.",
        "[assistant] Sunny.",
    ]
    raw = json.loads(transcript_page("c1", messages, fmt="raw"))
    assert [
        (m.get("interrupted", False), m.get("failed", False)) for m in raw["messages"]
    ] == [(False, False), (True, False), (False, True), (False, False)]


async def test_structured_page_of_a_live_and_a_closed_child() -> None:
    """transcript_page_data: the page as data; its messages are copies."""
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        for text in ("one", "two", "three"):
            await outcome(rig.kernel.push("c1", text))
        page = rig.kernel.transcript_page_data("c1", offset=1, limit=2)
        assert isinstance(page, TranscriptPage)
        assert (page.id, page.offset, page.total) == ("c1", 1, 6)
        assert [(m.role, m.content) for m in page.messages] == [
            ("assistant", "ok"),
            ("user", "two"),
        ]
        page.messages[0].content = "edited"
        assert rig.kernel.transcript_page_data("c1").messages[1].content == "ok"
        assert rig.kernel.transcript_page_data("c1", limit=0).total == 6
        await rig.kernel.close("c1")
        closed = rig.kernel.transcript_page_data("c1", offset=4)
        assert [m.content for m in closed.messages] == ["three", "ok"]
        assert json.loads(rig.kernel.transcript_page("c1", fmt="raw")) == {
            "id": "c1",
            "offset": 0,
            "total": 6,
            "messages": [
                {"role": m.role, "content": m.content}
                for m in rig.kernel.transcript_page_data("c1").messages
            ],
        }
        with pytest.raises(KernelError):
            rig.kernel.transcript_page_data("ghost")
