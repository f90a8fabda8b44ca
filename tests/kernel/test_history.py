"""What the model sees next round: DESIGN 4.4 (history) and 4.5 (window, hygiene)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from custom_components.rtvoice.kernel import (
    INTERRUPTED_MARKER,
    Message,
    drop_unpaired_tool_calls,
)
from custom_components.rtvoice.kernel.context import render_for_model
from tests.kernel.fakes import (
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    StreamCall,
    Text,
    ToolBehaviour,
    Tools,
    WaitFor,
    call,
    outcome,
    unexpected_empty_assistant,
)


def _shape(messages: list[Message]) -> list[tuple[str, str, str | None, list[str]]]:
    return [
        (m.role, m.content, m.tool_call_id, [c.id for c in (m.tool_calls or [])])
        for m in messages
    ]


def _assert_requests_clean(calls: list[StreamCall]) -> None:
    for c in calls:
        assert c.messages[0].role == "system"
        assert drop_unpaired_tool_calls(c.messages) == c.messages
        assert not unexpected_empty_assistant(c.messages)


async def test_completed_round_commits_in_protocol_order() -> None:
    """Completed round commits in protocol order."""
    tools = ScriptedToolRunner(
        {"light": ToolBehaviour(result="on"), "temp": ToolBehaviour(result="21C")}
    )
    provider = ScriptedProvider(
        [Text("One moment. "), Tools.of(call("t1", "light", entity="light.kitchen"))],
        [Tools.of(call("t2", "temp"), call("t3", "light", entity="light.hall"))],
        [Text("Done, it is 21 degrees.")],
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "lights on, and how warm?"))
        assert result.status == "completed"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert _shape(transcript) == [
            ("user", "lights on, and how warm?", None, []),
            ("assistant", "One moment. ", None, ["t1"]),
            ("tool", "on", "t1", []),
            ("assistant", "", None, ["t2", "t3"]),
            ("tool", "21C", "t2", []),
            ("tool", "on", "t3", []),
            ("assistant", "Done, it is 21 degrees.", None, []),
        ]
        assert not any(m.interrupted for m in transcript)
        assert transcript[1].tool_calls is not None
        assert transcript[1].tool_calls[0].name == "light"
        assert transcript[1].tool_calls[0].arguments == {"entity": "light.kitchen"}
        # what the model saw during the round follows the same order
        assert _shape(provider.calls[2].messages[1:]) == _shape(transcript[:-1])
        _assert_requests_clean(provider.calls)


async def test_history_accumulates_across_rounds() -> None:
    """History accumulates across rounds."""
    provider = ScriptedProvider([Text("A1")], [Text("A2")], [Text("A3")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        for text in ("q1", "q2", "q3"):
            assert (await outcome(rig.kernel.push("c1", text))).status == "completed"
        assert _shape(provider.calls[2].messages[1:]) == [
            ("user", "q1", None, []),
            ("assistant", "A1", None, []),
            ("user", "q2", None, []),
            ("assistant", "A2", None, []),
            ("user", "q3", None, []),
        ]


async def test_interrupted_round_commits_user_and_emitted_text_marked() -> None:
    """Interrupted round commits user and emitted text marked."""
    never = asyncio.Event()
    provider = ScriptedProvider()
    provider.on("first", [Text("Hel"), Text("lo"), WaitFor(never)])
    provider.on("second", [Text("Sure.")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        await out.wait_text("Hello")
        second = rig.kernel.push("c1", "second")
        assert (await outcome(first)).status == "interrupted"
        assert (await outcome(second)).status == "completed"

        req = provider.calls[1].messages
        assert _shape(req[1:]) == [
            ("user", "first", None, []),
            ("assistant", "Hello" + INTERRUPTED_MARKER, None, []),
            ("user", "second", None, []),
        ]
        assert req[2].interrupted is True
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.content, m.interrupted) for m in transcript] == [
            ("user", "first", transcript[0].interrupted),
            ("assistant", "Hello", True),
            ("user", "second", False),
            ("assistant", "Sure.", False),
        ]


async def test_interrupted_after_tool_commits_group_then_partial_text() -> None:
    """Interrupted after tool commits group then partial text."""
    never = asyncio.Event()
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider()
    provider.on(
        "lights",
        [Tools.of(call("t1", "light"))],
        [Text("The light "), Text("is"), WaitFor(never)],
    )
    provider.on("stop talking", [Text("ok")])
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "lights")
        await out.wait_text("The light is")
        second = rig.kernel.push("c1", "stop talking")
        cut = await outcome(first)
        assert cut.status == "interrupted"
        assert cut.text == "The light is"
        await outcome(second)
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert _shape(transcript[:4]) == [
            ("user", "lights", None, []),
            ("assistant", "", None, ["t1"]),
            ("tool", "on", "t1", []),
            ("assistant", "The light is", None, []),
        ]
        assert transcript[3].interrupted is True
        assert not unexpected_empty_assistant(transcript)


async def test_tool_calls_received_but_not_run_are_not_committed() -> None:
    """Tool calls received but not run are not committed."""
    never = asyncio.Event()
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider()
    # The tool-call delta arrives, then the stream hangs before it ends.
    provider.on(
        "lights", [Text("Okay. "), Tools.of(call("t1", "light")), WaitFor(never)]
    )
    provider.on("never mind", [Text("fine")])
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "lights")
        await out.wait_text("Okay. ")
        await provider.wait_calls(1)
        second = rig.kernel.push("c1", "never mind")
        assert (await outcome(first)).status == "interrupted"
        await outcome(second)
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert drop_unpaired_tool_calls(transcript) is transcript
        assert not any(m.tool_calls for m in transcript)
        assert not any(m.role == "tool" for m in transcript)
        assert _shape(transcript[:2]) == [
            ("user", "lights", None, []),
            ("assistant", "Okay. ", None, []),
        ]
        _assert_requests_clean(provider.calls)


async def test_superseded_input_commits_nothing() -> None:
    """Superseded input commits nothing."""
    provider = ScriptedProvider(default=[Text("answer")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        lost = rig.kernel.push("c1", "lost words")
        kept = rig.kernel.push("c1", "kept words")
        assert (await outcome(kept)).status == "completed"
        assert (await outcome(lost)).status == "superseded"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert all("lost" not in m.content for m in transcript)
        assert _shape(transcript) == [
            ("user", "kept words", None, []),
            ("assistant", "answer", None, []),
        ]


async def test_transcript_is_a_copy() -> None:
    """Transcript is a copy."""
    provider = ScriptedProvider(default=[Text("answer")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "hello"))
        copy1 = rig.kernel.transcript("c1")
        assert copy1 is not None and len(copy1) == 2
        copy1.clear()
        copy2 = rig.kernel.transcript("c1")
        assert copy2 is not None and len(copy2) == 2


# --------------------------------------------------------------------------- window


def _is_contiguous_slice(
    part: Sequence[tuple[object, ...]], whole: Sequence[tuple[object, ...]]
) -> bool:
    n = len(part)
    return any(list(whole[i : i + n]) == list(part) for i in range(len(whole) - n + 1))


async def test_history_is_never_trimmed_but_requests_are_by_whole_groups() -> None:
    """History is never trimmed but requests are by whole groups."""
    long = "word " * 40  # ~200 characters per message
    rounds = 8
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen " + long)})
    provider = ScriptedProvider()
    for i in range(rounds):
        provider.on(
            f"question {i} {long}",
            [Tools.of(call(f"t{i}", "look"))],
            [Text(f"answer {i} {long}")],
        )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", system_prompt="S", context_window=600)
        for i in range(rounds):
            res = await outcome(rig.kernel.push("c1", f"question {i} {long}"))
            assert res.status == "completed"

        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert len(transcript) == rounds * 4  # never trimmed
        whole = [(m.role, m.content, m.tool_call_id) for m in transcript]

        last = provider.calls[-1]
        assert last.messages[0].role == "system"
        assert last.messages[0].content.startswith("S")
        body = [(m.role, m.content, m.tool_call_id) for m in last.messages[1:]]
        assert len(body) < len(whole) - 1  # the request was trimmed
        # the oldest messages go first, as whole groups: the kept part is one slice
        assert _is_contiguous_slice(body, whole)
        assert body[0][0] != "tool"
        assert drop_unpaired_tool_calls(last.messages) is last.messages
        # the current round (user + its tool group) is never dropped
        assert body[-3:] == whole[-4:-1]
        # something older than the current round survived a 600-token window
        assert len(body) > 3
        _assert_requests_clean(provider.calls)


async def test_system_last_user_and_current_tool_groups_survive_tiny_window() -> None:
    """System last user and current tool groups survive tiny window."""
    long = "lorem ipsum " * 30
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen " + long)})
    provider = ScriptedProvider()
    provider.on("old question " + long, [Text("old answer " + long)])
    provider.on(
        "current " + long,
        [Tools.of(call("a", "look"))],
        [Tools.of(call("b", "look"))],
        [Text("final")],
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", system_prompt="SYSTEM " + long, context_window=1)
        await outcome(rig.kernel.push("c1", "old question " + long))
        assert (
            await outcome(rig.kernel.push("c1", "current " + long))
        ).status == "completed"

        assert len(provider.calls) == 4
        first_of_round = provider.calls[1]
        assert [(m.role, m.content) for m in first_of_round.messages] == [
            ("system", first_of_round.messages[0].content),
            ("user", "current " + long),
        ]
        assert first_of_round.messages[0].content.startswith("SYSTEM")
        third = provider.calls[3]
        assert [m.role for m in third.messages] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
            "tool",
        ]
        assert third.messages[1].content == "current " + long
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert transcript[0].content == "old question " + long
        assert len(transcript) == 8


async def test_every_request_passes_pairing_check_after_interruptions() -> None:
    """Every request passes pairing check after interruptions."""
    never = asyncio.Event()
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="r", gate=gate)})
    provider = ScriptedProvider()
    provider.on(
        "one", [Tools.of(call("x1", "slow"), call("x2", "slow"))], [Text("unused")]
    )
    provider.on("two", [Text("par"), Tools.of(call("y1", "slow")), WaitFor(never)])
    provider.on("three", [Text("done")])
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1")
        t1 = rig.kernel.push("c1", "one")
        await tools.wait_calls(1)
        t2 = rig.kernel.push("c1", "two")  # suppressed while x1/x2 run
        gate.set()
        await out.wait_text("par")
        await provider.wait_calls(2)
        t3 = rig.kernel.push("c1", "three")
        for t in (t1, t2, t3):
            await outcome(t)
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert drop_unpaired_tool_calls(transcript) is transcript
        assert [m.tool_call_id for m in transcript if m.role == "tool"] == ["x1", "x2"]
        _assert_requests_clean(provider.calls)


# ----------------------------------------------- interrupted answers for the model


async def test_the_model_is_told_where_its_answer_was_cut() -> None:
    """An interrupted answer carries a marker in requests, and nowhere else."""
    never = asyncio.Event()
    provider = ScriptedProvider()
    provider.on("story", [Text("Once upon "), Text("a time"), WaitFor(never)])
    provider.on("shorter", [Text("Fine.")])
    provider.on("again", [Text("Sure.")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "story")
        await out.wait_text("a time")
        second = rig.kernel.push("c1", "shorter")
        cut = await outcome(first)
        await outcome(second)
        await outcome(rig.kernel.push("c1", "again"))

        for request in provider.calls[1:]:
            assistant = request.messages[2]
            assert assistant.content == "Once upon a time" + INTERRUPTED_MARKER
        # the same rendered message (and its cached token estimate) every request
        state = rig.kernel._children["c1"]  # noqa: SLF001 - the cache is internal
        view = state.history[1].__dict__["_model_view"][1]
        assert view.__dict__["_token_cache"][0] is view.content
        assert INTERRUPTED_MARKER not in cut.text
        assert INTERRUPTED_MARKER not in out.text
        assert INTERRUPTED_MARKER not in rig.kernel.transcript_page("c1")
        assert INTERRUPTED_MARKER not in rig.kernel.transcript_page("c1", fmt="raw")
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert transcript[1].content == "Once upon a time"


def test_render_for_model_joins_a_partial_and_the_failure_reply() -> None:
    """Roles keep alternating: a heard partial and the reply become one message."""
    history = [
        Message("user", "weather"),
        Message("assistant", "The forecast ", interrupted=True),
        Message("assistant", "Sorry.", failed=True),
        Message("user", "again"),
    ]
    rendered = render_for_model(history)
    assert [(m.role, m.content) for m in rendered] == [
        ("user", "weather"),
        ("assistant", "The forecast" + INTERRUPTED_MARKER + " Sorry."),
        ("user", "again"),
    ]
    assert history[1].content == "The forecast "  # the history is not touched
    clean = [Message("user", "a"), Message("assistant", "b")]
    assert render_for_model(clean) == clean
