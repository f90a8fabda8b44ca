"""In-memory test doubles for the realtime kernel (no network, no hass).

* :class:`ScriptedProvider` plays one script per ``stream()`` call. A script is a list of
  steps: :class:`Text` (a text delta), :class:`Tools` (a delta with complete tool
  calls), :class:`WaitFor` (block until the test sets an ``asyncio.Event``),
  :class:`Mark` (set an event when the script reaches that point), :class:`Pause`
  (yield to the loop) and :class:`Raise` (raise an exception from the stream). Every call is recorded with a deep copy of the
  ``messages`` and ``tools`` it got, and with events for "started", "ended" and
  "closed early" (``aclose``/``GeneratorExit`` or cancellation inside the generator).
* :class:`ScriptedToolRunner` offers tools whose behaviour is scripted per name: a
  result, a gate event to block on, or an exception to raise. Every call is recorded.
* :class:`OutputRecorder` is an output-channel handler that records every delta.
* :class:`Rig` wires a :class:`Kernel` with these doubles and cleans up after a test.

Synchronisation is by events only: helpers await a predicate that is re-checked
whenever a double records something (:class:`Notifier`); a bounded ``wait_for`` is the
safety net, never the mechanism.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
import copy
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from custom_components.rtvoice.kernel import (
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    Message,
    Outcome,
    PromptRegistry,
    Ticket,
    ToolCall,
    ToolSpec,
)
from custom_components.rtvoice.kernel.channels import OutputHandler

SAFETY_TIMEOUT = 5.0  # seconds; a safety net against hangs, never a synchronisation
RT = ChannelDef(realtime=True)


def rt_pair(channels: ChannelRegistry, name: str, handler: OutputHandler) -> None:
    """Register ``<name>-in``/``<name>-out`` on ``channels`` as an RT channel pair."""
    channels.register_input(f"{name}-in", RT)
    channels.register_output(f"{name}-out", handler, definition=RT)


async def wait(aw: Awaitable[Any], timeout: float = SAFETY_TIMEOUT) -> Any:
    """Await ``aw`` with a safety-net timeout."""
    return await asyncio.wait_for(aw, timeout)


async def outcome(ticket: Ticket, timeout: float = SAFETY_TIMEOUT) -> Outcome:
    """Await a ticket's outcome (shielded, bounded)."""
    result: Outcome = await asyncio.wait_for(asyncio.shield(ticket.outcome), timeout)
    return result


async def yield_many(n: int = 20) -> None:
    """Let the loop run ``n`` scheduling steps (scheduling, not synchronisation)."""
    for _ in range(n):
        await asyncio.sleep(0)


class Notifier:
    """Wake waiters whenever something was recorded; waiters re-check a predicate."""

    def __init__(self) -> None:
        """Start with nobody waiting."""
        self._changed = asyncio.Event()

    def notify(self) -> None:
        """Wake every waiter so it re-checks its predicate."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(
        self, predicate: Callable[[], bool], timeout: float = SAFETY_TIMEOUT
    ) -> None:
        """Wait until ``predicate()`` holds (bounded by ``timeout``)."""

        async def _loop() -> None:
            while not predicate():
                await self._changed.wait()

        await asyncio.wait_for(_loop(), timeout)


# --------------------------------------------------------------------------- script steps


@dataclass(frozen=True)
class Text:
    """Yield one text delta."""

    content: str


@dataclass(frozen=True)
class Tools:
    """Yield one delta carrying complete tool calls."""

    calls: tuple[ToolCall, ...]
    content: str = ""

    @classmethod
    def of(cls, *calls: ToolCall, content: str = "") -> Tools:
        """Build the step from tool calls."""
        return cls(tuple(calls), content)


@dataclass(frozen=True)
class WaitFor:
    """Block the stream until the event is set."""

    event: asyncio.Event


@dataclass(frozen=True)
class Mark:
    """Set the event when the stream reaches this point."""

    event: asyncio.Event


@dataclass(frozen=True)
class Pause:
    """Yield to the event loop ``count`` times (scheduling, not synchronisation)."""

    count: int = 1


@dataclass(frozen=True)
class Raise:
    """Raise ``error`` from the stream (a broken upstream)."""

    error: BaseException


Step = Text | Tools | WaitFor | Mark | Pause | Raise
Script = Sequence[Step]


def call(id_: str, name: str, error: str | None = None, **arguments: Any) -> ToolCall:
    """Build a complete tool call."""
    return ToolCall(id=id_, name=name, arguments=dict(arguments), error=error)


# --------------------------------------------------------------------------- activity


class ActivityTracker:
    """Counts concurrently open streams and running tools per child key.

    A violation is recorded when a stream opens while another stream of the same child
    is open or while a tool of that child is still running (two rounds at once).
    """

    def __init__(self) -> None:
        """Start with nothing open."""
        self.streams: Counter[str] = Counter()
        self.tools: Counter[str] = Counter()
        self.max_streams: Counter[str] = Counter()
        self.violations: list[str] = []

    def stream_enter(self, key: str) -> None:
        """Record that a stream of ``key`` opened."""
        if self.streams[key] > 0:
            self.violations.append(f"{key}: second stream opened while one is open")
        if self.tools[key] > 0:
            self.violations.append(f"{key}: stream opened while a tool runs")
        self.streams[key] += 1
        self.max_streams[key] = max(self.max_streams[key], self.streams[key])

    def stream_exit(self, key: str) -> None:
        """Record that a stream of ``key`` ended."""
        self.streams[key] -= 1

    def tool_enter(self, key: str) -> None:
        """Record that a tool of ``key`` started."""
        self.tools[key] += 1

    def tool_exit(self, key: str) -> None:
        """Record that a tool of ``key`` finished."""
        self.tools[key] -= 1


# --------------------------------------------------------------------------- provider


@dataclass
class StreamCall:
    """One recorded ``ChatProvider.stream`` call."""

    index: int
    messages: list[Message]
    tools: list[ToolSpec]
    key: str
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    close_reason: str | None = None  # "aclose" | "cancelled"
    exhausted: bool = False
    raised: bool = False
    yielded: list[Delta] = field(default_factory=list)

    @property
    def user_text(self) -> str:
        """Content of the last user message of the request."""
        for message in reversed(self.messages):
            if message.role == "user":
                return message.content
        return ""

    @property
    def system(self) -> str:
        """Content of the first (system) message."""
        return self.messages[0].content if self.messages else ""

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered to this call."""
        return [t.name for t in self.tools]

    @property
    def roles(self) -> list[str]:
        """Roles of the request's messages."""
        return [m.role for m in self.messages]


ScriptSource = Callable[[StreamCall], Script]


class ScriptedProvider:
    """A ChatProvider that plays scripts.

    Script selection per call: ``route(call)`` when given and it returns a script,
    else the next script queued for the request's last user text (``on``), else the
    next queued script (``add``), else ``default`` (a script or a factory).
    Without any of these the stream raises ``AssertionError("no script")``.
    """

    def __init__(
        self,
        *scripts: Script,
        default: Script | ScriptSource | None = None,
        route: Callable[[StreamCall], Script | None] | None = None,
        key: Callable[[list[Message]], str] | None = None,
        tracker: ActivityTracker | None = None,
    ) -> None:
        """Queue ``scripts``; see the class docstring for selection."""
        self._queue: deque[Script] = deque(scripts)
        self._by_user: dict[str, deque[Script]] = {}
        self._default = default
        self._route = route
        self._key = key or (lambda msgs: msgs[0].content if msgs else "")
        self.tracker = tracker
        self.calls: list[StreamCall] = []
        self.notifier = Notifier()
        self.fail_on_call: BaseException | None = None

    def add(self, *scripts: Script) -> None:
        """Queue scripts for the next calls, in order."""
        self._queue.extend(scripts)

    def on(self, user_text: str, *scripts: Script) -> None:
        """Queue scripts for requests whose last user message is ``user_text``."""
        self._by_user.setdefault(user_text, deque()).extend(scripts)

    def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Record the call and return its scripted stream."""
        if self.fail_on_call is not None:
            raise self.fail_on_call
        record = StreamCall(
            index=len(self.calls),
            messages=copy.deepcopy(list(messages)),
            tools=copy.deepcopy(list(tools or [])),
            key=self._key(list(messages)),
        )
        self.calls.append(record)
        self.notifier.notify()
        return self._play(record, self._pick(record))

    def _pick(self, record: StreamCall) -> Script:
        if self._route is not None:
            routed = self._route(record)
            if routed is not None:
                return routed
        queued = self._by_user.get(record.user_text)
        if queued:
            return queued.popleft()
        if self._queue:
            return self._queue.popleft()
        if self._default is None:
            return [Raise(AssertionError("ScriptedProvider: no script left"))]
        if callable(self._default):
            return self._default(record)
        return self._default

    async def _play(self, record: StreamCall, script: Script) -> AsyncIterator[Delta]:
        record.started.set()
        if self.tracker is not None:
            self.tracker.stream_enter(record.key)
        self.notifier.notify()
        try:
            for step in script:
                if isinstance(step, Text):
                    delta = Delta(content=step.content)
                    record.yielded.append(delta)
                    yield delta
                elif isinstance(step, Tools):
                    delta = Delta(content=step.content, tool_calls=list(step.calls))
                    record.yielded.append(delta)
                    yield delta
                elif isinstance(step, WaitFor):
                    await step.event.wait()
                elif isinstance(step, Mark):
                    step.event.set()
                elif isinstance(step, Pause):
                    for _ in range(step.count):
                        await asyncio.sleep(0)
                else:
                    record.raised = True
                    raise step.error
            record.exhausted = True
        except GeneratorExit:
            record.close_reason = "aclose"
            raise
        except asyncio.CancelledError:
            record.close_reason = "cancelled"
            raise
        finally:
            if not record.exhausted and not record.raised:
                record.closed.set()
            record.ended.set()
            if self.tracker is not None:
                self.tracker.stream_exit(record.key)
            self.notifier.notify()

    async def wait_calls(self, n: int, timeout: float = SAFETY_TIMEOUT) -> StreamCall:
        """Wait until at least ``n`` streams have started; return the ``n``-th."""
        await self.notifier.wait_until(
            lambda: len(self.calls) >= n and self.calls[n - 1].started.is_set(), timeout
        )
        return self.calls[n - 1]


# --------------------------------------------------------------------------- tools


@dataclass
class ToolBehaviour:
    """What a fake tool does when called."""

    result: str | Callable[[ToolCall], str] = "ok"
    gate: asyncio.Event | None = None
    error: BaseException | None = None
    description: str = "a fake tool"
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


@dataclass
class ToolRecord:
    """One recorded ``ToolRunner.call``."""

    call: ToolCall
    started: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: bool = False
    result: str | None = None
    error: BaseException | None = None


class ScriptedToolRunner:
    """A ToolRunner whose tools can block on events, raise, and record calls."""

    def __init__(
        self,
        tools: dict[str, ToolBehaviour] | None = None,
        *,
        tracker: ActivityTracker | None = None,
        key: Callable[[ToolCall], str] | None = None,
    ) -> None:
        """Offer ``tools`` (name -> behaviour)."""
        self.tools: dict[str, ToolBehaviour] = dict(tools or {})
        self.specs_error: BaseException | None = None
        self.tracker = tracker
        self._key = key or (lambda c: "")
        self.records: list[ToolRecord] = []
        self.notifier = Notifier()
        self.on_start: Callable[[ToolRecord], None] | None = None

    @property
    def calls(self) -> list[ToolCall]:
        """Every tool call received, in order."""
        return [r.call for r in self.records]

    def specs(self) -> list[ToolSpec]:
        """Offer the scripted tools (or raise ``specs_error``)."""
        if self.specs_error is not None:
            raise self.specs_error
        return [
            ToolSpec(name=name, description=b.description, parameters=b.parameters)
            for name, b in self.tools.items()
        ]

    async def call(self, call: ToolCall) -> str:
        """Run one call as scripted and record it."""
        record = ToolRecord(call=copy.deepcopy(call))
        self.records.append(record)
        record.started.set()
        key = self._key(call)
        if self.tracker is not None:
            self.tracker.tool_enter(key)
        if self.on_start is not None:
            self.on_start(record)
        self.notifier.notify()
        try:
            result = await self._run(call)
        except asyncio.CancelledError:
            record.cancelled = True
            raise
        except Exception as err:
            record.error = err
            raise
        else:
            record.result = result
            return result
        finally:
            record.finished.set()
            if self.tracker is not None:
                self.tracker.tool_exit(key)
            self.notifier.notify()

    async def _run(self, call: ToolCall) -> str:
        behaviour = self.tools.get(call.name)
        if behaviour is None:
            raise KeyError(f"unknown tool {call.name}")
        if behaviour.gate is not None:
            await behaviour.gate.wait()
        if behaviour.error is not None:
            raise behaviour.error
        if callable(behaviour.result):
            return behaviour.result(call)
        return behaviour.result

    async def wait_calls(self, n: int, timeout: float = SAFETY_TIMEOUT) -> ToolRecord:
        """Wait until at least ``n`` tool calls have started; return the ``n``-th."""
        await self.notifier.wait_until(lambda: len(self.records) >= n, timeout)
        return self.records[n - 1]


# --------------------------------------------------------------------------- output


class OutputRecorder:
    """Records the deltas an output channel receives.

    ``gate`` (optional) makes the async handler block until the gate is set, e.g. to
    hold the kernel inside the output handler.
    """

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        """Record deltas; block the async handler on ``gate`` when given."""
        self.deltas: list[str] = []
        self.gate = gate
        self.notifier = Notifier()
        self.in_handler = asyncio.Event()

    @property
    def text(self) -> str:
        """Every delta received, joined."""
        return "".join(self.deltas)

    def sync_handler(self, delta: str) -> None:
        """Record a delta (plain callable handler)."""
        self.deltas.append(delta)
        self.notifier.notify()

    async def async_handler(self, delta: str) -> None:
        """Record a delta (awaitable handler)."""
        self.deltas.append(delta)
        self.notifier.notify()
        if self.gate is not None:
            self.in_handler.set()
            await self.gate.wait()

    async def wait_text(self, text: str, timeout: float = SAFETY_TIMEOUT) -> None:
        """Wait until ``text`` was received."""
        await self.notifier.wait_until(lambda: text in self.text, timeout)


# --------------------------------------------------------------------------- rig


class Rig:
    """A kernel wired to the doubles; use as ``async with Rig(...) as rig``."""

    def __init__(
        self,
        provider: ScriptedProvider | None = None,
        tools: ScriptedToolRunner | None = None,
        *,
        prompts: PromptRegistry | None = None,
        parent_id: str = "parent",
        ask_parent: bool = False,
        ask_parent_hook: Callable[[str, str], None] | None = None,
        async_output: bool = False,
        on_text_pause: Callable[[str, int], None] | None = None,
    ) -> None:
        """Build a kernel around the doubles."""
        self.provider = provider if provider is not None else ScriptedProvider()
        self.tools = tools
        self.prompts = prompts
        self.channels = ChannelRegistry()
        self.outputs: dict[str, OutputRecorder] = {}
        self.closed: list[tuple[str, int, int]] = []
        self.closed_notifier = Notifier()
        self.tool_results: list[tuple[str, str, str]] = []  # child, call id, result
        self.asked: list[tuple[str, str]] = []
        self.asked_notifier = Notifier()
        self._ask_hook = ask_parent_hook
        self._async_output = async_output
        self._gates: list[asyncio.Event] = []
        self.kernel = Kernel(
            self.provider,
            self.channels,
            tools=tools,
            prompts=prompts,
            parent_id=parent_id,
            on_closed=self._on_closed,
            on_ask_parent=self._on_ask_parent if ask_parent else None,
            on_tool_result=self._on_tool_result,
            on_text_pause=on_text_pause,
        )

    def _on_closed(self, child_id: str, messages: int, chars: int) -> None:
        self.closed.append((child_id, messages, chars))
        self.closed_notifier.notify()

    def _on_tool_result(self, child_id: str, tool_call: ToolCall, result: str) -> None:
        self.tool_results.append((child_id, tool_call.id, result))

    def _on_ask_parent(self, child_id: str, text: str) -> None:
        self.asked.append((child_id, text))
        self.asked_notifier.notify()
        if self._ask_hook is not None:
            self._ask_hook(child_id, text)

    def gate(self) -> asyncio.Event:
        """Return an event that is released at teardown at the latest."""
        event = asyncio.Event()
        self._gates.append(event)
        return event

    def pair(self, name: str, recorder: OutputRecorder | None = None) -> OutputRecorder:
        """Register ``<name>-in``/``<name>-out`` as an RT channel pair."""
        rec = recorder if recorder is not None else OutputRecorder()
        self.outputs[name] = rec
        handler = rec.async_handler if self._async_output else rec.sync_handler
        rt_pair(self.channels, name, handler)
        return rec

    async def spawn(self, child_id: str, **options: Any) -> OutputRecorder:
        """Register a pair named after the child (unless present) and spawn it."""
        if child_id not in self.outputs:
            self.pair(child_id)
        await self.kernel.spawn(
            ChildOptions(
                id=child_id, input=f"{child_id}-in", output=f"{child_id}-out", **options
            )
        )
        return self.outputs[child_id]

    async def __aenter__(self) -> Self:
        """Enter the rig."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release every gate and stop every child."""
        for event in self._gates:
            event.set()
        await asyncio.wait_for(self.kernel.stop_all(), SAFETY_TIMEOUT)


def history_roles(messages: list[Message]) -> list[str]:
    """Roles of ``messages``."""
    return [m.role for m in messages]


def unexpected_empty_assistant(messages: list[Message]) -> list[Message]:
    """Assistant messages with neither text nor tool calls (never allowed)."""
    return [
        m
        for m in messages
        if m.role == "assistant" and not m.content and not m.tool_calls
    ]
