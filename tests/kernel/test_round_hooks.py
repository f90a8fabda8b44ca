"""The output side's view of rounds: ``current_round_seq()``, ``on_round_end``, ``on_text_pause``.

A duplex session (``custom_components/rtvoice/duplex``) must know which round each
delta belongs to and when a round will emit no more text, without waiting for its
own final acknowledgement. Contract: every delta of round ``seq`` reaches the
handler with ``current_round_seq() == seq``, then ``on_round_end(child, seq)`` fires
exactly once, whatever the ending. ``on_text_pause(child, seq)`` fires once per model
call that ended with tool calls, after that call's last delta and before its first
tool starts (the output speaks a held-back preamble, issue 17 item 9).
"""

from __future__ import annotations

import asyncio
from collections import Counter
import logging

import pytest

from custom_components.rtvoice.kernel import (
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Kernel,
    current_child_id,
    current_round_seq,
)
from tests.kernel.fakes import (
    Notifier,
    Raise,
    ScriptedProvider,
    ScriptedToolRunner,
    Text,
    ToolBehaviour,
    Tools,
    WaitFor,
    call,
    outcome,
)

Event = tuple[str, str | None, int | None, str]  # kind, child, seq, text


class Hooks:
    """A kernel whose output handler and on_round_end record into one timeline."""

    def __init__(
        self,
        provider: ScriptedProvider,
        tools: ScriptedToolRunner | None = None,
        *,
        raise_in_hook: bool = False,
    ) -> None:
        """Wire a kernel with one RT pair ``c1``."""
        self.events: list[Event] = []
        self.notifier = Notifier()
        self._raise = raise_in_hook
        channels = ChannelRegistry()
        channels.register_input("c1-in", ChannelDef(realtime=True))
        channels.register_output(
            "c1-out", self._handler, definition=ChannelDef(realtime=True)
        )
        self.kernel = Kernel(
            provider,
            channels,
            tools=tools,
            on_round_end=self._end,
            on_text_pause=self._pause,
        )

    def _handler(self, text: str) -> None:
        self.events.append(("delta", current_child_id(), current_round_seq(), text))
        self.notifier.notify()

    def _end(self, child_id: str, seq: int) -> None:
        self.events.append(("end", child_id, seq, ""))
        self.notifier.notify()
        if self._raise:
            raise RuntimeError("hook failed")

    def _pause(self, child_id: str, seq: int) -> None:
        self.events.append(("pause", child_id, seq, ""))
        self.notifier.notify()
        if self._raise:
            raise RuntimeError("hook failed")

    async def spawn(self, **options: object) -> None:
        """Spawn child ``c1``."""
        await self.kernel.spawn(
            ChildOptions(id="c1", input="c1-in", output="c1-out", **options)  # type: ignore[arg-type]
        )

    def ends(self) -> list[int | None]:
        """Seqs reported ended, in order."""
        return [seq for kind, _, seq, _ in self.events if kind == "end"]

    async def wait_ended(self, seq: int) -> None:
        """Wait until ``seq`` was reported ended."""
        await self.notifier.wait_until(lambda: seq in self.ends())

    def assert_order(self) -> None:
        """Each seq ends once, after all of its deltas; deltas belong to c1."""
        counts = Counter(self.ends())
        assert all(n == 1 for n in counts.values()), counts
        ended: set[int | None] = set()
        for kind, child, seq, _ in self.events:
            assert child == "c1"
            if kind == "end":
                ended.add(seq)
            else:
                assert seq not in ended, f"{kind} of {seq} after its end"

    def text_of(self, seq: int) -> str:
        """Every delta of round ``seq``."""
        return "".join(
            t for kind, _, s, t in self.events if kind == "delta" and s == seq
        )


async def test_completed_round_deltas_carry_seq_then_one_end() -> None:
    """Deltas carry their round's seq; the end follows them once."""
    provider = ScriptedProvider()
    provider.on("hi", [Text("Hello "), Text("there.")])
    provider.on("again", [Text("Yes.")])
    hooks = Hooks(provider)
    await hooks.spawn()
    first = hooks.kernel.push("c1", "hi")
    assert (await outcome(first)).status == "completed"
    await hooks.wait_ended(first.seq)
    second = hooks.kernel.push("c1", "again")
    await outcome(second)
    await hooks.wait_ended(second.seq)
    assert hooks.events == [
        ("delta", "c1", first.seq, "Hello "),
        ("delta", "c1", first.seq, "there."),
        ("end", "c1", first.seq, ""),
        ("delta", "c1", second.seq, "Yes."),
        ("end", "c1", second.seq, ""),
    ]
    assert current_round_seq() is None  # only inside a round's task
    await hooks.kernel.stop_all()


async def test_end_does_not_wait_for_the_final_acknowledgement() -> None:
    """With acknowledged delivery the end fires when the text ends, unacknowledged."""
    provider = ScriptedProvider()
    provider.on("hi", [Text("Hello.")])
    hooks = Hooks(provider)
    await hooks.spawn(delivery="acknowledged")
    ticket = hooks.kernel.push("c1", "hi")
    await hooks.wait_ended(ticket.seq)
    assert hooks.text_of(ticket.seq) == "Hello."
    # The output side acknowledges later; nothing fires again.
    hooks.kernel.acknowledge("c1", ticket.seq, 6, final=True)
    await outcome(ticket)
    hooks.assert_order()
    assert hooks.ends() == [ticket.seq]
    await hooks.kernel.stop_all()


async def test_cut_round_ends_before_the_newer_round_speaks() -> None:
    """A barge-in: the cut round's end comes after its deltas, before the next round's."""
    never = asyncio.Event()
    provider = ScriptedProvider()
    provider.on("tell a story", [Text("Once "), Text("upon "), WaitFor(never)])
    provider.on("stop", [Text("Stopped.")])
    hooks = Hooks(provider)
    await hooks.spawn(delivery="acknowledged")
    first = hooks.kernel.push("c1", "tell a story")
    await hooks.notifier.wait_until(lambda: hooks.text_of(first.seq) == "Once upon ")
    second = hooks.kernel.push("c1", "stop")
    assert (await outcome(first)).status == "interrupted"
    await outcome(second)
    await hooks.wait_ended(second.seq)
    hooks.assert_order()
    kinds = [(k, s) for k, _, s, _ in hooks.events]
    assert kinds.index(("end", first.seq)) < kinds.index(("delta", second.seq))
    assert hooks.ends() == [first.seq, second.seq]
    await hooks.kernel.stop_all()


async def test_superseded_input_ends_once_without_deltas() -> None:
    """An input overwritten in the slot (during a tool) ends, with no delta."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"lights": ToolBehaviour(result="done", gate=gate)})
    provider = ScriptedProvider()
    provider.on("lights on", [Tools.of(call("t1", "lights"))], [Text("On.")])
    provider.on("third", [Text("Third.")])
    hooks = Hooks(provider, tools)
    await hooks.spawn(delivery="acknowledged", carry_over=True)
    first = hooks.kernel.push("c1", "lights on")
    await tools.wait_calls(1)
    second = hooks.kernel.push("c1", "second")  # cancel suppressed: tool running
    third = hooks.kernel.push("c1", "third")  # voids "second" in the slot
    assert (await outcome(second)).status == "superseded"
    assert hooks.ends() == [second.seq]  # at once, while the tool still runs
    gate.set()
    await outcome(first)
    await outcome(third)
    await hooks.wait_ended(third.seq)
    hooks.assert_order()
    assert sorted(s for s in hooks.ends() if s is not None) == [
        first.seq,
        second.seq,
        third.seq,
    ]
    assert hooks.text_of(second.seq) == ""
    await hooks.kernel.stop_all()


async def test_failed_round_ends_once() -> None:
    """A broken stream: the deltas before it, then one end."""
    provider = ScriptedProvider()
    provider.on("hi", [Text("Hel"), Raise(ConnectionError("gone"))])
    hooks = Hooks(provider)
    await hooks.spawn(delivery="acknowledged")
    ticket = hooks.kernel.push("c1", "hi")
    assert (await outcome(ticket)).status == "failed"
    await hooks.wait_ended(ticket.seq)
    hooks.assert_order()
    assert hooks.text_of(ticket.seq) == "Hel"
    await hooks.kernel.stop_all()


async def test_stop_ends_the_running_round_and_the_waiting_input() -> None:
    """A stop: the running round and the input waiting in the slot both end once."""
    gate = asyncio.Event()
    tools = ScriptedToolRunner({"slow": ToolBehaviour(result="ok", gate=gate)})
    provider = ScriptedProvider()
    provider.on("go", [Text("Working. "), Tools.of(call("t1", "slow"))], [Text("x")])
    hooks = Hooks(provider, tools)
    await hooks.spawn()
    first = hooks.kernel.push("c1", "go")
    await tools.wait_calls(1)
    second = hooks.kernel.push("c1", "waiting")  # suppressed: waits in the slot
    stopping = asyncio.create_task(hooks.kernel.stop("c1"))
    await hooks.wait_ended(second.seq)
    gate.set()
    await stopping
    await outcome(first)
    hooks.assert_order()
    assert sorted(s for s in hooks.ends() if s is not None) == [first.seq, second.seq]


async def test_a_failing_hook_is_logged_and_the_child_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The hook's error never reaches the round."""
    provider = ScriptedProvider(default=[Text("ok")])
    hooks = Hooks(provider, raise_in_hook=True)
    await hooks.spawn()
    with caplog.at_level(logging.ERROR):
        first = hooks.kernel.push("c1", "one")
        assert (await outcome(first)).status == "completed"
        second = hooks.kernel.push("c1", "two")
        assert (await outcome(second)).status == "completed"
    assert "on_round_end callback failed" in caplog.text
    hooks.assert_order()
    await hooks.kernel.stop_all()


async def test_text_pauses_before_each_tool_group_starts() -> None:
    """One pause per model call that ends in tool calls, before its first tool runs."""
    provider = ScriptedProvider()
    tools = ScriptedToolRunner({"lights": ToolBehaviour(result="done")})
    provider.on(
        "lights on",
        [Text("Let me check."), Tools.of(call("t1", "lights"), call("t2", "lights"))],
        [Text("One more."), Tools.of(call("t3", "lights"))],
        [Text("Done.")],
    )
    hooks = Hooks(provider, tools)
    tools.on_start = lambda record: hooks.events.append(
        ("tool", "c1", current_round_seq(), record.call.id)
    )
    await hooks.spawn()
    ticket = hooks.kernel.push("c1", "lights on")
    assert (await outcome(ticket)).status == "completed"
    await hooks.wait_ended(ticket.seq)
    hooks.assert_order()
    assert [(kind, text) for kind, _, _, text in hooks.events] == [
        ("delta", "Let me check."),
        ("pause", ""),
        ("tool", "t1"),
        ("tool", "t2"),
        ("delta", "One more."),
        ("pause", ""),
        ("tool", "t3"),
        ("delta", "Done."),
        ("end", ""),
    ]
    assert {seq for _, _, seq, _ in hooks.events} == {ticket.seq}
    await hooks.kernel.stop_all()


async def test_a_round_without_tools_never_pauses() -> None:
    """A plain answer: deltas and one end, no pause."""
    provider = ScriptedProvider()
    provider.on("hi", [Text("Hello.")])
    hooks = Hooks(provider)
    await hooks.spawn()
    await outcome(hooks.kernel.push("c1", "hi"))
    assert [kind for kind, *_ in hooks.events] == ["delta", "end"]
    await hooks.kernel.stop_all()


async def test_a_raising_pause_hook_never_breaks_the_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The pause hook's error is logged; the tool still runs and the round completes."""
    provider = ScriptedProvider()
    tools = ScriptedToolRunner({"lights": ToolBehaviour(result="done")})
    provider.on("lights on", [Tools.of(call("t1", "lights"))], [Text("On.")])
    hooks = Hooks(provider, tools, raise_in_hook=True)
    await hooks.spawn()
    with caplog.at_level(logging.ERROR):
        result = await outcome(hooks.kernel.push("c1", "lights on"))
    assert result.status == "completed" and result.text == "On."
    assert len(tools.calls) == 1
    assert "on_text_pause callback failed" in caplog.text
    await hooks.kernel.stop_all()
