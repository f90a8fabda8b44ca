"""Carry-over decided by the kernel (``ChildOptions.carry_over``; issue 6 defect 5).

An input superseded before it reached the model is put in front of the next input
that does, so nothing the user said is lost; its own ticket still settles
``superseded`` and names the input that carries it.
"""

from __future__ import annotations

import asyncio

from tests.kernel.fakes import (
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    WaitFor,
    call,
    outcome,
)


async def _until_taken(rig: Rig, child: str) -> None:
    """Let the loop take the pending input (one scheduling step at a time)."""
    for _ in range(100):
        stats = rig.kernel.stats(child)
        if stats is not None and not stats.pending:
            return
        await asyncio.sleep(0)
    raise AssertionError("the loop never took the input")


async def test_input_superseded_between_take_and_round_start_is_carried() -> None:
    """The window: the loop took A, A's round has not started, B arrives."""
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1", carry_over=True)
        first = rig.kernel.push("c1", "turn on")
        await _until_taken(rig, "c1")
        assert provider.calls == []  # taken, but its round never reached the model
        second = rig.kernel.push("c1", "the kitchen light")
        superseded = await outcome(first)
        assert superseded.status == "superseded"
        assert superseded.carried_into == second.seq
        assert (await outcome(second)).status == "completed"
        assert [c.user_text for c in provider.calls] == ["turn on the kitchen light"]
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.content for m in transcript if m.role == "user"] == [
            "turn on the kitchen light"
        ]


async def test_inputs_voided_in_the_slot_are_carried_in_order() -> None:
    """Several inputs overwritten in the slot behind a tool all carry, in order."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider()
    provider.on("lights", [Tools.of(call("t1", "slow"))])
    provider.on("one two three", [Text("Counting.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", carry_over=True)
        running = rig.kernel.push("c1", "lights")
        await tools.wait_calls(1)
        tickets = [rig.kernel.push("c1", word) for word in ("one", "two", "three")]
        gate.set()
        assert (await outcome(running)).status == "interrupted"
        for ticket in tickets[:2]:
            assert (await outcome(ticket)).status == "superseded"
        assert (await outcome(tickets[0])).carried_into == tickets[1].seq
        assert (await outcome(tickets[2])).text == "Counting."
        assert provider.calls[-1].user_text == "one two three"


async def test_withdrawn_input_is_carried_into_the_next_one() -> None:
    """An input its caller took back before the model saw it still carries."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider(default=[Text("ok")])
    provider.on("lights", [Tools.of(call("t1", "slow"))], [Text("Done.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1", carry_over=True)
        rig.kernel.push("c1", "lights")
        await tools.wait_calls(1)
        queued = rig.kernel.push("c1", "and the")
        assert rig.kernel.withdraw("c1", queued.seq)
        result = await outcome(queued)
        assert result.status == "superseded" and result.carried_into is None
        gate.set()
        last = rig.kernel.push("c1", "heating")
        assert (await outcome(last)).status == "completed"
        assert provider.calls[-1].user_text == "and the heating"


async def test_an_input_that_reached_the_model_is_never_carried() -> None:
    """A round whose model call started is interrupted: its input is in history."""
    never = asyncio.Event()
    provider = ScriptedProvider(default=[Text("ok")])
    provider.on("tell me a story", [Text("Once"), WaitFor(never)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1", carry_over=True)
        first = rig.kernel.push("c1", "tell me a story")
        await out.wait_text("Once")
        second = rig.kernel.push("c1", "stop")
        assert (await outcome(first)).status == "interrupted"
        await outcome(second)
        assert provider.calls[-1].user_text == "stop"


async def test_without_carry_over_superseded_words_are_dropped() -> None:
    """The default keeps today's behaviour: the superseded input is gone."""
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "turn on")
        await _until_taken(rig, "c1")
        second = rig.kernel.push("c1", "the kitchen light")
        result = await outcome(first)
        assert result.status == "superseded" and result.carried_into is None
        await outcome(second)
        assert [c.user_text for c in provider.calls] == ["the kitchen light"]
