"""Speculative inputs (issue 18 §2): answered early, held until confirmed.

``push(speculative=True)`` runs the round (its deltas reach the output handler) but
commits nothing and calls no tool until ``confirm``; replaced before that (a newer
push, ``withdraw``) it is preempted: no history, no carry-over, its requests and
tokens counted. Cut by ``interrupt`` or a stop, or heard (acknowledged), its words
stand; its tool calls still wait for ``confirm``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
import itertools
from typing import Literal

from hypothesis import HealthCheck, given, settings, strategies as st

from custom_components.rtvoice.kernel import Message, Ticket, drop_unpaired_tool_calls
from tests.kernel.fakes import (
    Mark,
    Rig,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    WaitFor,
    call,
    outcome,
    yield_many,
)


def users(rig: Rig, child: str = "c") -> list[str]:
    """Return the user messages of the child's history."""
    return [m.content for m in rig.kernel.transcript(child) or [] if m.role == "user"]


async def test_confirmed_speculation_commits_and_completes() -> None:
    """Confirmed speculation commits and completes."""
    provider = ScriptedProvider(default=[Text("It is on.")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c")
        ticket = rig.kernel.push("c", "turn on the light", speculative=True)
        await out.wait_text("It is on.")  # the round ran: its text reached the output
        assert provider.calls[0].user_text == "turn on the light"
        assert not ticket.outcome.done()  # held at its end: nothing committed yet
        assert users(rig) == []
        assert rig.kernel.confirm("c", ticket.seq)
        result = await outcome(ticket)
        assert result.status == "completed"
        transcript = rig.kernel.transcript("c")
        assert [(m.role, m.content) for m in transcript or []] == [
            ("user", "turn on the light"),
            ("assistant", "It is on."),
        ]
        stats = rig.kernel.stats("c")
        assert stats is not None
        assert (stats.speculative_inputs, stats.preempted_rounds) == (1, 0)
        assert stats.preempted_requests == stats.preempted_tokens == 0


async def test_confirmed_while_streaming_commits_the_input_in_order() -> None:
    """Confirmed while streaming commits the input in order."""
    gate = asyncio.Event()
    streaming = asyncio.Event()
    provider = ScriptedProvider(
        default=[Text("One"), Mark(streaming), WaitFor(gate), Text(" two.")]
    )
    async with Rig(provider) as rig:
        await rig.spawn("c")
        ticket = rig.kernel.push("c", "count", speculative=True)
        await streaming.wait()
        assert rig.kernel.confirm("c", ticket.seq)
        assert users(rig) == ["count"]  # committed at the confirmation
        gate.set()
        assert (await outcome(ticket)).status == "completed"
        transcript = rig.kernel.transcript("c")
        assert [m.role for m in transcript or []] == ["user", "assistant"]


async def test_confirmed_before_the_round_starts_is_an_ordinary_input() -> None:
    """Confirmed before the round starts is an ordinary input."""
    gate = asyncio.Event()
    provider = ScriptedProvider([WaitFor(gate), Text("first")], [Text("second")])
    async with Rig(provider) as rig:
        await rig.spawn("c")
        tools = rig.kernel.push("c", "one")
        await provider.wait_calls(1)
        rig.kernel.interrupt("c")
        ticket = rig.kernel.push("c", "two", speculative=True)
        assert rig.kernel.confirm("c", ticket.seq)  # still in the slot
        gate.set()
        await outcome(tools)
        assert (await outcome(ticket)).status == "completed"
        assert users(rig)[-1] == "two"


async def test_superseded_speculation_leaves_no_trace_and_is_counted() -> None:
    """Superseded speculation leaves no trace and is counted."""
    gate = asyncio.Event()
    provider = ScriptedProvider(
        [Text("It is"), WaitFor(gate), Text(" on.")], default=[Text("Both are on.")]
    )
    async with Rig(provider) as rig:
        out = await rig.spawn("c", delivery="acknowledged", carry_over=True)
        first = rig.kernel.push("c", "turn on the light", speculative=True)
        await out.wait_text("It is")
        full = rig.kernel.push("c", "turn on the light and the fan")
        preempted = await outcome(first)
        assert preempted.status == "superseded"
        assert preempted.carried_into is None
        assert (await outcome(full)).status == "completed"
        # Never carried over: the full utterance holds its words already.
        assert provider.calls[1].user_text == "turn on the light and the fan"
        assert users(rig) == ["turn on the light and the fan"]
        stats = rig.kernel.stats("c")
        assert stats is not None
        assert stats.preempted_rounds == 1
        assert stats.preempted_requests == 1
        assert stats.preempted_tokens > 0
        assert stats.interrupted_rounds == 0


async def test_speculation_voided_in_the_slot_is_preempted_not_carried() -> None:
    """Speculation voided in the slot is preempted not carried."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "slow"))], [Text("done")], default=[Text("ok")]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c", carry_over=True)
        busy = rig.kernel.push("c", "run the tool")
        await tools.wait_calls(1)
        held = rig.kernel.push("c", "and then", speculative=True)  # waits in the slot
        full = rig.kernel.push("c", "and then the lights")
        assert (await outcome(held)).status == "superseded"
        gate.set()
        await outcome(busy)
        await outcome(full)
        assert "and then" not in users(rig)
        assert users(rig)[-1] == "and then the lights"
        stats = rig.kernel.stats("c")
        assert stats is not None
        assert stats.preempted_rounds == 1
        assert stats.preempted_requests == 0  # it never reached the model


async def test_a_tool_call_waits_for_the_confirmation() -> None:
    """A tool call waits for the confirmation."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"), content="Turning it on. ")],
        default=[Text("Done.")],
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c")
        ticket = rig.kernel.push("c", "turn on the light", speculative=True)
        await out.wait_text("Turning it on. ")
        await yield_many(50)
        assert tools.calls == []  # held: the device is not touched
        assert rig.kernel.confirm("c", ticket.seq)
        assert (await outcome(ticket)).status == "completed"
        assert [c.name for c in tools.calls] == ["light"]
        transcript = rig.kernel.transcript("c")
        assert [m.role for m in transcript or []] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]


async def test_a_held_tool_call_is_never_run_when_superseded() -> None:
    """A held tool call is never run when superseded."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on")})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"))], default=[Text("Fan on.")]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c")
        held = rig.kernel.push("c", "turn on the light", speculative=True)
        await provider.wait_calls(1)
        await yield_many(20)
        full = rig.kernel.push("c", "turn on the light fan")
        assert (await outcome(held)).status == "superseded"
        assert (await outcome(full)).status == "completed"
        assert tools.calls == []
        assert rig.kernel.stats("c").suppressed_cancels == 0  # type: ignore[union-attr]


async def test_a_barge_in_during_speculation_keeps_the_words() -> None:
    """A barge-in (interrupt) is no sign the words were unfinished: they stand."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"music": ToolBehaviour(result="on")})
    provider = ScriptedProvider(
        default=[Text("Sure. "), WaitFor(gate), Tools.of(call("t1", "music"))]
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        held = rig.kernel.push("c", "play", speculative=True)
        await out.wait_text("Sure. ")
        assert rig.kernel.interrupt("c")  # e.g. the wake word, or the session ending
        gate.set()
        assert (await outcome(held)).status == "interrupted"
        assert rig.kernel.transcript("c") == [Message("user", "play")]
        assert tools.calls == []  # never confirmed: its tool call never ran
        assert not rig.kernel.confirm("c", held.seq)  # too late
        stats = rig.kernel.stats("c")
        assert stats is not None
        assert (stats.preempted_rounds, stats.interrupted_rounds) == (0, 1)


async def test_withdrawn_speculation_is_preempted() -> None:
    """Withdrawn speculation is preempted."""
    gate = asyncio.Event()
    provider = ScriptedProvider(default=[Text("Sure"), WaitFor(gate)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c")
        held = rig.kernel.push("c", "play", speculative=True)
        await out.wait_text("Sure")
        assert rig.kernel.withdraw("c", held.seq)
        assert (await outcome(held)).status == "superseded"
        assert rig.kernel.transcript("c") == []


async def test_a_stop_during_speculation_keeps_the_words_for_the_hand_off() -> None:
    """A stop (the conversation closes) settles it stopped; the words stand."""
    gate = asyncio.Event()
    provider = ScriptedProvider(default=[Text("Sure"), WaitFor(gate)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        held = rig.kernel.push("c", "play", speculative=True)
        await out.wait_text("Sure")
        await rig.kernel.close("c")
        result = await outcome(held)
        assert (result.status, result.error) == ("interrupted", "stopped")
        assert rig.kernel.transcript("c") == [Message("user", "play")]


async def test_a_failed_speculation_commits_nothing() -> None:
    """A failed speculation commits nothing."""
    provider = ScriptedProvider(default=[Text("Sure")])
    provider.fail_on_call = RuntimeError("upstream down")
    async with Rig(provider) as rig:
        await rig.spawn("c")
        held = rig.kernel.push("c", "play", speculative=True)
        assert (await outcome(held)).status == "failed"
        assert rig.kernel.transcript("c") == []
        assert not rig.kernel.confirm("c", held.seq)


async def test_a_heard_speculation_stands_when_the_user_goes_on() -> None:
    """Its answer was heard: the input is committed, a cut is an interruption."""
    provider = ScriptedProvider(
        [Text("Okay, the lights.")], default=[Text("The hall lights are off.")]
    )
    async with Rig(provider) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        held = rig.kernel.push("c", "turn off the lights", speculative=True)
        await out.wait_text("Okay, the lights.")  # waits for its confirmation
        rig.kernel.acknowledge("c", held.seq, 5)  # the output played "Okay,"
        assert users(rig) == ["turn off the lights"]  # heard: it stands
        full = rig.kernel.push("c", "turn off the lights in the hall")
        cut = await outcome(held)
        assert (cut.status, cut.text) == ("interrupted", "Okay,")
        assert (await outcome(full)).status == "completed"
        transcript = rig.kernel.transcript("c") or []
        assert [(m.role, m.content, m.interrupted) for m in transcript] == [
            ("user", "turn off the lights", False),
            ("assistant", "Okay,", True),
            ("user", "turn off the lights in the hall", False),
            ("assistant", "The hall lights are off.", False),
        ]
        stats = rig.kernel.stats("c")
        assert stats is not None
        assert (stats.preempted_rounds, stats.interrupted_rounds) == (0, 1)


async def test_nothing_heard_leaves_a_speculation_revocable() -> None:
    """An acknowledgement of nothing (played 0 characters) changes nothing."""
    provider = ScriptedProvider([Text("Okay.")], default=[Text("Both.")])
    async with Rig(provider) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        held = rig.kernel.push("c", "turn off the lights", speculative=True)
        await out.wait_text("Okay.")
        rig.kernel.acknowledge("c", held.seq, 0, final=True)  # cut before a word
        rig.kernel.push("c", "turn off the lights and the fan")
        assert (await outcome(held)).status == "superseded"
        assert "turn off the lights" not in users(rig)
        assert rig.kernel.stats("c").preempted_rounds == 1  # type: ignore[union-attr]


async def test_a_heard_speculation_still_waits_to_call_its_tool() -> None:
    """The preamble was heard; the device is touched only once confirmed."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="off")})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"), content="Turning them off. ")],
        default=[Text("Done.")],
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        ticket = rig.kernel.push("c", "turn off the lights", speculative=True)
        await out.wait_text("Turning them off. ")
        rig.kernel.acknowledge("c", ticket.seq, len("Turning them off."))
        await yield_many(50)
        assert tools.calls == []
        assert users(rig) == ["turn off the lights"]
        assert rig.kernel.confirm("c", ticket.seq)
        assert (await outcome(ticket)).status == "completed"
        assert [c.name for c in tools.calls] == ["light"]
        transcript = rig.kernel.transcript("c") or []
        assert [m.role for m in transcript] == [
            "user",
            "assistant",
            "tool",
            "assistant",
        ]
        assert users(rig) == ["turn off the lights"]  # committed once


async def test_a_heard_speculation_waiting_for_its_tool_is_cut_without_it() -> None:
    """The user goes on over the preamble: the held tool call never runs."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="off")})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"), content="Turning them off. ")],
        default=[Text("The hall is dark.")],
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c", delivery="acknowledged")
        held = rig.kernel.push("c", "turn off the lights", speculative=True)
        await out.wait_text("Turning them off. ")
        rig.kernel.acknowledge("c", held.seq, 7, final=True)  # "Turning", then cut
        full = rig.kernel.push("c", "turn off the lights in the hall")
        assert (await outcome(held)).status == "interrupted"
        assert (await outcome(full)).status == "completed"
        assert tools.calls == []
        transcript = rig.kernel.transcript("c") or []
        assert drop_unpaired_tool_calls(transcript) is transcript
        assert [(m.role, m.content) for m in transcript] == [
            ("user", "turn off the lights"),
            ("assistant", "Turning"),
            ("user", "turn off the lights in the hall"),
            ("assistant", "The hall is dark."),
        ]


async def test_the_text_pauses_while_it_waits_for_its_confirmation() -> None:
    """on_text_pause: an output holding back its last sentence may speak it now."""
    paused: list[int] = []
    provider = ScriptedProvider(default=[Text("Okay, done")])
    async with Rig(provider, on_text_pause=lambda _c, seq: paused.append(seq)) as rig:
        out = await rig.spawn("c")
        ticket = rig.kernel.push("c", "do it", speculative=True)
        await out.wait_text("Okay, done")
        await yield_many(10)
        assert paused == [ticket.seq]
        assert rig.kernel.confirm("c", ticket.seq)
        await outcome(ticket)
        ordinary = rig.kernel.push("c", "again")
        await outcome(ordinary)
        assert paused == [ticket.seq]  # a text-only ordinary round does not pause


# ------------------------------------------------------------ property: interleavings

Action = (
    tuple[Literal["speculate"], int]
    | tuple[Literal["confirm"], int]
    | tuple[Literal["push"], int]
    | tuple[Literal["interrupt"], int]
    | tuple[Literal["release"], int]
    | tuple[Literal["stop"], int]
    | tuple[Literal["hear"], int]
)
actions = st.one_of(
    st.tuples(st.just("speculate"), st.integers(0, 6)),
    st.tuples(st.just("confirm"), st.integers(0, 6)),
    st.tuples(st.just("push"), st.integers(0, 6)),
    st.tuples(st.just("interrupt"), st.integers(0, 6)),
    st.tuples(st.just("release"), st.integers(0, 6)),
    st.tuples(st.just("stop"), st.integers(0, 6)),
    st.tuples(st.just("hear"), st.integers(0, 6)),
    # A speculation heard before anything else happens to it, more often.
    st.tuples(st.just("speculate"), st.just(6)),
    st.tuples(st.just("hear"), st.integers(0, 6)),
)


@dataclass
class Pushed:
    """One input of the plan."""

    text: str
    ticket: Ticket
    speculative: bool
    confirmed: bool = False
    heard: bool = False  # its answer was acknowledged while it was speculative


@dataclass
class World:
    """Scripts: text, a gate, sometimes a tool call."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    tool_every: int = 2

    def script(self, record):
        """Text behind a gate, or (every ``tool_every``-th call) a tool call."""
        n = next(self.ids)
        if n % self.tool_every == 0 and not any(
            m.role == "tool" for m in record.messages
        ):
            return [
                Text("Let me. "),
                WaitFor(self.gate),
                Tools.of(call(f"t{n}", "dev")),
            ]
        return [Text("Fine"), WaitFor(self.gate), Text(".")]


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(plan=st.lists(actions, min_size=1, max_size=12), tool_every=st.integers(1, 3))
async def test_interleavings_of_speculation_keep_the_invariants(
    plan: list[Action], tool_every: int
) -> None:
    """Speculate, confirm, hear, supersede, barge-in (interrupt), stop in any order.

    "hear": the output side acknowledges what the running round emitted (a
    revocable early end plays its answer before the confirmation).

    Invariants: every ticket settles; the history is paired, in push order, each
    input at most once; no tool ran for a round that was not confirmed when its
    tool call came; a speculative input neither confirmed nor heard either ends
    superseded (replaced: not in the history, counted as preempted) or is cut
    (interrupt, stop: interrupted, its words may stand); a heard one is in the
    history, never completes unconfirmed and is never counted as preempted.
    """
    world = World(tool_every=tool_every)
    tools_ran: list[str] = []
    held_at_tool: list[bool] = []
    rig_box: list[Rig] = []

    class Runner(ScriptedToolRunner):
        async def call(self, tool_call):
            rnd = rig_box[0].kernel._children["c"].round  # noqa: SLF001
            held_at_tool.append(
                rnd is None
                or rnd.speculative
                or (rnd.confirmed is not None and not rnd.confirmed.is_set())
            )
            tools_ran.append(tool_call.id)
            return await super().call(tool_call)

    provider = ScriptedProvider(default=world.script)
    tools = Runner({"dev": ToolBehaviour(result="ok")})
    pushed: list[Pushed] = []
    async with Rig(provider, tools) as rig:
        rig_box.append(rig)
        await rig.spawn("c", delivery="acknowledged")
        child = rig.kernel._children["c"]  # noqa: SLF001 - its counters after a close
        stopped = False
        for index, (kind, value) in enumerate(plan):
            if stopped:
                break
            if kind in ("speculate", "push"):
                text = f"u{index}"
                ticket = rig.kernel.push("c", text, speculative=kind == "speculate")
                pushed.append(Pushed(text, ticket, kind == "speculate"))
            elif kind == "confirm" and pushed:
                target = pushed[-1]
                if target.speculative and rig.kernel.confirm("c", target.ticket.seq):
                    target.confirmed = True
            elif kind == "interrupt":
                rig.kernel.interrupt("c")
            elif kind == "hear":
                for _ in range(20):  # let the running round say something first
                    rnd = child.round
                    if rnd is not None and rnd.emitted_len:
                        break
                    await asyncio.sleep(0)
                if rnd is not None and not rnd.finished and rnd.emitted_len:
                    if rnd.speculative:
                        next(p for p in pushed if p.ticket.seq == rnd.seq).heard = True
                    rig.kernel.acknowledge("c", rnd.seq, rnd.emitted_len)
            elif kind == "release":
                world.gate.set()
                world.gate = asyncio.Event()
            elif kind == "stop":
                await rig.kernel.close("c")  # a stop that keeps the transcript
                stopped = True
            await yield_many(value)
        if not stopped:
            # Confirm nothing more; let everything run out.
            world.gate.set()
            world.gate = asyncio.Event()
            gate_opener = asyncio.get_running_loop().create_task(_open_gates(world))
            try:
                # A speculation never confirmed waits for ever (only the last
                # input can be one): its caller takes it back.
                last = pushed[-1] if pushed else None
                if last is not None and last.speculative and not last.confirmed:
                    rig.kernel.withdraw("c", last.ticket.seq)
                for item in pushed:
                    await outcome(item.ticket)
            finally:
                gate_opener.cancel()
        history = rig.kernel.transcript("c") or []

    assert not any(held_at_tool)
    assert drop_unpaired_tool_calls(history) is history
    committed = [m.content for m in history if m.role == "user"]
    assert set(committed) <= {p.text for p in pushed}
    assert len(committed) == len(set(committed))  # each input once
    order = [p.text for p in pushed]
    assert committed == sorted(committed, key=order.index)
    preempted = 0
    for item in pushed:
        result = item.ticket.outcome.result()
        if item.heard:
            assert item.text in committed  # the user heard an answer to it
            if not item.confirmed:
                assert result.status == "interrupted"
        elif item.speculative and not item.confirmed:
            assert result.status in ("superseded", "interrupted")
            if result.status == "superseded":
                assert item.text not in committed
                preempted += 1
        if result.status == "completed":
            assert item.text in committed
        if result.status == "superseded":  # never carried over (carry_over off)
            assert item.text not in committed
    assert child.preempted_rounds == preempted


async def _open_gates(world: World) -> None:
    """Keep releasing the scripts' gates while the plan runs out."""
    while True:
        world.gate.set()
        world.gate = asyncio.Event()
        await asyncio.sleep(0)
