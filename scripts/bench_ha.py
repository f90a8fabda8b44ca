"""Home Assistant side benchmark: event-loop lag of a long conversation with tools.

Row 8 of ``scripts/bench``: a scripted 200-turn conversation through HA's real
conversation component and the Realtime Voice conversation entity, each turn a
tool call through HA's Assist LLM API (the demo kitchen light, on and off) and an
answer, against the loopback OpenAI peer. Every callback the event loop runs is
timed (``asyncio.Handle._run``); the row reports the longest one, i.e. the longest
the loop was held, and what held it: wall time, the thread's CPU time (on a shared
VM the wall time also counts the time other processes had the core), and wall time
without the garbage collector's pauses. Printed, never asserted.

The Home Assistant instance is the test harness's (``async_test_home_assistant`` of
pytest-homeassistant-custom-component), set up like ``tests/components``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
import gc
import json
from pathlib import Path
import sys
import time
from typing import Any, Self

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_homeassistant_custom_component.common import async_test_home_assistant

from homeassistant import loader
from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from scripts.bench_kernel import Row, pct
from tests.components.common import (
    PEER_API_KEY,
    PEER_MODEL,
    async_load_entry,
    async_setup_demo_lights,
    openai_entry,
)
from tests.components.pipeline.helpers import AGENT, tool_named
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall

KITCHEN = "light.kitchen_lights"


class LoopHoldMeter:
    """Times every callback of the event loop while active."""

    def __init__(self) -> None:
        """Start inactive."""
        self.durations: list[float] = []
        self.without_gc: list[float] = []
        self.cpu: list[float] = []
        self.longest_cpu: list[tuple[float, str]] = []
        self.longest: list[tuple[float, str]] = []
        self.gc_pauses: list[tuple[float, int]] = []
        self._gc_started = 0.0
        self._gc_in_callback = 0.0
        self._original: Callable[[asyncio.Handle], None] | None = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        pause = time.perf_counter() - self._gc_started
        self.gc_pauses.append((pause, info["generation"]))
        self._gc_in_callback += pause

    def __enter__(self) -> Self:
        """Patch ``Handle._run`` (every callback and task step goes through it)."""
        original = getattr(asyncio.Handle, "_run")
        self._original = original
        meter = self

        def timed_run(handle: asyncio.Handle) -> None:
            meter._gc_in_callback = 0.0
            c0 = time.thread_time()
            t0 = time.perf_counter()
            try:
                original(handle)
            finally:
                meter.record_cpu(time.thread_time() - c0, handle)
                meter.record(time.perf_counter() - t0, handle)

        setattr(asyncio.Handle, "_run", timed_run)
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        """Restore ``Handle._run``."""
        setattr(asyncio.Handle, "_run", self._original)
        gc.callbacks.remove(self._on_gc)

    def record_cpu(self, duration: float, handle: asyncio.Handle) -> None:
        """Keep every callback's CPU time and the three longest."""
        self.cpu.append(duration)
        if len(self.longest_cpu) < 3 or duration > self.longest_cpu[-1][0]:
            self.longest_cpu.append((duration, _describe(handle)))
            self.longest_cpu.sort(key=lambda item: -item[0])
            del self.longest_cpu[3:]

    def record(self, duration: float, handle: asyncio.Handle) -> None:
        """Keep every duration (with and without GC) and the five longest."""
        self.durations.append(duration)
        self.without_gc.append(duration - self._gc_in_callback)
        if len(self.longest) < 5 or duration > self.longest[-1][0]:
            what = _describe(handle)
            if self._gc_in_callback:
                what += f" (GC {self._gc_in_callback * 1e3:.1f} ms)"
            self.longest.append((duration, what))
            self.longest.sort(key=lambda item: -item[0])
            del self.longest[5:]


def _describe(handle: asyncio.Handle) -> str:
    """Name what a callback ran: a task's coroutine, or the callback function."""
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if isinstance(task, asyncio.Task):
        coro = task.get_coro()
        code = getattr(coro, "cr_code", None)
        name = getattr(coro, "__qualname__", repr(coro))
        where = Path(code.co_filename).parent.name if code is not None else "?"
        return f"task {name} ({where})"
    return getattr(callback, "__qualname__", repr(callback))


async def converse(
    hass: HomeAssistant, text: str, conversation_id: str | None
) -> conversation.ConversationResult:
    """One turn through HA's conversation component to the Realtime Voice entity."""
    return await conversation.async_converse(
        hass, text, conversation_id, Context(), language="en", agent_id=AGENT
    )


async def bench_loop_lag(turns: int) -> Row:
    """8: the longest the loop is held during a ``turns``-turn conversation."""
    async with (
        async_test_home_assistant() as hass,
        OpenAIPeer(api_key=PEER_API_KEY, models=[PEER_MODEL]) as peer,
    ):
        hass.data.pop(loader.DATA_CUSTOM_COMPONENTS)  # load custom_components/
        await async_setup_demo_lights(hass)
        await async_load_entry(hass, openai_entry(hass, peer))
        peer.enqueue(Text("Hi! What can I do?"))
        first = await converse(hass, "hello", None)
        conversation_id = first.conversation_id
        tools = peer.requests[0].tools or []
        names = {
            service: tool_named(tools, intent)
            for service, intent in (("on", "HassTurnOn"), ("off", "HassTurnOff"))
        }
        gc.collect()
        with LoopHoldMeter() as meter:
            started = time.perf_counter()
            for turn in range(turns):
                service = "on" if turn % 2 == 0 else "off"
                peer.enqueue(
                    Text("Sure."),
                    ToolCall(
                        f"call_{turn}",
                        names[service],
                        json.dumps({"name": "Kitchen Lights"}),
                    ),
                )
                peer.enqueue(Text(f"The kitchen light is {service}."))
                result = await converse(
                    hass, f"kitchen light {service}, please", conversation_id
                )
                spoken = result.response.speech["plain"]["speech"]
                assert spoken.endswith(f"is {service}."), spoken
                state = hass.states.get(KITCHEN)
                assert state is not None
                assert state.state == service, (turn, state.state)
            elapsed = time.perf_counter() - started
        history = len(peer.requests[-1].messages)
        await hass.async_stop(force=True)
    holds = meter.durations
    worst = "; ".join(f"{d * 1e3:.1f} ms {what}" for d, what in meter.longest[:3])
    worst_cpu = "; ".join(f"{d * 1e3:.1f} ms {what}" for d, what in meter.longest_cpu)
    gc_max, gc_generation = max(meter.gc_pauses, default=(0.0, 0))
    return Row(
        f"8 HA: event-loop lag, {turns}-turn conversation with tools",
        f"max {max(holds) * 1e3:.2f} ms, p99.9 {pct(holds, 99.9) * 1e3:.2f} ms,"
        f" CPU max {max(meter.cpu) * 1e3:.2f} ms (p99.9 {pct(meter.cpu, 99.9) * 1e3:.2f}),"
        f" without GC pauses max {max(meter.without_gc) * 1e3:.2f} ms"
        f" (longest GC pause {gc_max * 1e3:.1f} ms, generation {gc_generation});"
        f" {len(holds)} callbacks, {elapsed:.1f} s, {2 * turns} requests, the last"
        f" with {history} messages; longest (wall): {worst}; longest (CPU):"
        f" {worst_cpu}",
        "max ≤ 10 ms",
    )


async def main(args: argparse.Namespace) -> None:
    """Run the Home Assistant benchmark and print its row."""
    if args.only and "8" not in args.only.split(","):
        return
    row = await bench_loop_lag(args.turns)
    print(f"{row.name} | {row.measured} | {row.target}")


def _parse() -> Any:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 turns")
    parser.add_argument("--only", help="comma-separated row numbers; runs if 8 is one")
    # scripts/bench passes the kernel benchmark's options too.
    parsed, _unknown = parser.parse_known_args()
    if parsed.quick:
        parsed.turns = 20
    return parsed


if __name__ == "__main__":
    asyncio.run(main(_parse()))
