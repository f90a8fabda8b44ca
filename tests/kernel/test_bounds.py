"""What a model's answer may make a child do is bounded (issue 16 §3).

Tool turns per input, tool calls per response, tool-call arguments and the length of
one answer each have a bound; the excess is answered so that the model can read it,
the history stays paired and the conversation goes on. A barge-in during a group of
tool calls lets the started call complete and skips the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import json
from typing import Any

from hypothesis import given, settings, strategies as st

from custom_components.rtvoice.kernel import (
    NOT_RUN_INTERRUPTED,
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    Message,
    Ticket,
    ToolCall,
    ToolSpec,
    drop_unpaired_tool_calls,
)
from custom_components.rtvoice.kernel.bounds import (
    DEFAULT_MAX_TOOL_CALLS,
    DEFAULT_MAX_TOOL_TURNS,
    MAX_ARGUMENT_DEPTH,
    MAX_TOOL_TURNS_CEILING,
    argument_problem,
    bounded_call,
)
from custom_components.rtvoice.kernel.openai_provider import (
    MAX_RAW_ARGUMENT_CHARS,
    ToolCallAssembler,
    build_request_body,
)
from tests.kernel.fakes import (
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    StreamCall,
    Text,
    ToolBehaviour,
    Tools,
    call,
    outcome,
    rt_pair,
    wait,
)


def always_tools(record: StreamCall) -> list[Any]:
    """Answer every request that offers tools with another call (a runaway model)."""
    if record.tools:
        return [Tools.of(call(f"t{record.index}", "look"))]
    return [Text("I give up.")]


def nested(depth: int) -> dict[str, Any]:
    """Arguments nested ``depth`` levels deep."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def paired(history: list[Message]) -> bool:
    """Every tool call has its result and every result its call."""
    return drop_unpaired_tool_calls(list(history)) is not None and {
        c.id for m in history for c in (m.tool_calls or [])
    } == {m.tool_call_id for m in history if m.role == "tool"}


# ── tool turns per input ────────────────────────────────────────────────────


async def test_a_model_that_always_calls_tools_stops_at_the_default() -> None:
    """The default (8 tool turns) ends the round; the model then answers without tools."""
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    provider = ScriptedProvider(default=always_tools)
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "look around"))
        assert result.status == "completed"
        assert result.text == "I give up."
        assert len(tools.records) == DEFAULT_MAX_TOOL_TURNS
        assert len(provider.calls) == DEFAULT_MAX_TOOL_TURNS + 1
        assert provider.calls[-1].tools == []


async def test_zero_tool_turns_means_the_ceiling_not_unlimited() -> None:
    """``max_tool_turns=0`` (older settings' "unlimited") is the hard ceiling."""
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    provider = ScriptedProvider(default=always_tools)
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", max_tool_turns=0)
        result = await outcome(rig.kernel.push("c1", "look around"))
        assert result.status == "completed"
        assert len(tools.records) == MAX_TOOL_TURNS_CEILING
        await rig.spawn("c2", max_tool_turns=10_000)
        await outcome(rig.kernel.push("c2", "look around"))
        assert len(tools.records) == 2 * MAX_TOOL_TURNS_CEILING


# ── tool calls per response ─────────────────────────────────────────────────


async def test_calls_beyond_the_cap_are_answered_not_run() -> None:
    """3,000 calls in one response: 16 run, every other one gets an error result."""
    tools = ScriptedToolRunner({"toggle": ToolBehaviour(result="toggled")})
    calls = [call(f"t{i}", "toggle") for i in range(3000)]
    provider = ScriptedProvider([Tools.of(*calls)], [Text("Done.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "toggle it a lot"))
        assert result.status == "completed"
        assert len(tools.records) == DEFAULT_MAX_TOOL_CALLS
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None and paired(transcript)
        results = [m.content for m in transcript if m.role == "tool"]
        assert len(results) == 3000
        assert all("at most 16 tool calls" in r for r in results[16:])
        # The model read the refusals in its next request.
        assert "at most 16" in provider.calls[1].messages[-1].content


async def test_a_barge_in_skips_the_calls_not_yet_started() -> None:
    """A "STOP!" during a group: the started call completes, the rest do not run."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"toggle": ToolBehaviour(result="toggled", gate=gate)})
    provider = ScriptedProvider()
    provider.on("blink", [Tools.of(*(call(f"t{i}", "toggle") for i in range(10)))])
    provider.on("STOP!", [Text("Stopped.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        blink = rig.kernel.push("c1", "blink")
        first = await tools.wait_calls(1)
        stop = rig.kernel.push("c1", "STOP!")
        gate.set()
        assert (await outcome(blink)).status == "interrupted"
        assert (await outcome(stop)).text == "Stopped."
        assert first.result == "toggled"  # the started call completed
        assert len(tools.records) == 1
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None and paired(transcript)
        results = [m.content for m in transcript if m.role == "tool"]
        assert results == ["toggled"] + [NOT_RUN_INTERRUPTED] * 9


async def test_interrupt_skips_the_calls_not_yet_started() -> None:
    """``interrupt()`` (a barge-in without words) skips them too."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"toggle": ToolBehaviour(result="toggled", gate=gate)})
    provider = ScriptedProvider(
        [Tools.of(call("t0", "toggle"), call("t1", "toggle"), call("t2", "toggle"))]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "blink")
        await tools.wait_calls(1)
        assert rig.kernel.interrupt("c1")
        gate.set()
        assert (await outcome(ticket)).status == "interrupted"
        assert len(tools.records) == 1


# ── tool-call arguments ─────────────────────────────────────────────────────


class WireProvider(ScriptedProvider):
    """A scripted provider that builds the real request body of every request."""

    def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Build the body (as the OpenAI provider does), then play the script."""
        json.dumps(build_request_body("m", messages, tools))
        return super().stream(messages, tools)


async def test_arguments_nested_600_deep_do_not_kill_the_conversation() -> None:
    """A 600-deep argument is a tool error; the next input reaches the model."""
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    deep = ToolCall(id="t1", name="look", arguments=nested(600))
    provider = WireProvider()
    provider.on("look deep", [Tools.of(deep)], [Text("That did not work.")])
    provider.on("hello", [Text("Hello!")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "look deep"))
        assert result.status == "completed"
        assert tools.records == []  # not run
        assert "nested deeper" in provider.calls[1].messages[-1].content
        assert (await outcome(rig.kernel.push("c1", "hello"))).text == "Hello!"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None and paired(transcript)


async def test_unreadable_arguments_are_an_error_result() -> None:
    """Arguments that are no JSON values (or break on reading) are not run."""

    class Hostile(dict[str, Any]):
        def items(self) -> Any:
            raise RuntimeError("boom")

    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    provider = ScriptedProvider(
        [
            Tools.of(
                ToolCall(id="t1", name="look", arguments=Hostile()),
                ToolCall(id="t2", name="look", arguments={"x": object()}),
                ToolCall(id="", name="look", arguments={"ok": 1}),
            )
        ],
        [Text("ok")],
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        assert (await outcome(rig.kernel.push("c1", "x"))).status == "completed"
        assert [r.call.arguments for r in tools.records] == [{"ok": 1}]
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None and paired(transcript)
        errors = [m.content for m in transcript if m.role == "tool"][:2]
        assert "could not be read" in errors[0]
        assert "not a JSON value" in errors[1]


def test_the_provider_refuses_raw_arguments_too_long_or_too_deep() -> None:
    """Streamed arguments past the size bound, or nested past the parser, are errors."""
    assembler = ToolCallAssembler()
    assembler.add(index=0, call_id="a", name="look", arguments="[" * 100_000)
    assembler.add(index=1, call_id="b", name="look", arguments='{"x": "')
    for _ in range(10):
        assembler.add(
            index=1, call_id=None, name=None, arguments="y" * MAX_RAW_ARGUMENT_CHARS
        )
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    assembler.add(index=2, call_id="c", name="look", arguments=deep)
    calls = [bounded_call(c, i) for i, c in enumerate(assembler.finish())]
    assert all(c.error for c in calls)
    assert all(c.arguments == {} for c in calls)
    assert "longer than" in (calls[1].error or "")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None, database=None)
@given(value=json_values, depth=st.integers(1, 40))
def test_bounded_call_never_raises_and_keeps_only_bounded_arguments(
    value: Any, depth: int
) -> None:
    """Any arguments: the call is kept as is when fine, else it carries an error.

    A kept call's arguments are within the bounds, so a deep copy and a JSON dump
    of them cannot fail.
    """
    arguments = nested(depth)
    inner = arguments
    while inner:
        inner = inner["a"]
    inner["v"] = value
    checked = bounded_call(ToolCall(id="t", name="look", arguments=arguments), 0)
    if checked.error is None:
        assert checked.arguments is arguments
        assert argument_problem(arguments) is None
        json.dumps(checked.arguments)
    else:
        assert checked.arguments == {}
    if depth > MAX_ARGUMENT_DEPTH:
        assert checked.error is not None


@settings(max_examples=30, deadline=None, database=None)
@given(
    n_calls=st.integers(0, 40),
    cap=st.integers(1, 20),
    barge_at=st.none() | st.integers(0, 40),
)
async def test_a_group_of_any_size_stays_paired_and_bounded(
    n_calls: int, cap: int, barge_at: int | None
) -> None:
    """Any group, cap and barge-in point: paired history, at most min(cap, k+1) run."""
    channels = ChannelRegistry()
    rt_pair(channels, "c", lambda _d: None)
    ran: list[str] = []
    pushed: list[Ticket] = []
    kernel: Kernel

    class Runner:
        def specs(self) -> list[ToolSpec]:
            return [ToolSpec("toggle", "", {"type": "object"})]

        async def call(self, tool_call: ToolCall) -> str:
            ran.append(tool_call.id)
            if barge_at is not None and len(ran) - 1 == barge_at and not pushed:
                pushed.append(kernel.push("c", "STOP!"))
            return "toggled"

    group = [call(f"t{i}", "toggle") for i in range(n_calls)]
    provider = ScriptedProvider()
    provider.on("go", [Tools.of(*group)] if group else [Text("nothing")], [Text("ok")])
    provider.on("STOP!", [Text("stopped")])
    kernel = Kernel(provider, channels, tools=Runner())
    await kernel.spawn(
        ChildOptions(id="c", input="c-in", output="c-out", max_tool_calls=cap)
    )
    ticket = kernel.push("c", "go")
    await wait(asyncio.shield(ticket.outcome))
    for stop in pushed:
        assert (await wait(asyncio.shield(stop.outcome))).text == "stopped"
    transcript = kernel.transcript("c")
    await kernel.stop_all()
    assert transcript is not None and paired(transcript)
    limit = min(cap, n_calls)
    if barge_at is not None and barge_at < limit:
        limit = barge_at + 1
    assert len(ran) == limit
    assert len([m for m in transcript if m.role == "tool"]) == n_calls


# ── one answer's length ─────────────────────────────────────────────────────


class EndlessProvider:
    """A model that never stops talking."""

    def __init__(self) -> None:
        """Count the streams closed early."""
        self.closed = 0

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Yield words for ever (until closed)."""
        try:
            while True:
                yield Delta(content="blah blah ")
                await asyncio.sleep(0)
        finally:
            self.closed += 1


async def test_an_endless_answer_ends_cleanly_at_its_bound() -> None:
    """The answer ends at a word within the bound; the stream is closed; the round completes."""
    provider = EndlessProvider()
    channels = ChannelRegistry()
    heard: list[str] = []
    rt_pair(channels, "c", heard.append)
    kernel = Kernel(provider, channels)  # type: ignore[arg-type]
    await kernel.spawn(
        ChildOptions(id="c", input="c-in", output="c-out", max_answer_chars=495)
    )
    try:
        result = await outcome(kernel.push("c", "talk"))
        assert result.status == "completed"
        assert 485 <= len(result.text) <= 495
        assert result.text.endswith("blah")
        assert "".join(heard) == result.text
        assert provider.closed == 1
        transcript = kernel.transcript("c")
        assert transcript is not None
        assert transcript[-1].content == result.text
    finally:
        await kernel.stop_all()
