"""Teardown: one shielded stop/close per child (DESIGN 4.3, 4.6; issue 6 defects 1-3).

A stop or close runs as one task stored on the child; every caller awaits that task
through ``asyncio.shield``. A cancelled caller stops waiting, the teardown still
completes exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import pytest

from custom_components.rtvoice.kernel import (
    ChannelRegistry,
    ChildOptions,
    Kernel,
    KernelError,
    drop_unpaired_tool_calls,
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
    wait,
    yield_many,
)

NOT_RUN = json.dumps({"error": "not run: conversation stopped"})


def _tool_rig(gate: asyncio.Event) -> Rig:
    """Build a rig whose first round runs the gated tool ``slow``, then answers."""
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="done", gate=gate)})
    provider = ScriptedProvider([Tools.of(call("t1", "slow"))], default=[Text("ok")])
    return Rig(provider, tools)


async def test_cancelled_close_caller_still_completes_the_close() -> None:
    """Cancel the caller of close while a tool runs: the close still completes once."""
    before = asyncio.all_tasks()
    gate = asyncio.Event()
    rig = _tool_rig(gate)
    await rig.spawn("c1")
    ticket = rig.kernel.push("c1", "do it")
    record = await rig.tools.wait_calls(1) if rig.tools else None
    assert record is not None

    closer = asyncio.create_task(rig.kernel.close("c1"))
    await yield_many()
    assert not closer.done()  # waiting for the tool
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer

    gate.set()  # the tool finishes; the teardown goes on without its caller
    await rig.closed_notifier.wait_until(lambda: bool(rig.closed))
    await yield_many()
    assert not record.cancelled and record.result == "done"
    assert rig.closed == [("c1", 3, rig.closed[0][2])]
    assert rig.kernel.children() == []
    result = await outcome(ticket)
    assert result.status == "interrupted" and result.error == "stopped"
    transcript = rig.kernel.transcript("c1")
    assert transcript is not None
    assert [m.role for m in transcript] == ["user", "assistant", "tool"]
    assert "c1" in rig.kernel.archived()
    assert asyncio.all_tasks() - before == set()
    with pytest.raises(KernelError):
        await rig.kernel.close("c1")  # its teardown is over: unknown as before
    assert len(rig.closed) == 1


async def test_cancelled_stop_caller_still_stops_the_child() -> None:
    """Cancel the caller of stop while a tool runs: the child still stops."""
    before = asyncio.all_tasks()
    gate = asyncio.Event()
    rig = _tool_rig(gate)
    await rig.spawn("c1")
    ticket = rig.kernel.push("c1", "do it")
    assert rig.tools is not None
    await rig.tools.wait_calls(1)
    stopper = asyncio.create_task(rig.kernel.stop("c1"))
    await yield_many()
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    gate.set()
    assert (await outcome(ticket)).error == "stopped"
    with contextlib.suppress(KernelError):  # joins the running teardown, if any
        await wait(rig.kernel.stop("c1"))
    assert rig.kernel.children() == []
    assert asyncio.all_tasks() - before == set()
    assert rig.closed == []  # a stop hands nothing off


async def test_two_overlapping_closes_hand_off_once_with_one_count() -> None:
    """Two closes of one child return the same count; on_closed fires once."""
    gate = asyncio.Event()
    async with _tool_rig(gate) as rig:
        await rig.spawn("c1")
        rig.kernel.push("c1", "do it")
        assert rig.tools is not None
        await rig.tools.wait_calls(1)
        first = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        second = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        gate.set()
        counts = await wait(asyncio.gather(first, second))
        assert counts == [3, 3]
        assert rig.closed == [("c1", 3, rig.closed[0][2])]


async def test_close_during_a_stop_upgrades_it_to_a_hand_off() -> None:
    """A close while a stop's teardown runs hands off at its end, once."""
    gate = asyncio.Event()
    async with _tool_rig(gate) as rig:
        await rig.spawn("c1")
        rig.kernel.push("c1", "do it")
        assert rig.tools is not None
        await rig.tools.wait_calls(1)
        stopper = asyncio.create_task(rig.kernel.stop("c1"))
        await yield_many()
        closer = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        assert rig.closed == []  # no early hand-off with a stale count
        gate.set()
        await wait(stopper)
        assert await wait(closer) == 3
        assert rig.closed == [("c1", 3, rig.closed[0][2])]
        assert rig.kernel.transcript("c1") is not None


async def test_close_all_and_close_share_the_teardown() -> None:
    """close_all while a close runs: one hand-off per child."""
    gate = asyncio.Event()
    async with _tool_rig(gate) as rig:
        await rig.spawn("c1")
        await rig.spawn("c2")
        rig.kernel.push("c1", "do it")
        assert rig.tools is not None
        await rig.tools.wait_calls(1)
        await outcome(rig.kernel.push("c2", "hello"))
        closer = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        all_closer = asyncio.create_task(rig.kernel.close_all())
        await yield_many()
        gate.set()
        assert await wait(all_closer) == 2
        assert await wait(closer) == 3
        assert sorted(c[:2] for c in rig.closed) == [("c1", 3), ("c2", 2)]


async def test_unknown_child_errors_do_not_list_other_children() -> None:
    """An unknown id is named alone: other conversations' ids never leak."""
    async with Rig(ScriptedProvider(default=[Text("ok")])) as rig:
        await rig.spawn("secret-live")
        await rig.spawn("secret-closed")
        await outcome(rig.kernel.push("secret-closed", "hello"))
        await rig.kernel.close("secret-closed")
        errors: list[str] = []
        for attempt in (
            lambda: rig.kernel.push("ghost", "x"),
            lambda: rig.kernel.interrupt("ghost"),
            lambda: rig.kernel.withdraw("ghost", 1),
            lambda: rig.kernel.transcript_page("ghost"),
        ):
            with pytest.raises(KernelError) as err:
                attempt()
            errors.append(str(err.value))
        for coro in (rig.kernel.stop("ghost"), rig.kernel.close("ghost")):
            with pytest.raises(KernelError) as err:
                await coro
            errors.append(str(err.value))
        for message in errors:
            assert message == "no realtime child 'ghost'"


async def test_stop_of_a_stopped_child_is_unknown() -> None:
    """Once its teardown is over a child is unknown to stop and close alike."""
    async with Rig() as rig:
        await rig.spawn("c1")
        await rig.kernel.stop("c1")
        with contextlib.suppress(KernelError):
            await rig.kernel.stop("c1")
        with pytest.raises(KernelError):
            await rig.kernel.close("c1")


# ------------------------------------------------------- a stop inside a tool group


async def test_stop_during_a_tool_group_never_starts_the_next_call() -> None:
    """Stop during call 1 of 3: call 1 completes, the rest are answered "not run".

    (A close is a stop plus hand-off; it keeps the transcript readable here.)
    """
    gate = asyncio.Event()
    tools = ScriptedToolRunner(
        {
            "light": ToolBehaviour(result="light on", gate=gate),
            "lock": ToolBehaviour(result="door locked"),
        }
    )
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"), call("t2", "lock"), call("t3", "lock"))]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "light on and lock up")
        first = await tools.wait_calls(1)
        closer = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        gate.set()
        assert await wait(closer) == 5
        assert not first.cancelled and first.result == "light on"
        assert [r.call.id for r in tools.records] == ["t1"]  # t2, t3 never started
        assert (await outcome(ticket)).error == "stopped"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.tool_call_id) for m in transcript] == [
            ("user", None),
            ("assistant", None),
            ("tool", "t1"),
            ("tool", "t2"),
            ("tool", "t3"),
        ]
        assert transcript[2].content == "light on"
        for result in transcript[3:]:
            assert result.content == NOT_RUN
        assert drop_unpaired_tool_calls(transcript) is transcript


async def test_stop_deadline_is_logged_and_then_cancels_the_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A call still running at the stop deadline is logged, then cancelled."""
    never = asyncio.Event()
    tools = ScriptedToolRunner({"stuck": ToolBehaviour(gate=never)})
    provider = ScriptedProvider([Tools.of(call("s1", "stuck"))])
    channels = ChannelRegistry()
    rt_pair(channels, "c", OutputRecorder().sync_handler)
    kernel = Kernel(provider, channels, tools=tools, stop_tool_timeout=0.01)
    await kernel.spawn(ChildOptions("c", "c-in", "c-out"))
    kernel.push("c", "go")
    stuck = await tools.wait_calls(1)
    with caplog.at_level(logging.WARNING):
        await wait(kernel.stop("c"))
    assert stuck.cancelled
    assert "tool still running" in caplog.text


async def test_on_tool_result_reports_every_result_also_not_run_ones() -> None:
    """on_tool_result follows each tool result, the "not run" answers included."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner(
        {
            "light": ToolBehaviour(result="light on", gate=gate),
            "lock": ToolBehaviour(result="door locked"),
        }
    )
    provider = ScriptedProvider([Tools.of(call("t1", "light"), call("t2", "lock"))])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        rig.kernel.push("c1", "light on and lock up")
        await tools.wait_calls(1)
        assert rig.tool_results == []  # reported after the result, not before
        closer = asyncio.create_task(rig.kernel.close("c1"))
        await yield_many()
        gate.set()
        await wait(closer)
        assert rig.tool_results == [
            ("c1", "t1", "light on"),
            ("c1", "t2", NOT_RUN),
        ]
