"""Edges of the kernel: bad arguments, failing callbacks, bounded stop, archive limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import gc
import logging

import pytest

from custom_components.rtvoice.kernel import (
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    KernelError,
    Message,
    ToolSpec,
)
from tests.kernel.fakes import (
    OutputRecorder,
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    call,
    outcome,
    rt_pair,
)


async def test_bad_arguments_are_kernel_errors() -> None:
    """An empty child id and an empty input are refused with a clear error."""
    async with Rig() as rig:
        rig.pair("c1")
        with pytest.raises(KernelError, match="needs an id"):
            await rig.kernel.spawn(ChildOptions("", "c1-in", "c1-out"))
        await rig.spawn("c1")
        with pytest.raises(KernelError, match="already exists"):
            await rig.kernel.spawn(ChildOptions("c1", "c1-in", "c1-out"))
        with pytest.raises(KernelError, match="empty"):
            rig.kernel.push("c1", "   ")


async def test_a_request_is_the_system_prompt_plus_the_history() -> None:
    """The next request of a child is its system prompt plus its history."""
    async with Rig(ScriptedProvider([Text("Hi.")], [Text("Bye.")])) as rig:
        await rig.spawn("c1", system_prompt="Be brief.")
        await outcome(rig.kernel.push("c1", "hello"))
        await outcome(rig.kernel.push("c1", "bye"))
        messages = rig.provider.calls[1].messages
        assert [(m.role, m.content) for m in messages] == [
            ("system", "Be brief."),
            ("user", "hello"),
            ("assistant", "Hi."),
            ("user", "bye"),
        ]


async def test_close_all_hands_every_child_off() -> None:
    """close_all stops every child and archives each non-empty transcript."""
    async with Rig(ScriptedProvider(default=lambda: [Text("ok")])) as rig:
        for name in ("a", "b"):
            await rig.spawn(name)
            await outcome(rig.kernel.push(name, f"hello {name}"))
        assert await rig.kernel.close_all() == 2
        assert rig.kernel.children() == []
        assert sorted(c[0] for c in rig.closed) == ["a", "b"]
        assert sorted(rig.kernel.archived()) == ["a", "b"]


async def test_archive_keeps_only_the_newest_transcripts() -> None:
    """Closed transcripts are kept up to the archive limit, oldest dropped first."""
    channels = ChannelRegistry()
    kernel = Kernel(
        ScriptedProvider(default=lambda: [Text("ok")]), channels, archive_limit=2
    )
    for name in ("a", "b", "c"):
        rt_pair(channels, name, OutputRecorder().sync_handler)
        await kernel.spawn(ChildOptions(name, f"{name}-in", f"{name}-out"))
        await outcome(kernel.push(name, "hi"))
        await kernel.close(name)
    assert kernel.archived() == ["b", "c"]
    assert kernel.transcript("a") is None


async def test_failing_callbacks_and_outputs_never_break_a_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """on_closed, on_state, ask_parent delivery and output handlers may raise."""

    def boom(*_args: object) -> None:
        raise RuntimeError("callback failed")

    channels = ChannelRegistry()
    rt_pair(channels, "c", boom)
    provider = ScriptedProvider(
        [Tools.of(call("a1", "ask_parent", text="dinner?"))], [Text("Asked.")]
    )
    kernel = Kernel(
        provider, channels, on_closed=boom, on_state=boom, on_ask_parent=boom
    )
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    with caplog.at_level(logging.ERROR):
        result = await outcome(kernel.push("c", "ask about dinner"))
        assert result.status == "completed" and result.text == "Asked."
        assert await kernel.close("c") == 4
    logged = caplog.text
    assert "Output channel c-out of c failed" in logged
    assert "on_state callback failed" in logged
    assert "ask_parent delivery failed" in logged
    assert "on_closed callback failed" in logged


async def test_stop_cancels_a_tool_that_outlives_the_bound() -> None:
    """Stop waits for a running tool only up to its bound, then cancels it.

    The finished calls of the group are committed with their results; the cancelled
    one is left out so the history stays paired.
    """
    never = asyncio.Event()
    tools = ScriptedToolRunner(
        {"quick": ToolBehaviour(result="done"), "stuck": ToolBehaviour(gate=never)}
    )
    provider = ScriptedProvider(
        [Tools.of(call("q1", "quick"), call("s1", "stuck"), content="Working. ")]
    )
    channels = ChannelRegistry()
    rt_pair(channels, "c", OutputRecorder().sync_handler)
    kernel = Kernel(provider, channels, tools=tools, stop_tool_timeout=0.01)
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    ticket = kernel.push("c", "do both")
    stuck = await tools.wait_calls(2)
    await kernel.stop("c")
    assert stuck.cancelled
    result = await outcome(ticket)
    assert result.status == "interrupted" and result.error == "stopped"
    await kernel.stop_all()  # stopping again is harmless


async def test_partial_group_is_committed_when_a_stop_cuts_it() -> None:
    """A group cut mid-way keeps the calls that finished, paired with results."""
    never = asyncio.Event()
    tools = ScriptedToolRunner(
        {"quick": ToolBehaviour(result="done"), "stuck": ToolBehaviour(gate=never)}
    )
    provider = ScriptedProvider(
        [Tools.of(call("q1", "quick"), call("s1", "stuck"), content="Working. ")]
    )
    channels = ChannelRegistry()
    rt_pair(channels, "c", OutputRecorder().sync_handler)
    kernel = Kernel(
        provider, channels, tools=tools, on_closed=None, stop_tool_timeout=0.01
    )
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    kernel.push("c", "do both")
    await tools.wait_calls(2)
    assert await kernel.close("c") == 3
    transcript = kernel.transcript("c")
    assert transcript is not None
    assert [(m.role, m.tool_call_id) for m in transcript] == [
        ("user", None),
        ("assistant", None),
        ("tool", "q1"),
    ]
    assert transcript[1].tool_calls is not None
    assert [c.id for c in transcript[1].tool_calls] == ["q1"]


async def test_model_ignoring_the_tool_limit_gets_error_results() -> None:
    """After max_tool_turns no tools are offered; calls anyway are answered, not run."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"))], [Tools.of(call("t2", "light"))]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", max_tool_turns=1)
        result = await outcome(rig.kernel.push("c1", "lights"))
        assert result.status == "completed"
        assert provider.calls[1].tools == []  # the limit: no tools offered
        assert len(tools.records) == 1  # t2 was never run
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert "limit" in transcript[-1].content


async def test_tool_call_without_a_runner_is_an_error_result() -> None:
    """With no tool runner a call still gets a readable error result."""
    provider = ScriptedProvider([Tools.of(call("t1", "light"))], [Text("Sorry.")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        assert (await outcome(rig.kernel.push("c1", "lights"))).text == "Sorry."
        tool_results = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert "unknown tool" in tool_results[0].content


async def test_interrupt_before_the_model_call_keeps_the_input() -> None:
    """interrupt() before the model was called ends the round, input committed.

    The tool runner's ``specs()`` runs at the start of a round, before the model
    call: it is the hook that interrupts there, deterministically.
    """
    provider = ScriptedProvider(default=lambda: [Text("answer")])
    kernel_box: list[Kernel] = []

    class InterruptingRunner(ScriptedToolRunner):
        def specs(self) -> list[ToolSpec]:
            assert kernel_box[0].interrupt("c1") is True
            return super().specs()

    channels = ChannelRegistry()
    rt_pair(channels, "c1", OutputRecorder().sync_handler)
    kernel = Kernel(provider, channels, tools=InterruptingRunner({}))
    kernel_box.append(kernel)
    await kernel.spawn(ChildOptions("c1", "c1-in", "c1-out"))
    result = await outcome(kernel.push("c1", "one"))
    assert result.status == "interrupted" and result.text == ""
    assert provider.calls == []  # the model was never asked
    transcript = kernel.transcript("c1")
    assert transcript is not None
    assert [(m.role, m.content) for m in transcript] == [("user", "one")]
    assert kernel.interrupt("c1") is False  # nothing running now
    await kernel.stop_all()


async def test_barge_ins_leave_no_cyclic_garbage() -> None:
    """Interrupted rounds are freed by refcounting, not left to the cyclic GC.

    A cancelled task keeps its traceback, whose frames hold the round; if the round
    kept its task too, every barge-in would leave a cycle whose collection pauses the
    loop (that showed up as cancel latency in scripts/bench).
    """
    first_delta = asyncio.Event()

    class Endless:
        async def stream(
            self, messages: list[Message], tools: list[ToolSpec]
        ) -> AsyncIterator[Delta]:
            while True:
                yield Delta("x")
                first_delta.set()
                await asyncio.sleep(0)

    channels = ChannelRegistry()
    rt_pair(channels, "c", OutputRecorder().sync_handler)
    kernel = Kernel(Endless(), channels)
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    gc.collect()
    gc.disable()
    try:
        for index in range(20):
            first_delta.clear()
            kernel.push("c", f"input {index}")
            await first_delta.wait()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leaked = [o for o in gc.garbage if type(o).__name__ == "_Round"]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await kernel.stop_all()
    assert leaked == []


class _SlowCloseStream:
    """A stream whose ``aclose`` has to wait (e.g. for the HTTP response to close)."""

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release
        self.sent = False
        self.close_started = asyncio.Event()
        self.close_finished = asyncio.Event()
        self.forever = asyncio.Event()

    def __aiter__(self) -> _SlowCloseStream:
        return self

    async def __anext__(self) -> Delta:
        if not self.sent:
            self.sent = True
            return Delta(content="Once upon")
        await self.forever.wait()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        self.close_started.set()
        await self.release.wait()  # a second cancel lands here
        self.close_finished.set()


class _SlowCloseProvider:
    """First call: a stream with a slow ``aclose``; later calls answer at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.first = _SlowCloseStream(self.release)
        self.calls = 0

    def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        self.calls += 1
        if self.calls == 1:
            return self.first
        return self._answer()

    async def _answer(self) -> AsyncIterator[Delta]:
        yield Delta(content="ok")


async def test_a_second_cancel_during_stream_cleanup_does_not_skip_aclose() -> None:
    """A second barge-in while aclose() runs: the close still completes."""
    provider = _SlowCloseProvider()
    channels = ChannelRegistry()
    recorder = OutputRecorder()
    rt_pair(channels, "c", recorder.sync_handler)
    kernel = Kernel(provider, channels)
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    first = kernel.push("c", "story")
    await recorder.wait_text("Once upon")
    kernel.push("c", "stop")  # first cancel: the kernel closes the stream
    await asyncio.wait_for(provider.first.close_started.wait(), 5)
    last = kernel.push("c", "no, go on")  # second cancel, during aclose()
    await asyncio.sleep(0)
    assert not provider.first.close_finished.is_set()
    assert provider.calls == 1  # no new round while the old stream still closes
    provider.release.set()
    await asyncio.wait_for(provider.first.close_finished.wait(), 5)
    assert (await outcome(first)).status == "interrupted"
    assert (await outcome(last)).text == "ok"
    await kernel.stop_all()
