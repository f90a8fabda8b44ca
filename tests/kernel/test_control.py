"""Control plane: DESIGN 4.8 and the Kernel API of 4.9.

Spawn errors, ask_parent, stats, close / hand-off, stop_all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json

import pytest

from custom_components.rtvoice.kernel import (
    AgentNotRealtimeError,
    ChildOptions,
    ChildStats,
    KernelError,
)
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
    wait,
    yield_many,
)

# --------------------------------------------------------------------------- spawn


async def test_spawn_returns_id_and_children_are_sorted() -> None:
    """Spawn returns id and children are sorted."""
    async with Rig() as rig:
        for name in ("zulu", "alpha", "mike"):
            rig.pair(name)
            got = await rig.kernel.spawn(
                ChildOptions(id=name, input=f"{name}-in", output=f"{name}-out")
            )
            assert got == name
        assert rig.kernel.children() == ["alpha", "mike", "zulu"]


async def test_spawn_as_parent_id_is_agent_not_realtime() -> None:
    """Spawn as parent id is agent not realtime."""
    async with Rig(parent_id="boss") as rig:
        rig.pair("sat")
        with pytest.raises(AgentNotRealtimeError):
            await rig.kernel.spawn(
                ChildOptions(id="boss", input="sat-in", output="sat-out")
            )
        for name in ("sat-in", "sat-out"):
            ch = rig.channels.lookup(name)
            assert ch is not None and ch.owner != "boss"
        assert rig.kernel.children() == []


@pytest.mark.parametrize("side", ["sat-in", "sat-out"])
async def test_channel_owned_by_parent_is_refused(side: str) -> None:
    """Channel owned by parent is refused."""
    async with Rig(parent_id="boss") as rig:
        rig.pair("sat")
        rig.channels.assign(side, "boss")
        with pytest.raises(KernelError):
            await rig.kernel.spawn(
                ChildOptions(id="c1", input="sat-in", output="sat-out")
            )
        ch = rig.channels.lookup(side)
        assert ch is not None and ch.owner == "boss"
        other = "sat-out" if side == "sat-in" else "sat-in"
        och = rig.channels.lookup(other)
        assert och is not None and och.owner != "c1"
        assert rig.kernel.children() == []


# --------------------------------------------------------------------------- ask_parent


def _ask_spec_names(rig: Rig) -> list[str]:
    return rig.provider.calls[0].tool_names


async def test_ask_parent_is_offered_only_with_a_callback() -> None:
    """Ask parent is offered only with a callback."""
    tools = ScriptedToolRunner({"light": ToolBehaviour()})
    with_cb = Rig(ScriptedProvider(default=[Text("ok")]), tools, ask_parent=True)
    without_cb = Rig(ScriptedProvider(default=[Text("ok")]), tools)
    async with with_cb, without_cb:
        for rig in (with_cb, without_cb):
            await rig.spawn("c1")
            await outcome(rig.kernel.push("c1", "hi"))
        assert sorted(_ask_spec_names(with_cb)) == ["ask_parent", "light"]
        assert _ask_spec_names(without_cb) == ["light"]
        spec = next(
            t for t in with_cb.provider.calls[0].tools if t.name == "ask_parent"
        )
        assert spec.description
        assert spec.parameters["properties"]["text"]["type"] == "string"
        assert "text" in spec.parameters.get("required", ["text"])


async def test_ask_parent_is_offered_without_a_tool_runner() -> None:
    """Ask parent is offered without a tool runner."""
    async with Rig(ScriptedProvider(default=[Text("ok")]), ask_parent=True) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "hi"))
        assert rig.provider.calls[0].tool_names == ["ask_parent"]


async def test_ask_parent_delivers_and_result_confirms() -> None:
    """Ask parent delivers and result confirms."""
    tools = ScriptedToolRunner({"light": ToolBehaviour()})
    provider = ScriptedProvider(
        [Text("Let me ask. "), Tools.of(call("q1", "ask_parent", text="Which room?"))],
        [Text("Asked.")],
    )
    async with Rig(provider, tools, ask_parent=True) as rig:
        await rig.spawn("c1")
        result = await outcome(rig.kernel.push("c1", "turn on the light"))
        assert result.status == "completed"
        await rig.asked_notifier.wait_until(lambda: bool(rig.asked))
        assert rig.asked == [("c1", "Which room?")]
        assert tools.records == []  # not routed to the tool runner
        results = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert [m.tool_call_id for m in results] == ["q1"]
        assert results[0].content
        assert "error" not in results[0].content.lower()


async def test_ask_parent_without_text_is_an_error_result() -> None:
    """Ask parent without text is an error result."""
    provider = ScriptedProvider([Tools.of(call("q1", "ask_parent"))], [Text("Hm.")])
    async with Rig(provider, ask_parent=True) as rig:
        await rig.spawn("c1")
        assert (await outcome(rig.kernel.push("c1", "x"))).status == "completed"
        await yield_many()
        assert rig.asked == []
        results = [m for m in provider.calls[1].messages if m.role == "tool"]
        assert [m.tool_call_id for m in results] == ["q1"]


async def test_parent_answer_comes_back_through_the_slot_and_interrupts() -> None:
    """Parent answer comes back through the slot and interrupts."""
    never = asyncio.Event()
    provider = ScriptedProvider()
    provider.on(
        "turn on the light",
        [Tools.of(call("q1", "ask_parent", text="Which room?"))],
        [Text("While I wait, "), WaitFor(never)],
    )
    provider.on("The kitchen", [Text("Kitchen light on.")])
    async with Rig(provider, ask_parent=True) as rig:
        out = await rig.spawn("c1")
        first = rig.kernel.push("c1", "turn on the light")
        await rig.asked_notifier.wait_until(lambda: bool(rig.asked))
        await out.wait_text("While I wait, ")
        child_id, _question = rig.asked[0]
        answer = rig.kernel.push(child_id, "The kitchen")
        cut = await outcome(first)
        assert cut.status == "interrupted"
        done = await outcome(answer)
        assert done.status == "completed" and done.text == "Kitchen light on."
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.role for m in transcript] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]
        assert transcript[2].tool_call_id == "q1"
        assert transcript[3].interrupted is True
        assert transcript[4].content == "The kitchen"


async def test_ask_parent_callback_may_push_synchronously() -> None:
    """Ask parent callback may push synchronously."""
    never = asyncio.Event()
    provider = ScriptedProvider()
    provider.on(
        "question",
        [Tools.of(call("q1", "ask_parent", text="Help?"))],
        [Text("waiting"), WaitFor(never)],
    )
    provider.on("answer", [Text("thanks")])
    rig_box: list[Rig] = []

    def answer_now(child_id: str, text: str) -> None:
        del text
        rig_box[0].kernel.push(child_id, "answer")

    async with Rig(provider, ask_parent=True, ask_parent_hook=answer_now) as rig:
        rig_box.append(rig)
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "question")
        await rig.asked_notifier.wait_until(lambda: bool(rig.asked))
        res = await outcome(first)
        assert res.status in ("interrupted", "completed")
        await rig.provider.notifier.wait_until(
            lambda: any(c.user_text == "answer" for c in provider.calls)
        )
        stats = rig.kernel.stats("c1")
        assert stats is not None
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        # the ask_parent group is kept and paired, whatever the timing
        assert [m.tool_call_id for m in transcript if m.role == "tool"] == ["q1"]


# --------------------------------------------------------------------------- stats


def test_child_stats_has_the_contract_fields() -> None:
    """Child stats has the contract fields."""
    names = {f.name for f in dataclasses.fields(ChildStats)}
    assert names >= {
        "id",
        "rounds",
        "last_seq",
        "dropped",
        "pending",
        "suppressed_cancels",
        "interrupted_rounds",
        "superseded_rounds",
        "tool_calls",
    }
    # time from input to first output delta (DESIGN 4.8)
    assert any("first" in n for n in names)


async def test_stats_after_a_mix_of_rounds() -> None:
    """Stats after a mix of rounds."""
    never = asyncio.Event()
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="ok", gate=gate)})
    provider = ScriptedProvider()
    provider.on(
        "one", [Tools.of(call("t1", "slow"), call("t2", "slow"))], [Text("unused")]
    )
    provider.on("three", [Text("partial"), WaitFor(never)])
    provider.on("four", [Text("done")])
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1")
        fresh = rig.kernel.stats("c1")
        assert fresh is not None
        assert (fresh.id, fresh.rounds, fresh.dropped, fresh.pending) == (
            "c1",
            0,
            0,
            False,
        )
        assert (
            fresh.suppressed_cancels,
            fresh.interrupted_rounds,
            fresh.tool_calls,
        ) == (0, 0, 0)

        one = rig.kernel.push("c1", "one")
        await tools.wait_calls(1)
        two = rig.kernel.push("c1", "two")  # suppressed, waits in the slot
        three = rig.kernel.push("c1", "three")  # overwrites "two": dropped
        gate.set()
        await out.wait_text("partial")
        four = rig.kernel.push("c1", "four")  # cuts "three"
        assert (await outcome(four)).status == "completed"
        assert (await outcome(one)).status == "interrupted"
        assert (await outcome(two)).status == "superseded"
        assert (await outcome(three)).status == "interrupted"

        stats = rig.kernel.stats("c1")
        assert stats is not None
        assert stats.id == "c1"
        assert stats.rounds == 3  # one, three, four
        assert stats.last_seq == four.seq
        assert stats.dropped == 1
        assert stats.pending is False
        assert stats.suppressed_cancels == 2
        assert stats.interrupted_rounds == 2
        assert stats.tool_calls == 1  # t2 not run: the barge-in skipped it
        first_fields = [
            getattr(stats, f.name)
            for f in dataclasses.fields(stats)
            if "first" in f.name
        ]
        assert first_fields and all(v is not None for v in first_fields)


async def test_newer_input_at_the_first_check_is_superseded() -> None:
    """Newer input at the first check is superseded."""
    provider = ScriptedProvider(default=[Text("ok")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "first")
        for _ in range(100):  # step the loop until the input was taken
            stats = rig.kernel.stats("c1")
            assert stats is not None
            if not stats.pending:
                break
            await asyncio.sleep(0)
        model_called = bool(provider.calls)
        second = rig.kernel.push("c1", "second")
        res = await outcome(first)
        await outcome(second)
        stats = rig.kernel.stats("c1")
        transcript = rig.kernel.transcript("c1")
        assert stats is not None and transcript is not None
        if not model_called:
            # taken, but a newer seq at the round's first check: superseded
            assert res.status == "superseded"
            assert stats.dropped == 1
            assert stats.superseded_rounds == 1
            assert all(m.content != "first" for m in transcript)
        else:
            assert res.status in ("interrupted", "completed")
            assert transcript[0].content == "first"


async def test_stats_of_unknown_child_is_none() -> None:
    """Stats of unknown child is none."""
    async with Rig() as rig:
        assert rig.kernel.stats("ghost") is None


# --------------------------------------------------------------------------- close


async def test_close_hands_off_counts_only_once() -> None:
    """Close hands off counts only once."""
    tools = ScriptedToolRunner({"light": ToolBehaviour(result='{"ok": true}')})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light", entity="light.kitchen"))], [Text("Light is on.")]
    )
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "kitchen light please"))
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None and len(transcript) == 4

        count = await rig.kernel.close("c1")
        assert count == 4
        assert len(rig.closed) == 1
        child_id, messages, chars = rig.closed[0]
        assert child_id == "c1"
        assert messages == 4
        assert isinstance(chars, int) and not isinstance(chars, bool)
        assert chars >= sum(len(m.content) for m in transcript)
        assert rig.kernel.children() == []
        with pytest.raises(KernelError):
            rig.kernel.push("c1", "hello?")
        # a second close neither re-emits nor crashes silently with a new hand-off
        with contextlib.suppress(KernelError):
            await rig.kernel.close("c1")
        assert len(rig.closed) == 1


async def test_close_commits_a_round_cut_by_the_stop() -> None:
    """Close commits a round cut by the stop."""
    never = asyncio.Event()
    provider = ScriptedProvider([Text("Let me th"), WaitFor(never)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "tell me a story")
        await out.wait_text("Let me th")
        count = await wait(rig.kernel.close("c1"))
        res = await outcome(ticket)
        assert res.status == "interrupted"
        assert res.error == "stopped"
        assert res.text == "Let me th"
        assert provider.calls[0].closed.is_set()
        assert count == 2
        assert rig.closed == [("c1", 2, rig.closed[0][2])]
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.content) for m in transcript] == [
            ("user", "tell me a story"),
            ("assistant", "Let me th"),
        ]
        assert transcript[1].interrupted is True


async def test_close_with_empty_transcript_emits_and_archives_nothing() -> None:
    """Close with empty transcript emits and archives nothing."""
    async with Rig() as rig:
        await rig.spawn("c1")
        assert await rig.kernel.close("c1") == 0
        assert rig.closed == []
        assert rig.kernel.transcript("c1") is None
        with pytest.raises(KernelError):
            rig.kernel.transcript_page("c1")
        assert rig.kernel.children() == []


async def test_close_of_unknown_child_raises() -> None:
    """Close of unknown child raises."""
    async with Rig() as rig:
        with pytest.raises(KernelError):
            await rig.kernel.close("ghost")
        assert rig.closed == []


async def test_raw_page_after_close_is_json() -> None:
    """Raw page after close is json."""
    provider = ScriptedProvider([Text("bye")])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        await outcome(rig.kernel.push("c1", "hello"))
        await rig.kernel.close("c1")
        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert raw["id"] == "c1" and raw["total"] == 2


# --------------------------------------------------------------------------- stop_all


async def test_stop_all_stops_every_child_and_resolves_every_ticket() -> None:
    """Stop all stops every child and resolves every ticket."""
    before = asyncio.all_tasks()
    never = asyncio.Event()
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(gate=gate)})
    provider = ScriptedProvider()
    provider.on("a1", [Text("A"), WaitFor(never)])
    provider.on("b1", [Tools.of(call("t1", "slow"))])
    rig = Rig(provider, tools)
    out_a = await rig.spawn("a")
    await rig.spawn("b")
    await rig.spawn("idle")
    ta = rig.kernel.push("a", "a1")
    tb = rig.kernel.push("b", "b1")
    await out_a.wait_text("A")
    await tools.wait_calls(1)
    tb2 = rig.kernel.push("b", "b2")  # waits in the slot behind the tool

    stopper = asyncio.create_task(rig.kernel.stop_all())
    await yield_many()
    gate.set()  # stop_all waits for the tool
    assert await wait(stopper) == 3
    assert rig.kernel.children() == []
    for ticket in (ta, tb, tb2):
        res = await outcome(ticket)
        assert res.status == "interrupted"
        assert res.error == "stopped"
    assert not tools.records[0].cancelled
    assert asyncio.all_tasks() - before == set()
    with pytest.raises(KernelError):
        rig.kernel.push("a", "x")
    assert await rig.kernel.stop_all() == 0


@pytest.mark.parametrize("how", ["stop", "close"])
async def test_stop_and_close_leave_no_task_behind(how: str) -> None:
    """A stopped or closed child leaves no task of its own behind."""
    before = asyncio.all_tasks()
    rig = Rig(ScriptedProvider(default=[Text("ok")]))
    await rig.spawn("idle")
    await rig.spawn("used")
    await outcome(rig.kernel.push("used", "hello"))
    for child in ("idle", "used"):
        if how == "stop":
            await rig.kernel.stop(child)
        else:
            await rig.kernel.close(child)
        assert child not in rig.kernel.children()
    assert asyncio.all_tasks() - before == set()


# ------------------------------------------------------------------------ withdraw


async def test_withdraw_of_an_input_waiting_behind_a_tool() -> None:
    """An input waiting behind a tool is taken back: superseded, never run."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on", gate=gate)})
    provider = ScriptedProvider()
    provider.on("turn on the light", [Tools.of(call("t1", "light"))], [Text("Done.")])
    async with Rig(provider, tools) as rig:
        await rig.spawn("c1")
        first = rig.kernel.push("c1", "turn on the light")
        await tools.wait_calls(1)
        queued = rig.kernel.push("c1", "what is the")
        assert rig.kernel.withdraw("c1", queued.seq) is True
        assert (await outcome(queued)).status == "superseded"
        stats = rig.kernel.stats("c1")
        assert stats is not None and not stats.pending and stats.dropped == 1
        gate.set()
        # The tool round still ends at its check: a newer input had arrived.
        assert (await outcome(first)).status == "interrupted"
        asked = [c.user_text for c in provider.calls]
        assert "what is the" not in asked
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert "what is the" not in [m.content for m in transcript]
        assert rig.kernel.withdraw("c1", queued.seq) is False  # nothing left to take


async def test_withdraw_of_the_running_round_interrupts_it() -> None:
    """Withdrawing the input being answered cuts its round like interrupt()."""
    release = asyncio.Event()
    provider = ScriptedProvider([Text("Let me"), WaitFor(release), Text(" see")])
    async with Rig(provider) as rig:
        output = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "a question")
        await output.wait_text("Let me")
        assert rig.kernel.withdraw("c1", ticket.seq) is True
        result = await outcome(ticket)
        assert result.status == "interrupted" and result.text == "Let me"
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [m.role for m in transcript] == ["user", "assistant"]


async def test_withdraw_after_the_answer_does_nothing() -> None:
    """A finished input cannot be withdrawn; an unknown child raises."""
    async with Rig(ScriptedProvider([Text("Hi")])) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "hello")
        assert (await outcome(ticket)).status == "completed"
        assert rig.kernel.withdraw("c1", ticket.seq) is False
        with pytest.raises(KernelError):
            rig.kernel.withdraw("nobody", 1)
