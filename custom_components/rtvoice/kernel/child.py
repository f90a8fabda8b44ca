"""The state of one realtime child and the rules of what its history keeps.

A :class:`Round` is one input being answered; a :class:`Child` holds the history,
the slot and the counters, and decides what a round commits when it completes, is
cut or fails (DESIGN 4.4): the user input, completed tool groups and the text that
reached the user. With ``delivery="acknowledged"`` only what the output side
reported counts; a later report may still correct the most recent round.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
import enum
import logging
from typing import Literal

from .bounds import (
    DEFAULT_MAX_ANSWER_CHARS,
    DEFAULT_MAX_TOOL_CALLS,
    DEFAULT_MAX_TOOL_TURNS,
)
from .context import (
    estimate_tokens,
    joined,
    joins,
    message_tokens,
    model_view,
    needs_marker,
    render_for_model,
)
from .slot import LatestSlot, PendingInput
from .types import Message, Outcome, OutcomeStatus, ToolCall

_LOGGER = logging.getLogger(__name__)


class ChildState(enum.StrEnum):
    """What a child is doing, for sensors and diagnostics."""

    IDLE = "idle"
    THINKING = "thinking"
    SPEAKING = "speaking"
    TOOL = "tool"


Delivery = Literal["emitted", "acknowledged"]


@dataclass
class ChildOptions:
    """How to spawn a realtime child."""

    id: str
    input: str
    output: str
    system_prompt: str = ""
    # Model calls with tools per input; 0 = the ceiling (bounds.py, issue 16 §3).
    max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS
    context_window: int = 8000
    prompt_scope: str | None = None
    # "emitted": every delta handed to the output handler counts as delivered (a
    # text caller displays it). "acknowledged": only what the output side reports
    # through Kernel.acknowledge counts (DESIGN 4.4).
    delivery: Delivery = "emitted"
    # An input superseded before it reached the model is put in front of the next
    # input that does (joined with a space), so nothing the user said is lost.
    carry_over: bool = False
    # Tool calls run from one model response (the rest are answered "not run"; 0 =
    # the ceiling) and characters of one answer (its end is cut; 0 = the default).
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS
    max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS


@dataclass
class ChildStats:
    """Counters of one child."""

    id: str
    rounds: int
    last_seq: int
    dropped: int
    pending: bool
    suppressed_cancels: int
    interrupted_rounds: int
    superseded_rounds: int
    tool_calls: int
    completed_rounds: int = 0
    failed_rounds: int = 0
    state: str = ChildState.IDLE
    first_delta_ms: float | None = None  # last round: input pushed -> first delta
    messages: int = 0
    # Speculation (Kernel.push(speculative=True)): inputs pushed held, those
    # preempted (replaced by a newer push or withdrawn before anything of them
    # was heard: no history, no tool), and what the preempted ones cost.
    speculative_inputs: int = 0
    preempted_rounds: int = 0
    preempted_requests: int = 0
    preempted_tokens: int = 0


class Round:
    """One round: the input it answers and what it has done so far."""

    __slots__ = (
        "call_start",
        "confirmed",
        "delivered",
        "delivery_final",
        "emitted",
        "emitted_len",
        "finished",
        "first_delta",
        "future",
        "group",
        "history_len",
        "interrupt_requested",
        "model_called",
        "pushed_at",
        "replied",
        "request_tokens",
        "requests",
        "seq",
        "speculative",
        "status",
        "tail_index",
        "tail_start",
        "taken_back",
        "task",
        "text",
        "turn_text",
        "withdrawn",
    )

    def __init__(
        self, pending: PendingInput, future: asyncio.Future[Outcome] | None
    ) -> None:
        """Start a round for ``pending``; ``future`` is its ticket's outcome."""
        self.text = pending.text
        self.seq = pending.seq
        self.pushed_at = pending.pushed_at
        self.future = future
        self.task: asyncio.Task[None] | None = None
        self.model_called = False
        self.interrupt_requested = False
        self.withdrawn = False  # its caller took the input back (see Kernel.withdraw)
        self.taken_back = False  # ... whether or not its model call had started
        self.emitted: list[str] = []  # every delta of the round
        self.emitted_len = 0  # characters emitted in the round, all model calls
        self.turn_text: list[str] = []  # deltas of the current model call
        self.call_start = 0  # where the current model call's text starts (chars)
        self.delivered = 0  # characters the output side acknowledged
        self.delivery_final = False  # nothing more of this round will be delivered
        self.first_delta = True
        self.finished = False  # its outcome has been settled
        # The tool group being executed: (assistant text, calls, finished results).
        self.group: tuple[str, list[ToolCall], list[Message]] | None = None
        # Set when the round ends (for acknowledge and record_reply afterwards):
        self.status: OutcomeStatus | None = None
        self.history_len = 0  # history length right after its commits
        self.tail_start: int | None = None  # its last text-only model call (chars)
        self.tail_index: int | None = None  # that call's message in the history
        self.replied = False  # record_reply was used
        # Held until confirmed: no tool call, no commit, nothing the user hears.
        self.speculative = pending.speculative
        self.confirmed = asyncio.Event() if pending.speculative else None
        self.requests = 0  # model calls made
        self.request_tokens = 0  # their estimated prompt tokens

    def consume_call(self) -> None:
        """Mark the current model call's text as committed (never commit it twice)."""
        self.turn_text = []
        self.call_start = self.emitted_len


class Child:
    """State of one realtime child."""

    def __init__(self, options: ChildOptions, loop: asyncio.AbstractEventLoop) -> None:
        """Create the state of a child spawned with ``options``."""
        self.options = options
        self.loop = loop
        self.slot = LatestSlot()
        self.history: list[Message] = []
        # The history as requests show it (render_for_model, kept up to date on
        # every commit so no request re-renders it) and its token estimate.
        self.shown: list[Message] = []
        self.unmarked: list[int] = []  # shown interrupted answers without marker yet
        self.history_tokens = 0

        self.tickets: dict[int, asyncio.Future[Outcome]] = {}
        self.round: Round | None = None
        self.loop_task: asyncio.Task[None] | None = None
        self.critical = 0
        self.stopped = False
        self.state = ChildState.IDLE
        self.rounds = 0
        self.last_seq = 0
        self.suppressed_cancels = 0
        self.interrupted_rounds = 0
        self.superseded_rounds = 0
        self.completed_rounds = 0
        self.failed_rounds = 0
        self.tool_calls = 0
        self.first_delta_ms: float | None = None
        self.speculative_inputs = 0
        self.preempted_rounds = 0
        self.preempted_requests = 0
        self.preempted_tokens = 0
        self.teardown: asyncio.Task[int] | None = None  # the one stop/close
        self.close_requested = False
        self.carry: list[tuple[int, str]] = []  # superseded inputs to carry over
        self.last: Round | None = None  # the most recent round that reached history
        # Kernel(on_round_end=...): input ``seq`` will emit no more text.
        self.on_round_end: Callable[[str, int], None] | None = None

    def commit(self, *messages: Message) -> None:
        """Append to the history (never trimmed in place) and count its tokens."""
        self.history.extend(messages)
        for message in messages:
            self._show(message)

    def amend(self, index: int, message: Message | None) -> None:
        """Replace (or with None remove) one message: what the user heard changed."""
        if message is None:
            del self.history[index]
        else:
            self.history[index] = message
        # Rare (a report after the round ended): render the model's view anew.
        self.shown = render_for_model(self.history)
        self.unmarked = []
        self.history_tokens = sum(message_tokens(m) for m in self.shown)

    def shown_history(self) -> list[Message]:
        """Return the history as the next request shows it (render_for_model)."""
        if self.unmarked:
            shown = self.shown
            for index in self.unmarked:
                view = model_view(shown[index])
                self.history_tokens += message_tokens(view) - message_tokens(
                    shown[index]
                )
                shown[index] = view
            self.unmarked = []
        return self.shown

    def _show(self, message: Message) -> None:
        """Extend the model's view of the history by one message, as render_for_model.

        An interrupted answer gets its marker only when a request needs it: a
        barge-in commits one, and the cut must stay cheap.
        """
        shown = self.shown
        if shown and joins(shown[-1], message):
            self.shown_history()
            self.history_tokens -= message_tokens(shown[-1])
            view = joined(shown[-1], model_view(message))
            shown[-1] = view
        else:
            view = message
            if needs_marker(message):
                self.unmarked.append(len(shown))
            shown.append(view)
        self.history_tokens += message_tokens(view)

    # ── what the history keeps of a round (DESIGN 4.4) ─────────────────────

    def heard(self, rnd: Round) -> int:
        """Characters of the round's text that reached the user."""
        if self.options.delivery == "emitted":
            return rnd.emitted_len
        return min(rnd.delivered, rnd.emitted_len)

    def heard_text(self, rnd: Round) -> str:
        """Return the round's text as far as it reached the user."""
        text = "".join(rnd.emitted)
        heard = self.heard(rnd)
        return text if heard >= len(text) else text[:heard]

    def heard_call_text(self, rnd: Round) -> str:
        """Return the current model call's text as far as it reached the user."""
        heard = self.heard(rnd)
        if heard <= rnd.call_start:
            return ""
        if heard >= rnd.emitted_len:
            return "".join(rnd.turn_text)
        return "".join(rnd.emitted)[rnd.call_start : heard]

    def input_text(self, rnd: Round) -> str:
        """Return the round's input as ``commit_input`` will commit it (no commit)."""
        carried = sorted(c for c in self.carry if c[0] < rnd.seq)
        if not carried:
            return rnd.text
        return " ".join([*(t for _, t in carried), rnd.text])

    def commit_input(self, rnd: Round) -> None:
        """Commit the round's input, after the inputs it carries over (seq order)."""
        text = rnd.text
        if self.carry:
            carried = sorted(c for c in self.carry if c[0] < rnd.seq)
            self.carry = [c for c in self.carry if c[0] > rnd.seq]
            if carried:
                text = " ".join([*(t for _, t in carried), text])
        self.commit(Message("user", text))

    def commit_answer(self, rnd: Round, text: str) -> None:
        """Commit the text of a model call that ended the round (no tool calls)."""
        rnd.tail_start = rnd.call_start
        if text:
            self.commit(Message("assistant", text))
            rnd.tail_index = len(self.history) - 1

    def commit_group(
        self, rnd: Round, calls: list[ToolCall], results: list[Message]
    ) -> None:
        """Commit a tool group with the text of its model call heard so far.

        The text before tool calls is committed as far as it was heard when the
        group is committed, and not corrected later.
        """
        self.commit(
            Message("assistant", self.heard_call_text(rnd), tool_calls=calls),
            *results,
        )
        rnd.consume_call()

    def commit_partial(self, rnd: Round) -> None:
        """Commit what a cut round really did: finished tools and delivered text."""
        if rnd.group is not None:
            _, calls, results = rnd.group
            rnd.group = None
            done = {r.tool_call_id for r in results}
            finished = [c for c in calls if c.id in done]
            if finished:
                self.commit_group(rnd, finished, results)
                return
        text = self.heard_call_text(rnd)
        rnd.tail_start = rnd.call_start
        if text:
            self.commit(Message("assistant", text, interrupted=True))
            rnd.tail_index = len(self.history) - 1
        rnd.consume_call()

    def finish(self, rnd: Round, status: OutcomeStatus) -> None:
        """Mark a round that reached the history as ended and the newest one."""
        rnd.finished = True
        rnd.status = status
        rnd.history_len = len(self.history)
        self.last = rnd

    def end_completed(self, rnd: Round) -> None:
        """Settle a round whose model answered without (further) tool calls."""
        self.finish(rnd, "completed")
        if rnd.delivery_final:  # playback was cut before the model even finished
            self.amend_round(rnd)
        self.completed_rounds += 1
        self.settle(rnd.seq, rnd.future, Outcome("completed", "".join(rnd.emitted)))

    def end_cut(self, rnd: Round) -> None:
        """Settle a round ended by a newer input, interrupt() or stop."""
        error = "stopped" if self.stopped else None
        if rnd.speculative and (rnd.taken_back or self.slot.seq > rnd.seq):
            # Taken back, or newer words replace it: as if never said, and what
            # it cost is counted (the words the user goes on with hold these).
            rnd.finished = True
            if self.stopped:
                self.settle(rnd.seq, rnd.future, Outcome("interrupted", error=error))
                return
            self.preempted_rounds += 1
            self.preempted_requests += rnd.requests
            self.preempted_tokens += rnd.request_tokens + sum(
                estimate_tokens(d) for d in rnd.emitted
            )
            self.settle(rnd.seq, rnd.future, Outcome("superseded"))
            return
        if rnd.speculative:
            # Cut by interrupt() or a stop (a wake word, the conversation's end):
            # no sign that the words were unfinished, so they stand as for any
            # round cut there; no tool of it ran.
            self.let_stand(rnd)
        if not rnd.model_called and (rnd.withdrawn or not rnd.interrupt_requested):
            # The input never reached the model: superseded, nothing committed.
            rnd.finished = True
            if self.stopped:
                self.settle(rnd.seq, rnd.future, Outcome("interrupted", error=error))
                return
            self.slot.dropped += 1
            self.superseded_rounds += 1
            newest = self.slot.seq
            self.supersede(
                rnd, rnd.future, carried_into=newest if newest > rnd.seq else None
            )
            return
        if not rnd.model_called:
            self.commit_input(rnd)
        self.commit_partial(rnd)
        self.finish(rnd, "interrupted")
        self.interrupted_rounds += 1
        self.settle(
            rnd.seq, rnd.future, Outcome("interrupted", self.heard_text(rnd), error)
        )

    def end_failed(self, rnd: Round, message: str, error_type: str) -> None:
        """Settle a failed round: never the unheard partial (DESIGN 4.4)."""
        if rnd.speculative:  # never confirmed: nothing to commit, nothing was heard
            rnd.finished = True
            self.failed_rounds += 1
            self.settle(rnd.seq, rnd.future, Outcome("failed", "", message, error_type))
            return
        if not rnd.model_called:
            self.commit_input(rnd)
        self.commit_partial(rnd)
        self.finish(rnd, "failed")
        self.failed_rounds += 1
        self.settle(
            rnd.seq,
            rnd.future,
            Outcome("failed", self.heard_text(rnd), message, error_type),
        )

    def preempt_pending(
        self, given: PendingInput, future: asyncio.Future[Outcome] | None
    ) -> None:
        """Settle a speculative input voided in the slot: never carried over."""
        self.preempted_rounds += 1
        self.settle(given.seq, future, Outcome("superseded"))

    def supersede(
        self,
        given: PendingInput | Round,
        future: asyncio.Future[Outcome] | None,
        *,
        carried_into: int | None,
    ) -> None:
        """Settle an input that never reached the model; keep it to carry over.

        ``carried_into`` is the newest input at this moment: it carries this one,
        or, superseded in turn, carries both on to the next.
        """
        if self.options.carry_over:
            self.carry.append((given.seq, given.text))
        else:
            carried_into = None
        self.settle(given.seq, future, Outcome("superseded", carried_into=carried_into))

    def settle(
        self, seq: int, future: asyncio.Future[Outcome] | None, outcome: Outcome
    ) -> None:
        """Resolve input ``seq``'s ticket and report that it will emit no more text.

        Every input ends here exactly once (completed, cut, failed, superseded,
        stopped), after the last delta of its round reached the output handler.
        """
        settle(future, outcome)
        if self.on_round_end is not None:
            try:
                self.on_round_end(self.options.id, seq)
            except Exception:
                _LOGGER.exception("on_round_end callback failed")

    # ── reports from the output side and the adapter ──────────────────────

    def acknowledge(self, seq: int, chars: int, *, final: bool) -> None:
        """Record delivery of round ``seq`` (see Kernel.acknowledge)."""
        if self.options.delivery != "acknowledged":
            return
        rnd = self.round
        if rnd is None or rnd.seq != seq:
            rnd = self.last
            if rnd is None or rnd.seq != seq:
                return
        if rnd.delivery_final:
            return
        rnd.delivered = max(rnd.delivered, min(chars, rnd.emitted_len))
        rnd.delivery_final = final
        if rnd.speculative and rnd.delivered > 0 and not rnd.finished:
            self.let_stand(rnd)  # the user heard some of its answer
        if rnd.status is not None:
            self.amend_round(rnd)

    def let_stand(self, rnd: Round) -> None:
        """Let a speculative input stand (heard, or cut by an interrupt or a stop).

        It can no longer be taken back as if never said: the input is committed now
        and a cut commits what was heard (an ordinary interruption, not preempted).
        Its tool calls still wait for ``Kernel.confirm``.
        """
        rnd.speculative = False
        if rnd.model_called:  # always, once something was delivered
            self.commit_input(rnd)

    def amend_round(self, rnd: Round) -> None:
        """Make an ended round's last text say what the user heard."""
        if (
            self.last is not rnd
            or rnd.tail_start is None
            or len(self.history) != rnd.history_len
        ):
            return
        heard = min(rnd.delivered, rnd.emitted_len)
        if rnd.status == "completed" and (
            not rnd.delivery_final or heard >= rnd.emitted_len
        ):
            return  # a completed round was heard in full until told otherwise
        text = (
            "".join(rnd.emitted)[rnd.tail_start : heard]
            if heard > rnd.tail_start
            else ""
        )
        index = rnd.tail_index
        current = self.history[index] if index is not None else None
        if current is not None and current.interrupted and current.content == text:
            return
        message = Message("assistant", text, interrupted=True) if text else None
        if index is None:
            if message is not None:
                self.commit(message)
                rnd.tail_index = len(self.history) - 1
        else:
            self.amend(index, message)
            if message is None:
                rnd.tail_index = None
        rnd.history_len = len(self.history)

    def record_reply(self, seq: int, text: str) -> None:
        """Commit what the user was told after round ``seq`` failed (once)."""
        rnd = self.last
        if (
            rnd is None
            or rnd.seq != seq
            or rnd.status != "failed"
            or rnd.replied
            or len(self.history) != rnd.history_len
            or not text.strip()
        ):
            return
        rnd.replied = True
        rnd.tail_start = None  # the partial before the reply is no longer amendable
        self.commit(Message("assistant", text, failed=True))
        rnd.history_len = len(self.history)


def stopped_outcome() -> Outcome:
    """Return the outcome of an input that a stop or close ended."""
    return Outcome("interrupted", error="stopped")


def settle(future: asyncio.Future[Outcome] | None, outcome: Outcome) -> None:
    """Resolve a ticket; a caller may have cancelled it meanwhile."""
    if future is not None and not future.done():
        future.set_result(outcome)
