"""The realtime kernel: children that answer the newest input, one round at a time.

Each child has one long-lived loop task that sleeps on its slot's wake-up event,
takes the newest input and runs one *round* in a task of its own. ``push`` overwrites
the slot and cancels the running round at once, unless a tool is running (a critical
section): then the cancel is suppressed and counted, and the round ends at its next
check before a model call. Nothing polls and nothing runs while nobody talks.

Stopping or closing a child is one teardown task per child that every caller awaits
through ``asyncio.shield``: a cancelled caller stops waiting, the teardown still
completes exactly once. A stop lets a started tool call finish (bounded by
``stop_tool_timeout``) and answers the calls of its group not yet started with
"not run".

The history holds what the user heard (DESIGN 4.4): with ``delivery="emitted"``
every delta handed to the output handler counts; with ``"acknowledged"`` only what
the output side reports through ``Kernel.acknowledge``. Requests show the model an
interrupted answer with a marker where it was cut.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import Context, ContextVar
import inspect
import json
import logging
import time
from typing import Any, Literal

from .bounds import (
    bounded_call,
    effective_answer_chars,
    effective_tool_calls,
    effective_tool_turns,
)
from .channels import ChannelRegistry, OutputHandler
from .child import Child, ChildOptions, ChildState, ChildStats, Round, stopped_outcome
from .context import drop_unpaired_tool_calls, message_tokens, trim_to_window
from .errors import AgentNotRealtimeError, KernelError
from .prompts import PromptRegistry
from .transcript import (
    DEFAULT_PAGE_LIMIT,
    TranscriptPage,
    copy_message,
    format_page,
    format_transcript,
    page_of,
)
from .types import ChatProvider, Message, Outcome, ToolCall, ToolRunner, ToolSpec

_LOGGER = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = (
    "You are in a live voice conversation. Answer briefly, in plain spoken sentences.\n"
    "- Before you call a tool that may take a while, tell the user in a few words what"
    " you are doing: while a tool runs the user cannot interrupt you.\n"
    "- Being interrupted is normal, not a failure: answer the newest words.\n"
    "- Do not repeat what the user just said; give the result.\n"
    "- Really call the tools to act; only report an action once you have its result."
)

ASK_PARENT_TOOL = "ask_parent"
ASK_PARENT_SPEC = ToolSpec(
    name=ASK_PARENT_TOOL,
    description=(
        "Send a question or note to the supervising assistant. Delivery is"
        " asynchronous: its answer, if any, arrives later as a new user input."
    ),
    parameters={
        "type": "object",
        "properties": {"text": {"type": "string", "description": "What to ask."}},
        "required": ["text"],
    },
)

_CURRENT_CHILD: ContextVar[str | None] = ContextVar("rtvoice_child", default=None)


_CURRENT_SEQ: ContextVar[int | None] = ContextVar("rtvoice_round_seq", default=None)


def current_child_id() -> str | None:
    """Id of the child whose round is running in this task (for tool runners)."""
    return _CURRENT_CHILD.get()


def current_round_seq() -> int | None:
    """Seq of the round running in this task: read it in an output handler.

    Every delta a handler receives belongs to this round; ``on_round_end`` reports
    the same seq once its last delta has been handed out.
    """
    return _CURRENT_SEQ.get()


STOP_TOOL_TIMEOUT = 10.0
NOT_RUN_STOPPED = json.dumps({"error": "not run: conversation stopped"})
NOT_RUN_INTERRUPTED = json.dumps(
    {"error": "not run: the user interrupted; answer their newest words"}
)
ARCHIVE_LIMIT = 64


class Ticket:
    """Returned by ``push``: ``outcome`` resolves when the round for ``seq`` ends."""

    __slots__ = ("outcome", "seq")

    def __init__(self, seq: int, outcome: asyncio.Future[Outcome]) -> None:
        """Bind a sequence number to its outcome future."""
        self.seq = seq
        self.outcome = outcome

    def __repr__(self) -> str:
        """Show the seq and whether the outcome is known."""
        return f"Ticket(seq={self.seq}, done={self.outcome.done()})"


def _cut_answer(content: str, room: int) -> str:
    """Return what fits of a delta in ``room`` characters, ending at a word."""
    if room <= 0:
        return ""
    piece = content[:room]
    space = piece.rfind(" ")
    return piece[:space] if space > 0 else piece


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _run_to_end(cleanup: Awaitable[Any]) -> None:
    """Await ``cleanup`` to its end, even through further cancels of the caller.

    A stream's ``aclose`` releases its HTTP response: a second barge-in arriving
    while it runs must not skip that. The cleanup starts eagerly (a finished stream
    closes without a scheduling step); if it has to wait, it runs in a task of its
    own, and a cancel of the caller is re-raised only once it has ended.
    """
    loop = asyncio.get_running_loop()
    task: asyncio.Task[Any] = asyncio.Task(_await(cleanup), loop=loop, eager_start=True)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    task.result()


class Kernel:
    """Runs realtime children for one parent."""

    def __init__(
        self,
        provider: ChatProvider,
        channels: ChannelRegistry,
        *,
        tools: ToolRunner | None = None,
        prompts: PromptRegistry | None = None,
        parent_id: str = "parent",
        on_closed: Callable[[str, int, int], None] | None = None,
        on_ask_parent: Callable[[str, str], None] | None = None,
        on_state: Callable[[str, str], None] | None = None,
        on_tool_result: Callable[[str, ToolCall, str], None] | None = None,
        on_round_end: Callable[[str, int], None] | None = None,
        on_text_pause: Callable[[str, int], None] | None = None,
        stop_tool_timeout: float = STOP_TOOL_TIMEOUT,
        archive_limit: int = ARCHIVE_LIMIT,
    ) -> None:
        """Create a kernel for one parent.

        ``on_closed(child_id, messages, chars)`` follows every hand-off,
        ``on_ask_parent(child_id, text)`` delivers the ask_parent tool,
        ``on_state(child_id, state)`` reports state changes and
        ``on_tool_result(child_id, call, result)`` follows every tool result
        (also calls answered without running, e.g. "not run" after a stop) and
        ``on_round_end(child_id, seq)`` says that input ``seq`` will emit no more
        text: once per pushed input, after its round's last delta, whatever the
        ending (completed, cut, failed, superseded, stopped), without waiting for
        the output side's acknowledgement.
        ``on_text_pause(child_id, seq)`` says that the text of input ``seq``'s
        round stops here until its tool calls return (the model's call ended with
        tool calls) or until a speculative input is confirmed: an output that
        holds back a last, unfinished-looking sentence should speak it now, since
        the user hears nothing while the tools run.
        Callbacks run in the event loop and must not block; their errors are
        logged, never raised into a round.
        """
        self.provider = provider
        self.channels = channels
        self.tools = tools
        self.prompts = prompts
        self.parent_id = parent_id
        self._on_closed = on_closed
        self._on_ask_parent = on_ask_parent
        self._on_state = on_state
        self._on_tool_result = on_tool_result
        self._on_round_end = on_round_end
        self._on_text_pause = on_text_pause
        self._stop_tool_timeout = stop_tool_timeout
        self._archive_limit = archive_limit
        self._children: dict[str, Child] = {}
        self._archive: OrderedDict[str, list[Message]] = OrderedDict()
        self._teardowns: set[asyncio.Task[int]] = set()

    # ── lifecycle ──────────────────────────────────────────────────────────

    async def spawn(self, options: ChildOptions) -> str:
        """Create a realtime child bound to an RT input/output pair and start it."""
        if options.id == self.parent_id:
            raise AgentNotRealtimeError(
                f"{options.id!r} is the parent; the parent holds no realtime ability"
            )
        if not options.id:
            raise KernelError("a realtime child needs an id")
        if options.id in self._children:
            raise KernelError(f"realtime child {options.id!r} already exists")
        for name in (options.input, options.output):
            channel = self.channels.lookup(name) if name else None
            if channel is not None and channel.owner == self.parent_id:
                raise KernelError(
                    f"channel {name!r} is owned by the parent {self.parent_id!r},"
                    " which holds no realtime ability"
                )
        try:
            self.channels.bind_realtime_pair(
                options.input, options.output, options.id, owner_is_realtime=True
            )
        except KernelError as err:
            available = ", ".join(self.channels.realtime_names()) or "none"
            raise type(err)(f"{err}. RT channels: {available}") from err
        child = Child(options, asyncio.get_running_loop())
        child.on_round_end = self._on_round_end
        # A fresh context: the child must not inherit the context variables of
        # whoever spawned it (e.g. a caller's chat log or trace), since its rounds
        # outlive that caller and serve later callers.
        child.loop_task = asyncio.create_task(
            self._child_loop(child),
            name=f"rtvoice child {options.id}",
            context=Context(),
        )
        self._children[options.id] = child
        _LOGGER.debug(
            "Realtime child %s started (input=%s, output=%s)",
            options.id,
            options.input,
            options.output,
        )
        return options.id

    def push(self, child_id: str, text: str, *, speculative: bool = False) -> Ticket:
        """Make ``text`` the newest input of a child; never blocks.

        The running round is cancelled at once unless a tool is running; then the
        cancel is suppressed (counted) and the round ends at its next check.

        ``speculative=True``: the words may not be the whole turn yet. The round
        runs (its deltas reach the output handler) but commits nothing and calls
        no tool until ``confirm(seq)``: at its first tool call, or when its model
        call ends, it waits (and ``on_text_pause`` says so). Replaced before that
        (a newer push, ``withdraw``), it is *preempted*: settled ``superseded``,
        nothing in the history, never carried over, its requests and tokens
        counted (``ChildStats.preempted_*``). Cut by ``interrupt`` or a stop, its
        words stand: an ordinary interrupted round (its input committed once its
        model call started), with no tool run. The output side may hold
        its text until the confirmation, or play it at once: once it acknowledges
        any of it as delivered (``acknowledge``, ``delivery="acknowledged"``), the
        user has heard an answer to the input, which then stands: it is committed
        and a cut is an ordinary interruption (what was heard is committed). Its
        tool calls still wait for ``confirm``.
        """
        child = self._live(child_id)
        if not text or not text.strip():
            raise KernelError("input text is empty")
        seq, voided = child.slot.push(text, speculative=speculative)
        child.speculative_inputs += speculative
        future: asyncio.Future[Outcome] = child.loop.create_future()
        child.tickets[seq] = future
        if voided is not None:
            voided_future = child.tickets.pop(voided.seq, None)
            if voided.speculative:
                child.preempt_pending(voided, voided_future)
            else:
                child.supersede(voided, voided_future, carried_into=seq)
        self._cut_round(child)
        return Ticket(seq, future)

    def confirm(self, child_id: str, seq: int) -> bool:
        """Confirm the speculative input ``seq``: its round goes on as an ordinary one.

        Its input is committed now (if its model call has started), a tool call or
        the end it waits at goes ahead. True when ``seq`` is (now) confirmed; False
        when it is unknown, preempted or already ended (e.g. failed): the caller
        pushes the words again.
        """
        child = self._live(child_id)
        if child.slot.confirm(seq):
            return True
        rnd = child.round
        if rnd is None or rnd.seq != seq or rnd.finished:
            return False
        if rnd.speculative:
            rnd.speculative = False
            if rnd.model_called:
                child.commit_input(rnd)
        if rnd.confirmed is not None:  # also a heard one (committed already)
            rnd.confirmed.set()
        return True

    def interrupt(self, child_id: str) -> bool:
        """Cancel the running round without new input (tools still complete)."""
        child = self._live(child_id)
        rnd = child.round
        if rnd is None or rnd.task is None or rnd.task.done():
            return False
        rnd.interrupt_requested = True
        self._cut_round(child)
        return True

    def withdraw(self, child_id: str, seq: int) -> bool:
        """Take back the input ``seq`` (its caller went away); False if too late.

        Still waiting in the slot: it is removed and settles ``superseded`` (it never
        reached the model; nothing is committed). Being answered: the round is cut as
        by ``interrupt`` (critical sections still protected); a speculative one not
        heard yet is preempted (see ``push``). Already answered or unknown: nothing
        happens.
        """
        child = self._live(child_id)
        voided = child.slot.withdraw(seq)
        if voided is not None:
            future = child.tickets.pop(seq, None)
            if voided.speculative:
                child.preempt_pending(voided, future)
            else:
                child.supersede(voided, future, carried_into=None)
            _LOGGER.debug("Child %s: input %s withdrawn from the slot", child_id, seq)
            return True
        rnd = child.round
        if rnd is not None and rnd.seq == seq and not rnd.finished:
            rnd.withdrawn = not rnd.model_called  # not yet at the model: superseded
            rnd.taken_back = True
            cut = self.interrupt(child_id)
            _LOGGER.debug(
                "Child %s: input %s withdrawn from its round (model called: %s,"
                " cut: %s)",
                child_id,
                seq,
                rnd.model_called,
                cut,
            )
            return cut
        _LOGGER.debug(
            "Child %s: input %s not withdrawn (round %s)",
            child_id,
            seq,
            "none" if rnd is None else f"{rnd.seq}, finished: {rnd.finished}",
        )
        return False

    def acknowledge(
        self, child_id: str, seq: int, chars: int, *, final: bool = False
    ) -> None:
        """Report that the first ``chars`` characters of round ``seq`` reached the user.

        Counts the round's emitted text: every delta of the round concatenated,
        across its model calls. Only for children spawned with
        ``delivery="acknowledged"`` (otherwise every emitted delta counts and this
        does nothing). Cumulative and monotonic (a smaller count changes nothing),
        idempotent; an unknown child or seq is ignored, so an output side may
        report after the round or the child ended. ``final=True``: nothing more of
        this round will be delivered (playback was cut); later reports are ignored.

        A cut round commits only the delivered part of its cut model call; a report
        arriving after the commit still corrects it. A completed round commits its
        whole answer; a final report of less than that (playback cut, before or
        after the model finished) truncates the answer to what was heard and
        marks it interrupted. Text before tool calls is committed as far as it
        was heard when its tool group is committed, and not corrected later.
        Either correction applies only while the round is the child's most
        recent one and nothing was committed after it: a later round has already
        built on it otherwise.
        """
        child = self._children.get(child_id)
        if child is not None:
            child.acknowledge(seq, chars, final=final)

    def record_reply(self, child_id: str, seq: int, text: str) -> None:
        """Record what the adapter told the user after round ``seq`` failed.

        A failed round commits the user input, its completed tool groups and only
        the delivered part of its partial answer, never the unheard rest; what
        the user was told instead (e.g. a spoken apology) is committed here as an
        assistant message with ``failed=True``. Once per failed round, and only
        while it is the child's most recent round with nothing committed after
        it; anything else (unknown child or seq, a round that did not fail, empty
        text) is ignored.
        """
        child = self._children.get(child_id)
        if child is not None:
            child.record_reply(seq, text)

    def record_said(self, child_id: str, text: str) -> bool:
        """Record what the assistant said outside any round; True when recorded.

        For words the adapter spoke itself, e.g. the announcement that opened a
        conversation (``start_conversation``): the model must know what it asked.
        Committed as an assistant message only while the child is idle (no round
        running, no input waiting), so the history keeps its protocol order;
        otherwise (or for an unknown or stopped child, or empty text) nothing is
        recorded and False is returned.
        """
        child = self._children.get(child_id)
        if (
            child is None
            or child.stopped
            or not text.strip()
            or child.round is not None
            or child.slot.pending
        ):
            return False
        child.commit(Message("assistant", text))
        return True

    def _cut_round(self, child: Child) -> None:
        rnd = child.round
        if rnd is None or rnd.task is None or rnd.task.done():
            return
        if child.critical > 0:
            child.suppressed_cancels += 1
            _LOGGER.debug(
                "Child %s: cut of round %s waits for its critical section",
                child.options.id,
                rnd.seq,
            )
        else:
            rnd.task.cancel()

    async def stop(self, child_id: str) -> None:
        """Stop a child; a running tool gets a bounded time to finish first.

        The teardown runs in a task of its own, shielded from the caller: a caller
        cancelled while it waits stops waiting, the teardown still completes.
        """
        await asyncio.shield(self._teardown(self._known(child_id), close=False))

    async def close(self, child_id: str) -> int:
        """Stop a child and hand its transcript off; returns its message count.

        Every stop and close of one child awaits the same shielded teardown: a close
        that arrives while a stop's teardown runs makes it hand off at its end, two
        closes return the same count and ``on_closed`` fires once.
        """
        return await asyncio.shield(self._teardown(self._known(child_id), close=True))

    async def stop_all(self) -> int:
        """Stop every child; returns how many were stopped."""
        return await self._teardown_all(close=False)

    async def close_all(self) -> int:
        """Close every child with hand-off; returns how many were closed."""
        return await self._teardown_all(close=True)

    async def _teardown_all(self, *, close: bool) -> int:
        teardowns = [self._teardown(c, close=close) for c in self._children.values()]
        await asyncio.gather(*(asyncio.shield(t) for t in teardowns))
        return len(teardowns)

    def _known(self, child_id: str) -> Child:
        child = self._children.get(child_id)
        if child is None:
            raise KernelError(self._unknown_message(child_id))
        return child

    def _teardown(self, child: Child, *, close: bool) -> asyncio.Task[int]:
        """Return the one teardown task of a child, starting it on first use."""
        if close:
            child.close_requested = True  # read at the teardown's end: upgrades a stop
        if child.teardown is None:
            # Stopped from this very moment: no new input, no new tool call, and the
            # input waiting in the slot never runs.
            child.stopped = True
            pending = child.slot.take()
            if pending is not None:
                child.settle(
                    pending.seq, child.tickets.pop(pending.seq, None), stopped_outcome()
                )
            task = child.loop.create_task(
                self._run_teardown(child),
                name=f"rtvoice teardown {child.options.id}",
                context=Context(),
            )
            # Strong references until it ends: no caller may be left to hold it.
            self._teardowns.add(task)
            task.add_done_callback(self._teardowns.discard)
            child.teardown = task
        return child.teardown

    async def _run_teardown(self, child: Child) -> int:
        try:
            await self._stop_child(child)
        except Exception:
            # Never expected; a teardown nobody awaits any more must still log it.
            _LOGGER.exception("Stopping realtime child %s failed", child.options.id)
            self._children.pop(child.options.id, None)
        # No await between leaving the children and this check: every close that
        # found the child live has set close_requested by now.
        return self._hand_off(child) if child.close_requested else 0

    async def _stop_child(self, child: Child) -> None:
        rnd = child.round
        task = rnd.task if rnd is not None else None
        if rnd is not None and task is not None:
            if child.critical > 0:
                # A started tool call is never cut: the round answers the calls of
                # its group not yet started with "not run" and ends at its next
                # check. Only the deadline cancels a call that is still running.
                done, _ = await asyncio.wait((task,), timeout=self._stop_tool_timeout)
                if not done:
                    _LOGGER.warning(
                        "Child %s: tool still running %.0f s after the stop,"
                        " cancelling it",
                        child.options.id,
                        self._stop_tool_timeout,
                    )
            task.cancel()
            await asyncio.wait((task,))
            self._settle_unstarted(child, rnd)
        if child.loop_task is not None:
            child.loop_task.cancel()
            await asyncio.wait((child.loop_task,))
            child.loop_task = None  # break the child <-> loop task cycle
        for seq, future in list(child.tickets.items()):
            child.settle(seq, future, stopped_outcome())
        child.tickets.clear()
        self._children.pop(child.options.id, None)
        self.channels.report_dangling(child.options.id)
        self._set_state(child, ChildState.IDLE)
        _LOGGER.debug("Realtime child %s stopped", child.options.id)

    def _hand_off(self, child: Child) -> int:
        count = len(child.history)
        if not count:
            return 0
        child_id = child.options.id
        self._archive[child_id] = child.history
        self._archive.move_to_end(child_id)
        while len(self._archive) > self._archive_limit:
            self._archive.popitem(last=False)
        if self._on_closed is not None:
            chars = len(format_transcript(child.history))
            try:
                self._on_closed(child_id, count, chars)
            except Exception:
                _LOGGER.exception("on_closed callback failed for %s", child_id)
        return count

    # ── queries ────────────────────────────────────────────────────────────

    def children(self) -> list[str]:
        """Ids of the live children, sorted."""
        return sorted(self._children)

    def stats(self, child_id: str) -> ChildStats | None:
        """Counters of a live child, or None."""
        child = self._children.get(child_id)
        if child is None:
            return None
        return ChildStats(
            id=child_id,
            rounds=child.rounds,
            last_seq=child.slot.seq,
            dropped=child.slot.dropped,
            pending=child.slot.pending,
            suppressed_cancels=child.suppressed_cancels,
            interrupted_rounds=child.interrupted_rounds,
            superseded_rounds=child.superseded_rounds,
            tool_calls=child.tool_calls,
            completed_rounds=child.completed_rounds,
            failed_rounds=child.failed_rounds,
            state=child.state,
            first_delta_ms=child.first_delta_ms,
            messages=len(child.history),
            speculative_inputs=child.speculative_inputs,
            preempted_rounds=child.preempted_rounds,
            preempted_requests=child.preempted_requests,
            preempted_tokens=child.preempted_tokens,
        )

    def transcript(self, child_id: str) -> list[Message] | None:
        """Return the full history of a live or archived child (a copy), or None."""
        child = self._children.get(child_id)
        history = child.history if child is not None else self._archive.get(child_id)
        if history is None:
            return None
        return [copy_message(m) for m in history]

    def archived(self) -> list[str]:
        """Ids of closed children whose transcript is kept."""
        return list(self._archive)

    def transcript_page_data(
        self, child_id: str, offset: int = 0, limit: int = DEFAULT_PAGE_LIMIT
    ) -> TranscriptPage:
        """Return a page of a live or archived transcript (copies of its messages).

        KernelError for an unknown id or a negative offset; a limit <= 0 means the
        default (40).
        """
        child = self._children.get(child_id)
        history = child.history if child is not None else self._archive.get(child_id)
        if history is None:
            raise KernelError(self._unknown_message(child_id))
        return page_of(child_id, history, offset, limit)

    def transcript_page(
        self,
        child_id: str,
        offset: int = 0,
        limit: int = DEFAULT_PAGE_LIMIT,
        fmt: Literal["text", "raw"] = "text",
    ) -> str:
        """Return a page of a transcript as text lines or raw JSON (DESIGN 4.6)."""
        return format_page(self.transcript_page_data(child_id, offset, limit), fmt)

    def _live(self, child_id: str) -> Child:
        child = self._children.get(child_id)
        if child is None or child.stopped:
            raise KernelError(self._unknown_message(child_id))
        return child

    @staticmethod
    def _unknown_message(child_id: str) -> str:
        # Never list the other ids: they are other people's conversations.
        return f"no realtime child {child_id!r}"

    # ── the loop and rounds ────────────────────────────────────────────────

    async def _child_loop(self, child: Child) -> None:
        slot = child.slot
        while True:
            await slot.wake.wait()
            pending = slot.take()
            if pending is None:
                continue
            rnd = Round(pending, child.tickets.pop(pending.seq, None))
            child.rounds += 1
            child.last_seq = pending.seq
            child.round = rnd
            rnd.task = asyncio.create_task(
                self._run_round(child, rnd),
                name=f"rtvoice round {child.options.id}#{pending.seq}",
            )
            await asyncio.wait((rnd.task,))
            self._settle_unstarted(child, rnd)
            # Break the round <-> task cycle (a cancelled task keeps its traceback,
            # whose frames hold the round): refcounting frees both at once instead of
            # leaving ~40 objects per barge-in to the cyclic garbage collector, whose
            # pauses would otherwise show up as cancel latency.
            rnd.task = None
            child.round = None

    def _settle_unstarted(self, child: Child, rnd: Round) -> None:
        """Settle a round whose task was cancelled before it ever ran."""
        if not rnd.finished:
            child.end_cut(rnd)

    async def _run_round(self, child: Child, rnd: Round) -> None:
        _CURRENT_CHILD.set(child.options.id)  # the round task has its own context
        _CURRENT_SEQ.set(rnd.seq)
        try:
            await self._round_body(child, rnd)
        except asyncio.CancelledError:
            if not rnd.finished:
                child.end_cut(rnd)
            raise
        except Exception as err:  # noqa: BLE001 - any provider failure ends the round
            self._end_failed(child, rnd, err)
        finally:
            self._set_state(child, ChildState.IDLE)

    async def _round_body(self, child: Child, rnd: Round) -> None:
        specs = self._specs()
        turns = 0
        max_turns = effective_tool_turns(child.options.max_tool_turns)
        while True:
            if child.slot.seq > rnd.seq or rnd.interrupt_requested or child.stopped:
                child.end_cut(rnd)
                return
            if not rnd.model_called:
                rnd.model_called = True
                if not rnd.speculative:  # held: committed by confirm()
                    child.commit_input(rnd)
            limit_reached = max_turns <= turns
            text, calls = await self._stream(child, rnd, [] if limit_reached else specs)
            confirmed = rnd.confirmed  # None: an ordinary input
            held = confirmed is not None and not confirmed.is_set()
            if calls or held:  # the text stops here: speak what is held back
                self._text_paused(child, rnd)
            if confirmed is not None:
                await confirmed.wait()  # no tool, no commit until confirmed
            if not calls:
                child.commit_answer(rnd, text)
                child.end_completed(rnd)
                return
            turns += 1
            await self._run_tools(child, rnd, text, calls, limit_reached=limit_reached)
            if limit_reached:  # the model ignored the tool limit: stop here
                child.end_completed(rnd)
                return

    def _text_paused(self, child: Child, rnd: Round) -> None:
        """Tell the output side that the round's text waits for its tool calls."""
        if self._on_text_pause is None:
            return
        try:
            self._on_text_pause(child.options.id, rnd.seq)
        except Exception:
            _LOGGER.exception("on_text_pause callback failed")

    def _specs(self) -> list[ToolSpec]:
        specs = list(self.tools.specs()) if self.tools is not None else []
        if self._on_ask_parent is not None:
            specs = [s for s in specs if s.name != ASK_PARENT_TOOL]
            specs.append(ASK_PARENT_SPEC)
        return specs

    def _system_prompt(self, options: ChildOptions) -> str:
        """Return the system message of a child's next request."""
        base = options.system_prompt.strip() or DEFAULT_SYSTEM_PROMPT
        sections = self.prompts.render(options.prompt_scope) if self.prompts else ""
        return f"{base}\n\n{sections}" if sections else base

    def _request_messages(
        self, child: Child, rnd: Round | None = None
    ) -> list[Message]:
        system = Message("system", self._system_prompt(child.options))
        messages = [system, *child.shown_history()]
        tokens = message_tokens(system) + child.history_tokens
        if rnd is not None:
            if rnd.speculative:  # its input is not in the history until confirmed
                held = Message("user", child.input_text(rnd))
                messages.append(held)
                tokens += message_tokens(held)
            rnd.requests += 1
            rnd.request_tokens += tokens
        window = child.options.context_window
        if tokens > window:
            messages = trim_to_window(messages, window)  # whole groups, a new list
        return drop_unpaired_tool_calls(messages)

    async def _stream(
        self, child: Child, rnd: Round, tools: list[ToolSpec]
    ) -> tuple[str, list[ToolCall]]:
        handler = self.channels.output_handler(child.options.output)
        messages = self._request_messages(child, rnd)
        calls: list[ToolCall] = []
        rnd.turn_text = []
        rnd.call_start = rnd.emitted_len
        max_chars = effective_answer_chars(child.options.max_answer_chars)
        self._set_state(child, ChildState.THINKING)
        stream = self.provider.stream(messages, tools)
        try:
            async for delta in stream:
                content = delta.content
                cut = len(content) > max_chars - rnd.emitted_len
                if cut:  # the answer's length bound: end it here (issue 16 §3)
                    content = _cut_answer(content, max_chars - rnd.emitted_len)
                if content:
                    if rnd.first_delta:
                        rnd.first_delta = False
                        child.first_delta_ms = (
                            time.perf_counter() - rnd.pushed_at
                        ) * 1e3
                        self._set_state(child, ChildState.SPEAKING)
                    rnd.turn_text.append(content)
                    rnd.emitted.append(content)
                    rnd.emitted_len += len(content)
                    if handler is not None:
                        await self._emit(child, handler, content)
                if cut:
                    _LOGGER.debug(
                        "Child %s: answer cut at %d characters",
                        child.options.id,
                        rnd.emitted_len,
                    )
                    return "".join(rnd.turn_text), []
                if delta.tool_calls:
                    calls.extend(
                        bounded_call(c, len(calls) + i)
                        for i, c in enumerate(delta.tool_calls)
                    )
        finally:
            # An async generator that already ended (ag_frame None: exhausted,
            # or its own cleanup ran when the cancel landed inside it) needs none.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None and getattr(stream, "ag_frame", True) is not None:
                await _run_to_end(aclose())
        return "".join(rnd.turn_text), calls

    async def _emit(self, child: Child, handler: OutputHandler, text: str) -> None:
        try:
            result = handler(text)
            if result is not None and inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            _LOGGER.exception(
                "Output channel %s of %s failed", child.options.output, child.options.id
            )

    async def _run_tools(
        self,
        child: Child,
        rnd: Round,
        text: str,
        calls: list[ToolCall],
        *,
        limit_reached: bool,
    ) -> None:
        results: list[Message] = []
        rnd.group = (text, calls, results)
        max_calls = effective_tool_calls(child.options.max_tool_calls)
        for index, call in enumerate(calls):
            if limit_reached:
                result = json.dumps({"error": "tool turn limit reached; not run"})
            elif index >= max_calls:
                result = json.dumps(
                    {"error": f"not run: at most {max_calls} tool calls per answer"}
                )
            elif child.stopped:  # a stop began during the group: start nothing new
                result = NOT_RUN_STOPPED
            elif child.slot.seq > rnd.seq or rnd.interrupt_requested:
                # A barge-in during the group: the started call has completed (its
                # critical section); the calls not yet started are not run.
                result = NOT_RUN_INTERRUPTED
            else:
                result = await self._call_tool(child, call)
            results.append(Message("tool", result, tool_call_id=call.id))
            if self._on_tool_result is not None:
                try:
                    self._on_tool_result(child.options.id, call, result)
                except Exception:
                    _LOGGER.exception("on_tool_result callback failed")
        rnd.group = None
        child.commit_group(rnd, calls, results)

    async def _call_tool(self, child: Child, call: ToolCall) -> str:
        child.tool_calls += 1
        if call.error:
            return json.dumps({"error": call.error})
        if call.name == ASK_PARENT_TOOL and self._on_ask_parent is not None:
            return self._ask_parent(child, call)
        if self.tools is None:
            return json.dumps({"error": f"unknown tool {call.name!r}"})
        child.critical += 1
        self._set_state(child, ChildState.TOOL)
        try:
            result: Any = await self.tools.call(call)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - a tool error is a result the model reads
            _LOGGER.debug("Tool %s failed: %s", call.name, err)
            result = json.dumps(
                {
                    "error": f"{type(err).__name__}: {err}"
                    if str(err)
                    else type(err).__name__
                }
            )
        finally:
            child.critical -= 1
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        self._set_state(child, ChildState.THINKING)
        return text

    def _ask_parent(self, child: Child, call: ToolCall) -> str:
        text = call.arguments.get("text")
        if not isinstance(text, str) or not text.strip():
            return json.dumps({"error": "ask_parent needs a non-empty 'text' string"})
        assert self._on_ask_parent is not None
        callback = self._on_ask_parent
        child_id = child.options.id

        def deliver() -> None:
            try:
                callback(child_id, text)
            except Exception:
                _LOGGER.exception("ask_parent delivery failed for %s", child_id)

        child.loop.call_soon(deliver)
        return json.dumps({"delivered": True})

    def _end_failed(self, child: Child, rnd: Round, err: Exception) -> None:
        error_type = type(err).__name__
        message = str(err) or error_type
        # Debug only: the adapter owns user-facing logging (e.g. once per outage).
        _LOGGER.debug(
            "Round of %s failed: %s: %s", child.options.id, error_type, message
        )
        child.end_failed(rnd, message, error_type)

    def _set_state(self, child: Child, state: ChildState) -> None:
        if child.state is state:
            return
        child.state = state
        if self._on_state is not None:
            try:
                self._on_state(child.options.id, state)
            except Exception:
                _LOGGER.exception("on_state callback failed")
