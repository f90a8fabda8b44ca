"""Bounds on a tool call's arguments, as the model sends them (one reusable check).

A model's tool call carries its arguments as a JSON string: nested 600 deep it
made ``copy.deepcopy`` raise RecursionError, a few megabytes of it go into every
later request. ``parse_tool_arguments`` reads the string (or an already decoded
object) within ``ToolArgumentLimits`` — its size, how deep it nests, how many items
one object or list holds, how long one string is — without recursion, and raises
``ToolArgumentsError`` (a ``ValueError`` with a short reason the model can read as
the tool's error result) for anything beyond them or not a JSON object.

HA-free and dependency-light (pydantic only, for the limits), so the kernel's tool
loop can use it at the point where it decodes a call's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ToolArgumentsError(ValueError):
    """A tool call's arguments that are not accepted (the reason, for the model)."""


class ToolArgumentLimits(BaseModel):
    """How big a tool call's arguments may be."""

    model_config = ConfigDict(frozen=True)

    max_bytes: int = Field(default=64 * 1024, ge=2)  # the JSON text, UTF-8
    max_depth: int = Field(default=16, ge=1)  # objects and lists inside each other
    max_items: int = Field(default=512, ge=1)  # members of one object or list
    max_string: int = Field(default=16 * 1024, ge=1)  # characters of one string


DEFAULT_LIMITS = ToolArgumentLimits()


def parse_tool_arguments(
    raw: str | bytes | Mapping[str, Any] | None,
    limits: ToolArgumentLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """Return the arguments as a dict, checked against ``limits``.

    ``raw``: the JSON text of the call's arguments (empty or None: no arguments),
    or an object a provider decoded already.
    """
    if raw is None or (isinstance(raw, (str, bytes)) and not raw.strip()):
        return {}
    if isinstance(raw, (str, bytes)):
        size = len(raw.encode("utf-8") if isinstance(raw, str) else raw)
        if size > limits.max_bytes:
            raise ToolArgumentsError(
                f"arguments too large ({size} bytes, at most {limits.max_bytes})"
            )
        try:
            value = json.loads(raw)
        except RecursionError:
            raise ToolArgumentsError(
                f"arguments nested deeper than {limits.max_depth}"
            ) from None
        except json.JSONDecodeError as err:
            raise ToolArgumentsError(f"arguments are not JSON ({err.msg})") from None
        except ValueError:  # bytes that are not UTF-8
            raise ToolArgumentsError("arguments are not JSON") from None
    else:
        value = raw
    if not isinstance(value, Mapping):
        raise ToolArgumentsError("arguments must be a JSON object")
    _check(value, limits)
    return dict(value)


def _check(value: Any, limits: ToolArgumentLimits) -> None:
    """Walk ``value`` without recursion; raise at the first bound it breaks."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if len(item) > limits.max_string:
                raise ToolArgumentsError(
                    f"a string argument is longer than {limits.max_string} characters"
                )
            continue
        if isinstance(item, Mapping):
            children: Any = item.values()
            if any(not isinstance(key, str) for key in item):
                raise ToolArgumentsError("object keys must be strings")
            stack.extend((key, depth) for key in item)  # keys are strings: length
        elif isinstance(item, (list, tuple)):
            children = item
        elif item is None or isinstance(item, (bool, int, float)):
            continue
        else:
            raise ToolArgumentsError(f"unsupported value ({type(item).__name__})")
        if depth > limits.max_depth:
            raise ToolArgumentsError(f"arguments nested deeper than {limits.max_depth}")
        if len(item) > limits.max_items:
            raise ToolArgumentsError(
                f"an object or list has more than {limits.max_items} items"
            )
        seen += len(item)
        if seen > limits.max_bytes:  # every item costs at least a byte of JSON
            raise ToolArgumentsError("arguments too large")
        stack.extend((child, depth + 1) for child in children)
