"""Bounds on what a model's answer may make a child do (issue 16 §3).

A model is untrusted input: it may call tools for ever, ask for thousands of calls in
one answer, send arguments nested hundreds deep or stream an answer without end. The
kernel holds each of these to a bound and answers the excess in a way the model can
read (a tool error result), so the history stays paired and the conversation goes on.

``argument_problem`` walks arguments iteratively (no recursion, so no depth can make
it fail) and says what is wrong with them, or None.
"""

from __future__ import annotations

from typing import Any, Final

from .types import ToolCall

# Rounds of tool calls per input: a round may call the model at most this many times
# with tools (the model then answers without tools). ``ChildOptions.max_tool_turns``
# picks a value up to the ceiling; 0 (or more than the ceiling) means the ceiling.
DEFAULT_MAX_TOOL_TURNS: Final = 8
MAX_TOOL_TURNS_CEILING: Final = 25

# Tool calls run from one model response; the rest are answered "not run".
DEFAULT_MAX_TOOL_CALLS: Final = 16
MAX_TOOL_CALLS_CEILING: Final = 64

# Tool-call arguments: nesting depth, values (containers and scalars) and characters
# of strings and keys. Home Assistant's tools take a handful of flat fields.
MAX_ARGUMENT_DEPTH: Final = 16
MAX_ARGUMENT_VALUES: Final = 2_000
MAX_ARGUMENT_CHARS: Final = 32_000
MAX_TOOL_NAME_CHARS: Final = 256

# Characters of one answer (every text delta of a round, across its model calls).
DEFAULT_MAX_ANSWER_CHARS: Final = 4_000
MIN_MAX_ANSWER_CHARS: Final = 100
MAX_MAX_ANSWER_CHARS: Final = 200_000

_SCALARS: Final = (str, int, float, bool, type(None))


def effective_tool_turns(configured: int) -> int:
    """Return the tool turns a round may take: ``configured`` within the ceiling."""
    if configured <= 0 or configured > MAX_TOOL_TURNS_CEILING:
        return MAX_TOOL_TURNS_CEILING
    return configured


def effective_tool_calls(configured: int) -> int:
    """Return the tool calls one response may run: ``configured`` within the ceiling."""
    if configured <= 0 or configured > MAX_TOOL_CALLS_CEILING:
        return MAX_TOOL_CALLS_CEILING
    return configured


def effective_answer_chars(configured: int) -> int:
    """Return the characters one answer may have (0: the default)."""
    if configured <= 0:
        return DEFAULT_MAX_ANSWER_CHARS
    return max(MIN_MAX_ANSWER_CHARS, min(configured, MAX_MAX_ANSWER_CHARS))


def argument_problem(arguments: Any) -> str | None:
    """Say why tool-call arguments cannot be used, or None when they are fine.

    Arguments must be a JSON object of JSON values, at most ``MAX_ARGUMENT_DEPTH``
    deep, with at most ``MAX_ARGUMENT_VALUES`` values and ``MAX_ARGUMENT_CHARS``
    characters of strings and keys. Never raises: anything that cannot be read is a
    problem too.
    """
    try:
        return _problem(arguments)
    except Exception as err:  # noqa: BLE001 - unreadable arguments are an answer
        return f"arguments could not be read ({type(err).__name__})"


def _problem(arguments: Any) -> str | None:
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    values = 0
    chars = 0
    stack: list[tuple[Any, int]] = [(arguments, 1)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_ARGUMENT_VALUES:
            return f"arguments have more than {MAX_ARGUMENT_VALUES} values"
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            if values + len(value) > MAX_ARGUMENT_VALUES:
                return f"arguments have more than {MAX_ARGUMENT_VALUES} values"
            if depth > MAX_ARGUMENT_DEPTH:
                return f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
            for key, item in value.items():
                if not isinstance(key, str):
                    return "argument names must be strings"
                chars += len(key)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            if values + len(value) > MAX_ARGUMENT_VALUES:
                return f"arguments have more than {MAX_ARGUMENT_VALUES} values"
            if depth > MAX_ARGUMENT_DEPTH:
                return f"arguments are nested deeper than {MAX_ARGUMENT_DEPTH} levels"
            stack.extend((item, depth + 1) for item in value)
        elif not isinstance(value, _SCALARS):
            return f"arguments hold a {type(value).__name__}, not a JSON value"
        if chars > MAX_ARGUMENT_CHARS:
            return f"arguments are longer than {MAX_ARGUMENT_CHARS} characters"
    return None


MAX_CALL_ID_CHARS: Final = 256
MAX_ERROR_CHARS: Final = 300


def bounded_call(call: ToolCall, index: int) -> ToolCall:
    """Return ``call`` if it is usable, else a copy that says why not (``error``).

    A call whose arguments break a bound keeps no arguments, so nothing later (the
    history, a request body, a copy) has to handle them; a missing or oversized id
    is replaced (``call_<index>``) so its result still pairs with it. Never raises.
    """
    try:
        call_id = call.id
        if (
            not isinstance(call_id, str)
            or not call_id
            or len(call_id) > MAX_CALL_ID_CHARS
        ):
            call_id = f"call_{index}"
        name = call.name if isinstance(call.name, str) else ""
        error = call.error if isinstance(call.error, str) else None
        if len(name) > MAX_TOOL_NAME_CHARS:
            name = name[:MAX_TOOL_NAME_CHARS]
            error = error or f"tool name longer than {MAX_TOOL_NAME_CHARS} characters"
        problem = error or argument_problem(call.arguments)
    except Exception as err:  # noqa: BLE001 - an unreadable call is an error result
        return ToolCall(
            id=f"call_{index}",
            name="",
            error=f"tool call could not be read ({type(err).__name__})",
        )
    if problem is None and call_id is call.id:
        return call
    if problem is None:
        return ToolCall(id=call_id, name=name, arguments=call.arguments)
    if len(problem) > MAX_ERROR_CHARS:
        problem = problem[: MAX_ERROR_CHARS - 1] + "…"
    return ToolCall(id=call_id, name=name, arguments={}, error=problem)
