"""Property tests: random interleavings of pushes, deltas, tools and interrupts.

Invariants (DESIGN 4.2-4.6, 4.9):
* every history is validly paired (``drop_unpaired_tool_calls(h) is h``) and has no
  empty assistant message, at every point;
* ticket seqs of a child strictly increase;
* at most one round runs per child at any time (no second stream while a stream or a
  tool of that child is open);
* completed inputs are in the history, superseded ones never, users in push order;
* after ``stop_all`` every ticket is resolved and no task is left behind.

A second test adds lifecycles: tool groups of several calls, stops and closes while
tool gates are closed (their callers sometimes cancelled), delivery reports and
carry-over; ``on_closed`` fires exactly once per closed child with its final count.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
import itertools
from typing import Literal

from hypothesis import HealthCheck, event, given, settings, strategies as st

from custom_components.rtvoice.kernel import (
    KernelError,
    Message,
    Ticket,
    ToolCall,
    drop_unpaired_tool_calls,
    estimate_tokens,
    trim_to_window,
)
from tests.kernel.fakes import (
    ActivityTracker,
    Pause,
    Rig,
    Script,
    ScriptedProvider,
    ScriptedToolRunner,
    Step,
    StreamCall,
    Text,
    ToolBehaviour,
    ToolRecord,
    Tools,
    WaitFor,
    call,
    unexpected_empty_assistant,
)

CHILDREN = ("a", "b")
GATES = 4

# ---------------------------------------------------------------- abstract scripts

StepSpec = (
    tuple[Literal["text"], str]
    | tuple[Literal["gate"], int]
    | tuple[Literal["pause"], int]
    | tuple[Literal["tool"], str]
    | tuple[Literal["tools"], tuple[str, ...]]
)

_tool_step = st.tuples(
    st.just("tool"),
    st.sampled_from(["fast", "err", *[f"slow{i}" for i in range(GATES)]]),
)
step_specs: st.SearchStrategy[StepSpec] = st.one_of(
    st.tuples(st.just("text"), st.sampled_from(["Hi", " there", ".", "ok"])),
    st.tuples(st.just("gate"), st.integers(0, GATES - 1)),
    st.tuples(st.just("pause"), st.integers(1, 3)),
    _tool_step,
    _tool_step,
)
script_specs = st.lists(step_specs, min_size=1, max_size=4)

ActionSpec = (
    tuple[Literal["push"], str, int]  # child, yields after the push
    | tuple[Literal["release"], int]
    | tuple[Literal["yield"], int]
    | tuple[Literal["interrupt"], str]
)

_push = st.tuples(st.just("push"), st.sampled_from(CHILDREN), st.integers(0, 8))
actions: st.SearchStrategy[ActionSpec] = st.one_of(
    _push,
    _push,
    st.tuples(st.just("release"), st.integers(0, GATES - 1)),
    st.tuples(st.just("yield"), st.integers(1, 6)),
    st.tuples(st.just("interrupt"), st.sampled_from(CHILDREN)),
)


@dataclass
class World:
    """Gates and the abstract scripts left per child."""

    gates: list[asyncio.Event]
    scripts: dict[str, list[list[StepSpec]]]
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def materialise(self, child: str, spec: list[StepSpec]) -> Script:
        """Turn an abstract script into provider steps for ``child``."""
        steps: list[Step] = []
        for kind, value in spec:
            if kind == "text":
                steps.append(Text(str(value)))
            elif kind == "gate":
                steps.append(WaitFor(self.gates[int(value)]))
            elif kind == "pause":
                steps.append(Pause(int(value)))
            elif kind == "tools":
                steps.append(
                    Tools.of(
                        *(call(f"{child}:{next(self.ids)}", str(n)) for n in value),
                        content="One moment. ",
                    )
                )
            else:
                steps.append(Tools.of(call(f"{child}:{next(self.ids)}", str(value))))
        return steps

    def script_for(self, record: StreamCall) -> Script:
        """Pick the next abstract script of the calling child."""
        child = record.key
        queue = self.scripts.get(child, [])
        if queue:
            return self.materialise(child, queue.pop(0))
        return [Text("fine")]


def _child_of(messages: list[Message]) -> str:
    system = messages[0].content if messages else ""
    for name in CHILDREN:
        if f"[{name}]" in system:
            return name
    return "?"


def _check_history(history: list[Message]) -> None:
    assert drop_unpaired_tool_calls(history) is history
    assert not unexpected_empty_assistant(history)
    if history:
        assert history[0].role == "user"


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n_children=st.integers(1, 2),
    scripts_a=st.lists(script_specs, min_size=1, max_size=5),
    scripts_b=st.lists(script_specs, min_size=1, max_size=5),
    plan=st.lists(actions, min_size=2, max_size=14),
    release_order=st.permutations(list(range(GATES))),
    settle=st.booleans(),
)
async def test_random_interleavings_keep_the_invariants(  # noqa: PLR0917
    n_children: int,
    scripts_a: list[list[StepSpec]],
    scripts_b: list[list[StepSpec]],
    plan: list[ActionSpec],
    release_order: list[int],
    settle: bool,
) -> None:
    """Random interleavings keep the invariants."""
    tasks_before = asyncio.all_tasks()
    gates = [asyncio.Event() for _ in range(GATES)]
    world = World(gates=gates, scripts={"a": list(scripts_a), "b": list(scripts_b)})
    tracker = ActivityTracker()
    provider = ScriptedProvider(
        default=world.script_for, key=_child_of, tracker=tracker
    )
    behaviours = {
        "fast": ToolBehaviour(result="fast-done"),
        "err": ToolBehaviour(error=RuntimeError("tool broke")),
        **{
            f"slow{i}": ToolBehaviour(result=f"slow{i}-done", gate=gates[i])
            for i in range(GATES)
        },
    }
    tools = ScriptedToolRunner(
        behaviours, tracker=tracker, key=lambda c: c.id.split(":", 1)[0]
    )
    rig = Rig(provider, tools)
    children = CHILDREN[:n_children]
    for name in children:
        await rig.spawn(name, system_prompt=f"[{name}]")

    pushed: dict[str, list[tuple[str, Ticket]]] = {name: [] for name in children}
    counter = itertools.count()

    def check_live() -> None:
        assert tracker.violations == []
        for name in children:
            history = rig.kernel.transcript(name)
            assert history is not None
            _check_history(history)

    try:
        for action in plan:
            kind, arg = action[0], action[1]
            if kind == "push":
                if arg not in children:
                    continue
                text = f"{arg}-{next(counter)}"
                pushed[str(arg)].append((text, rig.kernel.push(str(arg), text)))
                for _ in range(int(action[2]) if len(action) > 2 else 0):
                    await asyncio.sleep(0)
            elif kind == "release":
                gates[int(arg)].set()
            elif kind == "yield":
                for _ in range(int(arg)):
                    await asyncio.sleep(0)
            elif arg in children:
                rig.kernel.interrupt(str(arg))
            check_live()

        if settle:  # let everything run a little, gates opening in a random order
            for index in release_order:
                gates[index].set()
                await asyncio.sleep(0)
            check_live()
        for name in children:
            stats = rig.kernel.stats(name)
            assert stats is not None
            event(f"suppressed cancels: {stats.suppressed_cancels > 0}")
            event(f"dropped: {stats.dropped > 0}")
        histories_before_stop = {name: rig.kernel.transcript(name) for name in children}
        done_before_stop = {
            id(t) for entries in pushed.values() for _, t in entries if t.outcome.done()
        }
    finally:
        for gate in gates:
            gate.set()
        stopped = await asyncio.wait_for(rig.kernel.stop_all(), 15)

    assert stopped == len(children)
    event(f"tool calls: {min(len(tools.records), 3)}+")
    assert asyncio.all_tasks() - tasks_before == set(), (
        "task left behind after stop_all"
    )
    assert tracker.violations == []
    assert all(v <= 1 for v in tracker.max_streams.values())

    for name in children:
        tickets = [t for _, t in pushed[name]]
        seqs = [t.seq for t in tickets]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert all(t.outcome.done() for t in tickets), "ticket left open after stop_all"
        outcomes = [t.outcome.result() for t in tickets]
        for o in outcomes:  # visible with --hypothesis-show-statistics
            event(f"outcome {o.status}{' (stopped)' if o.error == 'stopped' else ''}")
        assert all(
            o.status in ("completed", "interrupted", "superseded", "failed")
            for o in outcomes
        )

        # a stopped (not closed) child's transcript may be gone: judge the history
        # as it was right before stop_all, for the tickets resolved by then
        after = rig.kernel.transcript(name)
        if after is not None:
            _check_history(after)
        history = histories_before_stop[name] or []
        _check_history(history)
        users = [m.content for m in history if m.role == "user"]
        order = [text for text, _ in pushed[name]]
        assert [order.index(u) for u in users] == sorted(order.index(u) for u in users)
        assert len(set(users)) == len(users)
        for (text, ticket), result in zip(pushed[name], outcomes, strict=True):
            if result.status == "superseded":
                assert text not in users
                assert result.text == ""
            if id(ticket) not in done_before_stop:
                continue
            if result.status == "completed":
                assert text in users

    for record in provider.calls:
        assert record.messages[0].role == "system"
        assert drop_unpaired_tool_calls(record.messages) is record.messages


# ---------------------------------------------------------------- pure helpers


def _group_messages(draw_groups: list[tuple[str, int, int]]) -> list[Message]:
    """Build system + history of groups + last user from (kind, size, n_calls)."""
    out = [Message("system", "s" * 50)]
    ids = itertools.count()
    for kind, size, n_calls in draw_groups:
        body = "x" * size
        if kind == "user":
            out.append(Message("user", body))
        elif kind == "assistant":
            out.append(Message("assistant", body or "."))
        else:
            calls = [f"k{next(ids)}" for _ in range(max(1, n_calls))]
            out.append(
                Message(
                    "assistant",
                    "",
                    tool_calls=[ToolCall(c, "f", {"a": size}) for c in calls],
                )
            )
            out.extend(Message("tool", body, tool_call_id=c) for c in calls)
    out.append(Message("user", "now"))
    return out


groups = st.lists(
    st.tuples(
        st.sampled_from(["user", "assistant", "tools"]),
        st.integers(0, 400),
        st.integers(1, 3),
    ),
    max_size=12,
)


@settings(max_examples=100, deadline=None, database=None)
@given(groups=groups, window=st.integers(1, 3000))
def test_trim_keeps_whole_groups_and_a_suffix(
    groups: list[tuple[str, int, int]], window: int
) -> None:
    """Trim keeps whole groups and a suffix."""
    messages = _group_messages(groups)
    out = trim_to_window(messages, window)
    assert out[0] is messages[0] or out[0] == messages[0]
    assert out[-1] == messages[-1]
    kept = out[1:-1]
    middle = messages[1:-1]
    assert kept == middle[len(middle) - len(kept) :]
    assert drop_unpaired_tool_calls(out) is out
    if kept:
        assert kept[0].role != "tool"
    bigger = trim_to_window(messages, window * 2 + 1)
    assert len(bigger) >= len(out)


@settings(max_examples=100, deadline=None, database=None)
@given(a=st.text(max_size=200), b=st.text(max_size=200))
def test_estimate_tokens_does_not_shrink_when_text_grows(a: str, b: str) -> None:
    """Estimate tokens does not shrink when text grows."""
    assert estimate_tokens(a + b) >= estimate_tokens(a)
    assert estimate_tokens(a) >= 0


# ---------------------------------------------------------------- lifecycles

_tool_names = st.sampled_from(["fast", "err", *[f"slow{i}" for i in range(GATES)]])
_group_step = st.tuples(
    st.just("tools"), st.lists(_tool_names, min_size=2, max_size=3).map(tuple)
)
life_step_specs: st.SearchStrategy[StepSpec] = st.one_of(
    st.tuples(st.just("text"), st.sampled_from(["Hi", " there", ".", "ok"])),
    st.tuples(st.just("gate"), st.integers(0, GATES - 1)),
    st.tuples(st.just("pause"), st.integers(1, 3)),
    _tool_step,
    _group_step,
    _group_step,
)
life_scripts = st.lists(life_step_specs, min_size=1, max_size=4)

LifeAction = (
    ActionSpec
    | tuple[Literal["ack"], str, int, bool]  # child, chars, final
    | tuple[Literal["stop", "close"], str, int, bool]  # child, yields, cancel caller
)

life_actions: st.SearchStrategy[LifeAction] = st.one_of(
    _push,
    _push,
    _push,
    st.tuples(st.just("release"), st.integers(0, GATES - 1)),
    st.tuples(st.just("yield"), st.integers(1, 6)),
    st.tuples(st.just("interrupt"), st.sampled_from(CHILDREN)),
    st.tuples(
        st.just("ack"), st.sampled_from(CHILDREN), st.integers(0, 30), st.booleans()
    ),
    st.tuples(
        st.sampled_from(["stop", "close"]),
        st.sampled_from(CHILDREN),
        st.integers(0, 6),
        st.booleans(),
    ),
)


def _words(history: list[Message]) -> list[str]:
    """Pushed texts in the users' messages (carry-over joins them with spaces)."""
    return [word for m in history if m.role == "user" for word in m.content.split()]


@dataclass
class Life:
    """A rig with two children driven by a random plan of lifecycle actions."""

    rig: Rig
    carry_over: tuple[bool, bool]
    pushed: dict[str, list[tuple[str, Ticket]]] = field(
        default_factory=lambda: {name: [] for name in CHILDREN}
    )
    closers: list[asyncio.Task[object]] = field(default_factory=list)
    close_requested: set[str] = field(default_factory=set)
    counter: itertools.count[int] = field(default_factory=itertools.count)

    async def act(self, action: LifeAction, gates: list[asyncio.Event]) -> None:
        """Perform one action (actions on a child that is gone are skipped)."""
        kernel = self.rig.kernel
        kind, name = action[0], str(action[1])
        live = name in kernel.children()
        if kind == "release":
            gates[int(action[1])].set()
        elif kind == "yield":
            await _steps(int(action[1]))
        elif kind == "ack" and self.pushed[name]:
            seq = self.pushed[name][-1][1].seq
            kernel.acknowledge(name, seq, int(action[2]), final=bool(action[3]))
        elif not live:
            return
        elif kind == "push":
            text = f"{name}-{next(self.counter)}"
            with contextlib.suppress(KernelError):  # a teardown has begun
                self.pushed[name].append((text, kernel.push(name, text)))
            await _steps(int(action[2]))
        elif kind == "interrupt":
            with contextlib.suppress(KernelError):
                kernel.interrupt(name)
        elif kind in ("stop", "close"):
            if kind == "close":
                self.close_requested.add(name)
            method = kernel.close if kind == "close" else kernel.stop
            task: asyncio.Task[object] = asyncio.create_task(method(name))
            self.closers.append(task)
            await _steps(int(action[2]))
            if action[3]:
                task.cancel()
                event("a stop/close caller was cancelled")

    async def finish(self) -> None:
        """Close what is left (also joining running teardowns), await every caller."""
        self.close_requested.update(self.rig.kernel.children())
        await asyncio.wait_for(self.rig.kernel.close_all(), 15)
        for task in self.closers:
            with contextlib.suppress(asyncio.CancelledError, KernelError):
                await task

    def check_closed(self) -> None:
        """on_closed fired once per closed child with its final count."""
        kernel = self.rig.kernel
        closed_ids = [c[0] for c in self.rig.closed]
        assert len(closed_ids) == len(set(closed_ids)), "on_closed fired twice"
        for child_id, messages, _ in self.rig.closed:
            assert child_id in self.close_requested
            archived = kernel.transcript(child_id)
            assert archived is not None and len(archived) == messages
            _check_history(archived)
        for name in self.close_requested:
            assert (name in closed_ids) == bool(kernel.transcript(name))

    def check_tickets(self) -> None:
        """Every ticket settled; users' words in push order, each once."""
        for index, name in enumerate(CHILDREN):
            for _, ticket in self.pushed[name]:
                assert ticket.outcome.done(), "ticket left open"
            history = self.rig.kernel.transcript(name)
            if history is None:
                continue
            words = _words(history)
            order = [text for text, _ in self.pushed[name]]
            assert len(set(words)) == len(words)
            positions = [order.index(w) for w in words]
            assert positions == sorted(positions)
            for text, ticket in self.pushed[name]:
                result = ticket.outcome.result()
                event(f"outcome {result.status}")
                if result.status == "superseded" and not self.carry_over[index]:
                    assert text not in words
                if result.status == "completed":
                    assert text in words


async def _steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    scripts_a=st.lists(life_scripts, min_size=1, max_size=5),
    scripts_b=st.lists(life_scripts, min_size=1, max_size=5),
    plan=st.lists(life_actions, min_size=2, max_size=16),
    acknowledged=st.tuples(st.booleans(), st.booleans()),
    carry_over=st.tuples(st.booleans(), st.booleans()),
)
async def test_random_lifecycles_keep_the_invariants(
    scripts_a: list[list[StepSpec]],
    scripts_b: list[list[StepSpec]],
    plan: list[LifeAction],
    acknowledged: tuple[bool, bool],
    carry_over: tuple[bool, bool],
) -> None:
    """Stops, closes, cancelled callers and delivery reports keep the invariants."""
    tasks_before = asyncio.all_tasks()
    gates = [asyncio.Event() for _ in range(GATES)]
    world = World(gates=gates, scripts={"a": list(scripts_a), "b": list(scripts_b)})
    tracker = ActivityTracker()
    provider = ScriptedProvider(
        default=world.script_for, key=_child_of, tracker=tracker
    )
    behaviours = {
        "fast": ToolBehaviour(result="fast-done"),
        "err": ToolBehaviour(error=RuntimeError("tool broke")),
        **{
            f"slow{i}": ToolBehaviour(result=f"slow{i}-done", gate=gates[i])
            for i in range(GATES)
        },
    }
    tools = ScriptedToolRunner(
        behaviours, tracker=tracker, key=lambda c: c.id.split(":", 1)[0]
    )
    life = Life(Rig(provider, tools), carry_over)
    started_after_stop: list[str] = []

    def on_tool_start(record: ToolRecord) -> None:
        # white box: no tool call may start once its child's stop has begun
        child = life.rig.kernel._children.get(record.call.id.split(":", 1)[0])  # noqa: SLF001
        if child is not None and child.stopped:
            started_after_stop.append(record.call.id)

    tools.on_start = on_tool_start
    for index, name in enumerate(CHILDREN):
        await life.rig.spawn(
            name,
            system_prompt=f"[{name}]",
            delivery="acknowledged" if acknowledged[index] else "emitted",
            carry_over=carry_over[index],
        )
    try:
        for action in plan:
            await life.act(action, gates)
            assert tracker.violations == []
            for name in CHILDREN:
                history = life.rig.kernel.transcript(name)
                if history is not None:
                    _check_history(history)
    finally:
        for gate in gates:
            gate.set()
        await life.finish()

    assert life.rig.kernel.children() == []
    assert started_after_stop == []
    assert asyncio.all_tasks() - tasks_before == set(), "task left behind"
    assert tracker.violations == []
    life.check_closed()
    life.check_tickets()
    for record in provider.calls:
        assert drop_unpaired_tool_calls(record.messages) is record.messages
