"""What the user heard: delivery acknowledgement (DESIGN 4.4; issue 6 defect 8).

With ``ChildOptions(delivery="acknowledged")`` only what the output side reports
through ``Kernel.acknowledge`` counts as heard: a cut round commits only that, and a
completed round whose playback was cut afterwards is truncated to it.
"""

from __future__ import annotations

import asyncio
import json

from custom_components.rtvoice.kernel import INTERRUPTED_MARKER, Kernel, Message
from custom_components.rtvoice.kernel.context import message_tokens, render_for_model
from tests.kernel.fakes import (
    Raise,
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

ACK = {"delivery": "acknowledged"}


def _history(rig: Rig, child: str = "c1") -> list[tuple[str, str, bool]]:
    transcript = rig.kernel.transcript(child)
    assert transcript is not None
    return [(m.role, m.content, m.interrupted) for m in transcript]


def _tokens_consistent(kernel: Kernel, child: str) -> bool:
    """White box: the running token estimate matches the history it counts."""
    state = kernel._children[child]  # noqa: SLF001 - accounting is internal
    shown = render_for_model(state.history)
    return state.shown_history() == shown and state.history_tokens == sum(
        message_tokens(m) for m in shown
    )


async def test_cut_round_with_nothing_heard_commits_only_the_input() -> None:
    """A satellite that heard nothing of a cut answer: no assistant text is stored."""
    never = asyncio.Event()
    provider = ScriptedProvider(default=[Text("ok")])
    provider.on("tell me a story", [Text("Once upon "), Text("a time"), WaitFor(never)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1", **ACK)
        first = rig.kernel.push("c1", "tell me a story")
        await out.wait_text("a time")
        second = rig.kernel.push("c1", "stop")
        result = await outcome(first)
        assert result.status == "interrupted" and result.text == ""
        assert _history(rig)[0] == ("user", "tell me a story", False)
        await outcome(second)
        assert _history(rig)[:2] == [
            ("user", "tell me a story", False),
            ("user", "stop", False),
        ]
        assert provider.calls[-1].roles == ["system", "user", "user"]


async def test_cut_round_commits_only_the_acknowledged_part() -> None:
    """Acknowledged characters are committed (interrupted); the rest is not."""
    never = asyncio.Event()
    provider = ScriptedProvider(default=[Text("ok")])
    provider.on("hi", [Text("Hello there. "), Text("How are"), WaitFor(never)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "hi")
        await out.wait_text("How are")
        rig.kernel.acknowledge("c1", ticket.seq, 5)
        rig.kernel.acknowledge("c1", ticket.seq, 13)
        rig.kernel.acknowledge("c1", ticket.seq, 3)  # monotonic: ignored
        rig.kernel.acknowledge("c1", ticket.seq + 7, 99)  # unknown seq: ignored
        rig.kernel.acknowledge("nobody", ticket.seq, 99)  # unknown child: ignored
        rig.kernel.interrupt("c1")
        result = await outcome(ticket)
        assert result.status == "interrupted" and result.text == "Hello there. "
        assert _history(rig) == [
            ("user", "hi", False),
            ("assistant", "Hello there. ", True),
        ]
        assert _tokens_consistent(rig.kernel, "c1")


async def test_a_late_report_after_the_cut_still_corrects_the_history() -> None:
    """The output side may report after the kernel committed the cut round."""
    never = asyncio.Event()
    provider = ScriptedProvider(
        [Text("Hello there. "), Text("How are"), WaitFor(never)]
    )
    async with Rig(provider) as rig:
        out = await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "hi")
        await out.wait_text("How are")
        rig.kernel.interrupt("c1")
        assert (await outcome(ticket)).text == ""
        assert _history(rig) == [("user", "hi", False)]
        rig.kernel.acknowledge("c1", ticket.seq, 16, final=True)
        assert _history(rig) == [
            ("user", "hi", False),
            ("assistant", "Hello there. How", True),
        ]
        rig.kernel.acknowledge("c1", ticket.seq, 20)  # after final: ignored
        assert _history(rig)[-1][1] == "Hello there. How"
        assert _tokens_consistent(rig.kernel, "c1")


async def test_completed_round_cut_in_playback_is_truncated() -> None:
    """Duplex: the model finished, playback was cut; history keeps what was heard."""
    provider = ScriptedProvider(default=[Text("ok")])
    provider.on("weather", [Text("It is sunny. "), Text("Tomorrow rain.")])
    async with Rig(provider) as rig:
        await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "weather")
        result = await outcome(ticket)
        assert result.status == "completed"
        assert result.text == "It is sunny. Tomorrow rain."
        assert _history(rig)[-1] == ("assistant", "It is sunny. Tomorrow rain.", False)
        rig.kernel.acknowledge("c1", ticket.seq, 13)  # not final: still in full
        assert _history(rig)[-1] == ("assistant", "It is sunny. Tomorrow rain.", False)
        rig.kernel.acknowledge("c1", ticket.seq, 13, final=True)
        assert _history(rig) == [
            ("user", "weather", False),
            ("assistant", "It is sunny. ", True),
        ]
        assert _tokens_consistent(rig.kernel, "c1")
        await outcome(rig.kernel.push("c1", "and then?"))
        sent = provider.calls[-1].messages
        assert sent[2].role == "assistant"
        assert sent[2].content == "It is sunny." + INTERRUPTED_MARKER


async def test_completed_round_heard_in_full_is_left_alone() -> None:
    """A final report of the whole answer changes nothing."""
    provider = ScriptedProvider([Text("Done.")])
    async with Rig(provider) as rig:
        await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "go")
        await outcome(ticket)
        rig.kernel.acknowledge("c1", ticket.seq, 99, final=True)
        assert _history(rig)[-1] == ("assistant", "Done.", False)


async def test_only_the_most_recent_round_is_amended() -> None:
    """Once a newer round has built on an answer, a late report changes nothing."""
    provider = ScriptedProvider([Text("First answer.")], [Text("Second.")])
    async with Rig(provider) as rig:
        await rig.spawn("c1", **ACK)
        first = rig.kernel.push("c1", "one")
        await outcome(first)
        await outcome(rig.kernel.push("c1", "two"))
        rig.kernel.acknowledge("c1", first.seq, 3, final=True)
        assert ("assistant", "First answer.", False) in _history(rig)


async def test_report_counts_text_across_model_calls() -> None:
    """Offsets run over every delta of the round.

    A tool group keeps the text that was heard when the group was committed.
    """
    gate = asyncio.Event()
    never = asyncio.Event()
    tools = ScriptedToolRunner({"light": ToolBehaviour(result="on", gate=gate)})
    provider = ScriptedProvider(
        [Tools.of(call("t1", "light"), content="Let me check. ")],
        [Text("The light "), Text("is on."), WaitFor(never)],
    )
    async with Rig(provider, tools) as rig:
        out = await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "is the light on")
        await tools.wait_calls(1)
        rig.kernel.acknowledge("c1", ticket.seq, 6)  # "Let me" heard so far
        gate.set()
        await out.wait_text("is on.")
        rig.kernel.acknowledge("c1", ticket.seq, 14 + 10)  # "... The light "
        rig.kernel.interrupt("c1")
        result = await outcome(ticket)
        assert result.text == "Let me check. The light "
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.content, m.interrupted) for m in transcript] == [
            ("user", "is the light on", False),
            ("assistant", "Let me", False),
            ("tool", "on", False),
            ("assistant", "The light ", True),
        ]


async def test_emitted_mode_ignores_reports() -> None:
    """By default every emitted delta counts; acknowledge changes nothing."""
    never = asyncio.Event()
    provider = ScriptedProvider([Text("Hello "), WaitFor(never)])
    async with Rig(provider) as rig:
        out = await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "hi")
        await out.wait_text("Hello ")
        rig.kernel.acknowledge("c1", ticket.seq, 0, final=True)
        rig.kernel.interrupt("c1")
        assert (await outcome(ticket)).text == "Hello "
        assert _history(rig)[-1] == ("assistant", "Hello ", True)


def test_message_defaults_are_not_interrupted() -> None:
    """A plain message is neither interrupted nor failed."""
    assert Message("assistant", "x").interrupted is False


# ------------------------------------------------------------ failed rounds


async def test_failed_round_commits_what_the_user_was_told() -> None:
    """A failed round stores the reply the adapter gave, never the unheard partial."""
    provider = ScriptedProvider(
        [Text("The forecast "), Raise(ConnectionError("stream dropped"))],
        [Text("Sunny.")],
    )
    async with Rig(provider) as rig:
        await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "weather")
        failed = await outcome(ticket)
        assert failed.status == "failed" and failed.text == ""
        assert _history(rig) == [("user", "weather", False)]
        rig.kernel.record_reply("c1", ticket.seq, "Sorry, I couldn't reach the model.")
        rig.kernel.record_reply("c1", ticket.seq, "twice")  # once per round
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert [(m.role, m.content, m.failed) for m in transcript] == [
            ("user", "weather", False),
            ("assistant", "Sorry, I couldn't reach the model.", True),
        ]
        assert _tokens_consistent(rig.kernel, "c1")
        assert rig.kernel.transcript_page("c1").splitlines() == [
            "[user] weather",
            "[assistant, failed] Sorry, I couldn't reach the model.",
        ]
        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert raw["messages"][1]["failed"] is True
        await outcome(rig.kernel.push("c1", "try again"))
        sent = provider.calls[-1].messages
        assert [(m.role, m.content) for m in sent[1:]] == [
            ("user", "weather"),
            ("assistant", "Sorry, I couldn't reach the model."),
            ("user", "try again"),
        ]


async def test_failed_round_keeps_the_delivered_part_marked() -> None:
    """A text caller saw the partial: it stays, interrupted, before the reply."""
    provider = ScriptedProvider([Text("The forecast "), Raise(ConnectionError("x"))])
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        ticket = rig.kernel.push("c1", "weather")
        assert (await outcome(ticket)).text == "The forecast "
        rig.kernel.record_reply("c1", ticket.seq, "Sorry.")
        assert rig.kernel.transcript_page("c1").splitlines() == [
            "[user] weather",
            "[assistant, interrupted] The forecast ",
            "[assistant, failed] Sorry.",
        ]
        raw = json.loads(rig.kernel.transcript_page("c1", fmt="raw"))
        assert raw["messages"][1]["interrupted"] is True
        assert "failed" not in raw["messages"][1]


async def test_record_reply_only_for_the_latest_failed_round() -> None:
    """A reply for a round that did not fail, or an older one, is ignored."""
    provider = ScriptedProvider(
        [Raise(ConnectionError("x"))], [Text("Fine.")], default=[Text("ok")]
    )
    async with Rig(provider) as rig:
        await rig.spawn("c1")
        failed = rig.kernel.push("c1", "one")
        await outcome(failed)
        done = rig.kernel.push("c1", "two")
        await outcome(done)
        rig.kernel.record_reply("c1", failed.seq, "Sorry.")  # a newer round exists
        rig.kernel.record_reply("c1", done.seq, "Sorry.")  # it did not fail
        rig.kernel.record_reply("ghost", done.seq, "Sorry.")  # unknown child
        transcript = rig.kernel.transcript("c1")
        assert transcript is not None
        assert not any(m.failed for m in transcript)


async def test_playback_cut_before_the_model_finished_is_kept_on_completion() -> None:
    """A final report during the stream still counts when the round completes."""
    gate = asyncio.Event()
    provider = ScriptedProvider(
        [Text("It is sunny. "), WaitFor(gate), Text("Tomorrow rain.")]
    )
    async with Rig(provider) as rig:
        out = await rig.spawn("c1", **ACK)
        ticket = rig.kernel.push("c1", "weather")
        await out.wait_text("It is sunny. ")
        rig.kernel.acknowledge("c1", ticket.seq, 6, final=True)  # "It is " heard
        gate.set()
        assert (await outcome(ticket)).status == "completed"
        assert _history(rig) == [
            ("user", "weather", False),
            ("assistant", "It is ", True),
        ]
        assert _tokens_consistent(rig.kernel, "c1")
