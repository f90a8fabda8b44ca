"""The slot (latest wins) and rounds: DESIGN 4.2, 4.3 and the outcomes of 4.9."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging

import pytest

from custom_components.rtvoice.kernel import KernelError, Message, Outcome
from tests.kernel.fakes import (
    Mark,
    OutputRecorder,
    Raise,
    Rig,
    Script,
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
    wait,
    yield_many,
)

# --------------------------------------------------------------------------- slot


async def test_push_never_blocks_and_returns_ticket_with_monotonic_seq() -> None:
    """Push never blocks and returns ticket with monotonic seq."""
    assert not inspect.iscoroutinefunction(type(Rig().kernel).push)
    async with Rig(ScriptedProvider(default=[Text("ok")])) as rig:
        await rig.spawn("c1")
        tickets = [rig.kernel.push("c1", f"t{i}") for i in range(5)]
        seqs = [t.seq for t in tickets]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 5
        last = await outcome(tickets[-1])
        assert last.status == "completed"
        later = rig.kernel.push("c1", "again")
        assert later.seq > seqs[-1]
        await outcome(later)


async def test_overwritten_input_is_superseded_and_counted_dropped() -> None:
    """Overwritten input is superseded and counted dropped."""
    provider = ScriptedProvider(default=[Text("answer")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        second = rig.kernel.push("c1", "second")  # same tick: first never taken

        done = await outcome(second)
        gone = await outcome(first)
        assert done.status == "completed"
        assert gone.status == "superseded"
        assert gone.text == ""

        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.dropped == 1
        # the superseded input never reached the model and nothing was committed
        assert [c.user_text for c in provider.calls] == ["second"]
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.content for m in transcript if m.role == "user"] == ["second"]


async def test_take_clears_slot_no_rerun_of_same_input() -> None:
    """Take clears slot no rerun of same input."""
    provider = ScriptedProvider(default=[Text("a")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "once"))
        await yield_many()
        assert len(provider.calls) == 1
        stats = rig.kernel.stats("c1")
        assert stats is not None and stats.pending is False


async def test_idle_child_calls_nothing() -> None:
    """Idle child calls nothing."""
    provider = ScriptedProvider(default=[Text("a")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        await yield_many()
        assert provider.calls == []
        stats = rig.kernel.stats("c1")
        assert stats is not None and stats.rounds == 0 and stats.pending is False
        await outcome(rig.kernel.push("c1", "one round"))
        await yield_many()
        assert len(provider.calls) == 1
        # idle = awaiting an event: no timer is armed (no polling)
        scheduled = getattr(asyncio.get_running_loop(), "_scheduled", [])
        assert [h for h in scheduled if not h.cancelled()] == []


async def test_level_triggered_wake_runs_exactly_one_round_with_newest_text() -> None:
    """Level triggered wake runs exactly one round with newest text."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider()
    provider.on("A", [Tools.of(call("t1", "slow"))], [Text("never: superseded")])
    provider.on("E", [Text("fresh")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "A")
        await tools.wait_calls(1)
        later = [rig.kernel.push("c1", text) for text in ("B", "C", "D", "E")]
        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.pending is True
        assert stats.suppressed_cancels == 4
        gate.set()

        newest = await outcome(later[-1])
        assert newest.status == "completed"
        assert newest.text == "fresh"
        for ticket in later[:-1]:
            assert (await outcome(ticket)).status == "superseded"
        assert (await outcome(first)).status == "interrupted"

        # the round for A made one model call; then exactly one round, with E
        assert [c.user_text for c in provider.calls] == ["A", "E"]
        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.dropped == 3
        assert stats.rounds == 2
        assert stats.pending is False


# --------------------------------------------------------------------------- streaming


async def test_each_delta_reaches_output_at_once_and_completed_has_all_text() -> None:
    """Each delta reaches output at once and completed has all text."""
    gate = asyncio.Event()
    provider = ScriptedProvider([Text("Hel"), Text("lo"), WaitFor(gate), Text(" you")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "hi")
        # Both deltas arrive while the stream is still blocked: nothing is batched.
        await out.wait_text("Hello")
        assert out.deltas == ["Hel", "lo"]
        assert not ticket.outcome.done()
        gate.set()
        result = await outcome(ticket)
        assert result.status == "completed"
        assert result.text == "Hello you"
        assert out.deltas == ["Hel", "lo", " you"]


async def test_async_output_handler_is_awaited() -> None:
    """Async output handler is awaited."""
    provider = ScriptedProvider([Text("a"), Text("b")])
    async with Rig(provider, async_output=True) as rig:
        out = await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "hi"))
        assert result.status == "completed"
        assert out.deltas == ["a", "b"]


async def test_push_cancels_streaming_round_and_closes_stream() -> None:
    """Push cancels streaming round and closes stream."""
    never = asyncio.Event()
    provider = ScriptedProvider(
        [Text("Hel"), Text("lo"), WaitFor(never), Text("NOT SAID")],
        [Text("Second answer")],
    )
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        await out.wait_text("Hello")
        second = rig.kernel.push("c1", "second")

        cut = await outcome(first)
        assert cut.status == "interrupted"
        assert cut.text == "Hello"
        # the stream was closed at once (upstream released), not left to the GC
        assert provider.calls[0].closed.is_set()
        done = await outcome(second)
        assert done.status == "completed"
        assert done.text == "Second answer"
        assert "NOT SAID" not in out.text
        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.interrupted_rounds == 1
        assert stats.suppressed_cancels == 0


async def test_cancel_while_kernel_sits_in_output_handler_still_closes_stream() -> None:
    """Cancel while kernel sits in output handler still closes stream."""
    handler_gate = asyncio.Event()
    provider = ScriptedProvider([Text("Hel"), Text("lo")], [Text("B")])
    async with Rig(provider, async_output=True) as rig:
        rig.pair("c1", OutputRecorder(gate=handler_gate))
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        # kernel is awaiting the handler: the generator is suspended at a yield,
        # so only an explicit aclose() can release it
        await wait(rig.outputs["c1"].in_handler.wait())
        second = rig.kernel.push("c1", "second")
        cut = await outcome(first)
        assert cut.status == "interrupted"
        assert provider.calls[0].closed.is_set()
        handler_gate.set()
        assert (await outcome(second)).status == "completed"


async def test_interrupt_cancels_running_round_without_new_input() -> None:
    """Interrupt cancels running round without new input."""
    never = asyncio.Event()
    provider = ScriptedProvider([Text("Partial"), WaitFor(never)], [Text("next")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        assert rig.kernel.interrupt("c1") is False  # nothing running
        ticket = rig.kernel.push("c1", "hi")
        await out.wait_text("Partial")
        assert rig.kernel.interrupt("c1") is True
        cut = await outcome(ticket)
        assert cut.status == "interrupted"
        assert cut.text == "Partial"
        assert provider.calls[0].closed.is_set()
        await yield_many()
        assert len(provider.calls) == 1  # no new round without new input
        assert rig.kernel.interrupt("c1") is False
        # the child keeps working
        assert (await outcome(rig.kernel.push("c1", "again"))).status == "completed"


async def test_interrupt_unknown_child() -> None:
    """Interrupt unknown child."""
    async with Rig() as rig:
        with contextlib.suppress(KernelError):
            assert rig.kernel.interrupt("ghost") is False


async def test_model_call_started_but_nothing_emitted_is_interrupted() -> None:
    """Model call started but nothing emitted is interrupted."""
    never = asyncio.Event()
    provider = ScriptedProvider([WaitFor(never)], [Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        await provider.wait_calls(1)
        second = rig.kernel.push("c1", "second")
        cut = await outcome(first)
        assert cut.status == "interrupted"
        assert cut.text == ""
        await outcome(second)
        # user input of the interrupted round was committed, no empty assistant
        assert [(m.role, m.content) for m in provider.calls[1].messages[1:]] == [
            ("user", "first"),
            ("user", "second"),
        ]
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.content) for m in transcript[:2]] == [
            ("user", "first"),
            ("user", "second"),
        ]
        assert not unexpected_empty_assistant(transcript)


# --------------------------------------------------------------------------- tools


async def test_push_during_tool_is_suppressed_tool_completes_newest_runs_next() -> None:
    """Push during tool is suppressed tool completes newest runs next."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="light on", gate=gate)})
    provider = ScriptedProvider()
    provider.on(
        "turn on the light",
        [Text("One moment. "), Tools.of(call("t1", "light", entity="light.kitchen"))],
        [Text("should not run: superseded check before the model call")],
    )
    provider.on("actually, what time is it", [Text("Newest answer")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "turn on the light")
        record = await tools.wait_calls(1)
        newer = rig.kernel.push("c1", "actually, what time is it")
        await yield_many()
        assert not record.finished.is_set()  # the tool was not cancelled
        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.suppressed_cancels == 1
        assert stats.pending is True

        gate.set()
        cut = await outcome(first)
        done = await outcome(newer)
        assert record.result == "light on" and not record.cancelled
        # a round ended at a later superseded check is interrupted (not superseded)
        assert cut.status == "interrupted"
        assert done.status == "completed"
        assert done.text == "Newest answer"

        # no model call for the old round after the tool: superseded check
        assert len(provider.calls) == 2
        req = provider.calls[1]
        assert req.user_text == "actually, what time is it"
        body = [(m.role, m.content, m.tool_call_id) for m in req.messages[1:]]
        assert body[0] == ("user", "turn on the light", None)
        assert body[1][:2] == ("assistant", "One moment. ")
        assert req.messages[2].tool_calls is not None
        assert [c.id for c in req.messages[2].tool_calls] == ["t1"]
        assert body[2] == ("tool", "light on", "t1")
        assert body[-1] == ("user", "actually, what time is it", None)
        assert len(body) == 4
        stats = rig.kernel.stats("c1")
        assert stats is not None and stats.tool_calls == 1


async def test_critical_section_is_a_counter_across_two_tools_of_one_turn() -> None:
    """Critical section is a counter across two tools of one turn."""
    g1, g2 = asyncio.Event(), asyncio.Event()
    tools = ScriptedToolRunner(
        {
            "one": ToolBehaviour(result="r1", gate=g1),
            "two": ToolBehaviour(result="r2", gate=g2),
        }
    )
    provider = ScriptedProvider()
    provider.on(
        "do both", [Tools.of(call("t1", "one"), call("t2", "two"))], [Text("unused")]
    )
    provider.on("later", [Text("fine")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "do both")
        one = await tools.wait_calls(1)
        g1.set()
        await wait(one.finished.wait())
        two = await tools.wait_calls(2)
        assert not two.finished.is_set()
        later = rig.kernel.push("c1", "later")  # tool two still runs: protected
        await yield_many()
        assert not two.finished.is_set()
        stats = rig.kernel.stats("c1")
        assert stats is not None and stats.suppressed_cancels == 1
        g2.set()
        assert (await outcome(first)).status == "interrupted"
        assert (await outcome(later)).text == "fine"
        assert not one.cancelled and not two.cancelled
        assert two.result == "r2"
        req = provider.calls[1]
        assert [
            (m.role, m.tool_call_id, m.content)
            for m in req.messages
            if m.role == "tool"
        ] == [
            ("tool", "t1", "r1"),
            ("tool", "t2", "r2"),
        ]


async def test_interrupt_during_tool_does_not_cancel_the_tool() -> None:
    """Interrupt during tool does not cancel the tool."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="done", gate=gate)})
    provider = ScriptedProvider([Tools.of(call("t1", "slow"))], default=[Text("after")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "go")
        record = await tools.wait_calls(1)
        rig.kernel.interrupt("c1")
        await yield_many()
        assert not record.finished.is_set()
        gate.set()
        result = await outcome(ticket)
        assert result.status in ("completed", "interrupted")
        assert record.result == "done" and not record.cancelled
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert any(m.role == "tool" and m.tool_call_id == "t1" for m in transcript)


async def test_tool_error_becomes_a_tool_result_the_model_reads() -> None:
    """Tool error becomes a tool result the model reads."""
    tools = ScriptedToolRunner({"boom": ToolBehaviour(error=RuntimeError("kaboom-42"))})
    provider = ScriptedProvider([Tools.of(call("t1", "boom"))], [Text("Sorry.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "break it"))
        assert result.status == "completed"
        assert result.text == "Sorry."
        assert len(provider.calls) == 2
        tool_msgs = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert len(tool_msgs) == 1
        assert tool_msgs[0].tool_call_id == "t1"
        assert "kaboom-42" in tool_msgs[0].content
        # the child keeps working
        provider.add([Text("still here")])
        assert (await outcome(rig.kernel.push("c1", "hello"))).status == "completed"


async def test_tool_call_with_invalid_arguments_is_answered_without_running() -> None:
    """Tool call with invalid arguments is answered without running."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="ran")})
    provider = ScriptedProvider(
        [
            Tools.of(
                call("t1", "light", error="arguments are not valid JSON: '{bright'")
            )
        ],
        [Text("Let me retry.")],
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "light please"))
        assert result.status == "completed"
        assert tools.records == []  # the tool never ran
        tool_msgs = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert len(tool_msgs) == 1
        assert tool_msgs[0].tool_call_id == "t1"
        assert "not valid JSON" in tool_msgs[0].content


async def test_unknown_tool_name_becomes_error_result() -> None:
    """Unknown tool name becomes error result."""
    tools = ScriptedToolRunner({})
    provider = ScriptedProvider([Tools.of(call("t1", "nope"))], [Text("ok")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        assert (await outcome(rig.kernel.push("c1", "x"))).status == "completed"
        tool_msgs = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert [m.tool_call_id for m in tool_msgs] == ["t1"]
        assert tool_msgs[0].content


async def test_max_tool_turns_limits_tool_turns_per_round() -> None:
    """Max tool turns limits tool turns per round."""
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    provider = ScriptedProvider(
        default=lambda c: (
            [Tools.of(call(f"t{c.index}", "look"))] if c.tools else [Text("final")]
        )
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", max_tool_turns=2)
        result = await outcome(rig.kernel.push("c1", "look around"))
        assert result.status != "failed"
        assert len(tools.records) == 2
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        # no unanswered tool call is committed
        answered = {m.tool_call_id for m in transcript if m.role == "tool"}
        declared = {c.id for m in transcript for c in (m.tool_calls or [])}
        assert declared == answered


async def test_max_tool_turns_zero_is_unlimited() -> None:
    """Max tool turns zero is unlimited."""
    tools = ScriptedToolRunner({"look": ToolBehaviour(result="seen")})
    scripts = [[Tools.of(call(f"t{i}", "look"))] for i in range(6)]
    provider = ScriptedProvider(*scripts, [Text("done")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")  # max_tool_turns defaults to 0
        result = await outcome(rig.kernel.push("c1", "look a lot"))
        assert result.status == "completed"
        assert result.text == "done"
        assert len(tools.records) == 6
        stats = rig.kernel.stats("c1")
        assert stats is not None and stats.tool_calls == 6


async def test_completed_text_spans_every_model_call_of_the_round() -> None:
    """Completed text spans every model call of the round."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider(
        [Text("One moment. "), Tools.of(call("t1", "light"))],
        [Text("Done.")],
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "light"))
        assert result.status == "completed"
        assert result.text == "One moment. Done."
        assert out.text == "One moment. Done."


# --------------------------------------------------------------------------- stop


async def test_stop_waits_for_a_running_tool_and_resolves_ticket() -> None:
    """Stop waits for a running tool and resolves ticket."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="finished", gate=gate)})
    provider = ScriptedProvider([Tools.of(call("t1", "slow"))], [Text("unused")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "go")
        record = await tools.wait_calls(1)
        stopper = asyncio.create_task(rig.kernel.stop("c1"))

        await yield_many(50)
        assert not stopper.done()  # stop is waiting for the tool
        assert not record.finished.is_set()
        gate.set()
        await wait(stopper)
        assert record.result == "finished" and not record.cancelled
        result = await outcome(ticket)
        assert result.status == "interrupted"
        assert result.error == "stopped"
        assert len(provider.calls) == 1  # no model call after stop
        transcript = rig.kernel.transcript("c1")
        if transcript is not None:  # a stopped child's transcript may stay live
            assert any(m.role == "tool" and m.tool_call_id == "t1" for m in transcript)


async def test_stop_cuts_streaming_round_and_resolves_all_tickets() -> None:
    """Stop cuts streaming round and resolves all tickets."""
    never = asyncio.Event()
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "slow"))], [Text("x"), WaitFor(never)]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        running = rig.kernel.push("c1", "go")
        await tools.wait_calls(1)
        pending = rig.kernel.push("c1", "queued in slot")
        stopper = asyncio.create_task(rig.kernel.stop("c1"))
        gate.set()
        await wait(stopper)
        for ticket in (running, pending):
            res = await outcome(ticket)
            assert res.status == "interrupted"
            assert res.error == "stopped"
        assert rig.kernel.children() == []


async def test_stop_unknown_child_raises() -> None:
    """Stop unknown child raises."""
    async with Rig() as rig:
        with pytest.raises(KernelError):
            await rig.kernel.stop("ghost")


# --------------------------------------------------------------------------- failures


async def test_provider_error_mid_stream_fails_round_and_child_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Provider error mid stream fails round and child recovers.

    The outcome names the error's type; the kernel logs the failure at debug level
    only (the adapter decides what the user sees in the log).
    """
    caplog.set_level(logging.DEBUG)
    provider = ScriptedProvider(
        [Text("Hel"), Raise(ConnectionError("HTTP 502 upstream"))],
        [Text("fine again")],
    )
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        failed = await outcome(rig.kernel.push("c1", "first"))
        assert failed.status == "failed"
        assert failed.error == "HTTP 502 upstream"
        assert failed.error_type == "ConnectionError"
        assert failed.text == "Hel"
        logged = [r for r in caplog.records if "Round of c1 failed" in r.getMessage()]
        assert [r.levelno for r in logged] == [logging.DEBUG]
        assert "ConnectionError: HTTP 502 upstream" in logged[0].getMessage()
        ok = await outcome(rig.kernel.push("c1", "second"))
        assert ok.status == "completed"
        assert ok.text == "fine again"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.content for m in transcript if m.role == "user"][-1] == "second"


async def test_provider_raising_on_call_fails_round_and_child_recovers() -> None:
    """Provider raising on call fails round and child recovers."""
    provider = ScriptedProvider(default=[Text("ok")])
    provider.fail_on_call = TimeoutError("connect timeout")
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        failed = await outcome(rig.kernel.push("c1", "first"))
        assert failed.status == "failed"
        assert failed.error
        provider.fail_on_call = None
        assert (await outcome(rig.kernel.push("c1", "second"))).status == "completed"


async def test_specs_raising_fails_round_and_child_recovers() -> None:
    """Specs raising fails round and child recovers."""
    tools = ScriptedToolRunner({"x": ToolBehaviour()})
    tools.specs_error = RuntimeError("registry broken")
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        failed = await outcome(rig.kernel.push("c1", "first"))
        assert failed.status == "failed"
        assert failed.error
        tools.specs_error = None
        assert (await outcome(rig.kernel.push("c1", "second"))).status == "completed"


async def test_cancelled_outcome_future_is_tolerated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancelled outcome future is tolerated."""
    caplog.set_level(logging.WARNING)
    reached = asyncio.Event()
    gate = asyncio.Event()
    provider = ScriptedProvider(
        [Text("x")],  # for "superseded-later" round
        [Mark(reached), WaitFor(gate), Text("y")],
        default=[Text("z")],
    )
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        # 1) a superseded ticket whose future the caller cancelled
        early = rig.kernel.push("c1", "early")
        early.outcome.cancel()
        later = rig.kernel.push("c1", "later")
        assert (await outcome(later)).status == "completed"
        # 2) a running round whose future the caller cancelled
        running = rig.kernel.push("c1", "running")
        await wait(reached.wait())
        running.outcome.cancel()
        gate.set()
        # 3) the child still works
        assert (await outcome(rig.kernel.push("c1", "after"))).status == "completed"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_caller_cancelled_while_awaiting_shielded_outcome() -> None:
    """Caller cancelled while awaiting shielded outcome."""
    gate = asyncio.Event()
    provider = ScriptedProvider([Text("a"), WaitFor(gate), Text("b")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "hi")

        async def caller() -> Outcome:
            return await asyncio.shield(ticket.outcome)

        waiter = asyncio.create_task(caller())
        await out.wait_text("a")
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        gate.set()
        result = await outcome(ticket)
        assert result.status == "completed" and result.text == "ab"


# --------------------------------------------------------------------------- isolation


async def test_interrupting_child_a_does_not_touch_child_b() -> None:
    """Interrupting child a does not touch child b."""
    gate_a, gate_b = asyncio.Event(), asyncio.Event()
    provider = ScriptedProvider()
    async with Rig(provider) as rig:
        out_a = await rig.spawn("a", system_prompt="I am A")
        out_b = await rig.spawn("b", system_prompt="I am B")
        provider.add([Text("A1"), WaitFor(gate_a), Text("A2")])
        ta = rig.kernel.push("a", "hello a")
        await out_a.wait_text("A1")
        provider.add([Text("B1"), WaitFor(gate_b), Text("B2")])
        tb = rig.kernel.push("b", "hello b")
        await out_b.wait_text("B1")

        assert rig.kernel.interrupt("a") is True
        cut = await outcome(ta)
        assert cut.status == "interrupted"
        assert provider.calls[0].closed.is_set()
        await yield_many()
        assert not provider.calls[1].closed.is_set()
        assert not tb.outcome.done()
        gate_b.set()
        res_b = await outcome(tb)
        assert res_b.status == "completed" and res_b.text == "B1B2"
        sb = rig.kernel.stats("b")
        assert sb is not None and sb.interrupted_rounds == 0
        assert out_a.text == "A1"
        assert out_b.text == "B1B2"


async def test_rounds_of_one_child_never_overlap_across_quick_pushes() -> None:
    # Every push cancels the running round; the next round may only open its
    # stream after the previous one was closed.
    """Rounds of one child never overlap across quick pushes."""
    open_streams: list[int] = []
    max_open = 0

    def factory(c: StreamCall) -> Script:
        del c
        return [Text("x"), WaitFor(asyncio.Event())]

    provider = ScriptedProvider(default=factory)
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        tickets = []
        for i in range(5):
            tickets.append(rig.kernel.push("c1", f"m{i}"))
            await provider.wait_calls(i + 1)
            await out.wait_text("x" * (i + 1))
            open_now = sum(1 for c in provider.calls if not c.ended.is_set())
            open_streams.append(open_now)
            max_open = max(max_open, open_now)
        assert max_open == 1, open_streams
        for t in tickets[:-1]:
            assert (await outcome(t)).status == "interrupted"


async def test_transcript_messages_are_kernel_message_objects() -> None:
    """Transcript messages are kernel message objects."""
    provider = ScriptedProvider([Text("hi there")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "hello"))
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert all(isinstance(m, Message) for m in transcript)
