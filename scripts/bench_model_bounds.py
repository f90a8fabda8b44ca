"""Issue 16 §3 figures: what a hostile model's answer makes a conversation do.

Two rows, measured in one run, printed (no assertions):

- a model that answers every request with another tool call, through the real
  OpenAI provider against the loopback OpenAI-compatible peer: requests, tool
  calls and the largest request's messages within 15 s (``max_tool_turns`` as
  given on the command line; 0 was "unlimited" before issue 16);
- one response with 3,000 tool calls (each 1 ms), the user says "STOP!" while
  the first runs: how many calls still run afterwards.

Run: ``PYTHONPATH=. .venv/bin/python scripts/bench_model_bounds.py [max_tool_turns]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import json
import sys
import time
from typing import Any

from custom_components.rtvoice.kernel import (
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    Message,
    ToolCall,
    ToolSpec,
)
from custom_components.rtvoice.kernel.openai_provider import OpenAIChatProvider
from tests.kernel.fakes import rt_pair
from tests.peers.openai_server import OpenAIPeer, ToolCall as PeerCall


class Runner:
    """A tool that toggles a light in 1 ms; counts its calls."""

    def __init__(self) -> None:
        """Start with no call."""
        self.calls = 0

    def specs(self) -> list[ToolSpec]:
        """Offer the toggle."""
        return [ToolSpec("toggle", "toggle a light", {"type": "object"})]

    async def call(self, call: ToolCall) -> str:
        """Toggle."""
        self.calls += 1
        await asyncio.sleep(0.001)
        return '{"ok": true}'


async def runaway(max_tool_turns: int) -> None:
    """Print what a model that always calls a tool does in 15 s."""
    peer = OpenAIPeer(api_key=None, models=["m"])
    await peer.start()
    peer.default_reply(PeerCall("call_x", "toggle", "{}"))
    channels = ChannelRegistry()
    rt_pair(channels, "c", lambda _delta: None)
    provider = OpenAIChatProvider(base_url=peer.base_url, api_key=None, model="m")
    runner = Runner()
    kernel = Kernel(provider, channels, tools=runner)
    await kernel.spawn(
        ChildOptions(
            id="c", input="c-in", output="c-out", max_tool_turns=max_tool_turns
        )
    )
    ticket = kernel.push("c", "go")
    start = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.shield(ticket.outcome), 15)
        ended = f"the round ended after {time.perf_counter() - start:.2f} s"
    except TimeoutError:
        ended = "still running at 15 s"
    body = max(len(json.dumps(r.messages)) for r in peer.requests)
    print(
        f"always-tool-calling model, max_tool_turns={max_tool_turns}:"
        f" {len(peer.requests)} requests, {runner.calls} tool calls,"
        f" largest request messages {body / 1000:.0f} kB, {ended}"
    )
    await kernel.stop_all()
    await provider.close()
    await peer.stop()


class Group:
    """A model that answers "blink" with 3,000 tool calls at once."""

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """One response."""
        if messages[-1].content == "blink":
            calls = [ToolCall(f"t{i}", "toggle", {}) for i in range(3000)]
            yield Delta(tool_calls=calls)
        else:
            yield Delta(content="Stopped.")


async def stop_during_group() -> None:
    """Print how many of 3,000 calls still run after a STOP during the first."""
    channels = ChannelRegistry()
    rt_pair(channels, "c", lambda _delta: None)
    runner = Runner()
    kernel = Kernel(Group(), channels, tools=runner)  # type: ignore[arg-type]
    await kernel.spawn(ChildOptions(id="c", input="c-in", output="c-out"))
    kernel.push("c", "blink")
    while runner.calls == 0:
        await asyncio.sleep(0)
    before = runner.calls
    stop = kernel.push("c", "STOP!")
    outcome: Any = await asyncio.wait_for(asyncio.shield(stop.outcome), 60)
    print(
        f"3,000 calls in one response, STOP during call {before}:"
        f" {runner.calls - before} calls run after the STOP ({runner.calls} in all);"
        f" answer {outcome.text!r}"
    )
    await kernel.stop_all()


def main() -> None:
    """Run both rows."""
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    asyncio.run(runaway(turns))
    asyncio.run(stop_during_group())


if __name__ == "__main__":
    main()
