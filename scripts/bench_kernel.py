"""Kernel benchmarks: measured in one run, printed as a table (no assertions).

Run through ``scripts/bench`` (which sets up the venv). ``--quick`` shortens the
long idle/scale phases for a smoke run; the figures in docs/benchmarks.md come from
a full run.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
import gc
import os
from pathlib import Path
import platform
import sys
import time
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from custom_components.rtvoice.kernel import (
    ChannelDef,
    ChannelRegistry,
    ChildOptions,
    Delta,
    Kernel,
    Message,
    Ticket,
    ToolCall,
    ToolSpec,
    drop_unpaired_tool_calls,
    trim_to_window,
)
from custom_components.rtvoice.kernel.openai_provider import (
    OpenAIChatProvider,
    message_to_openai,
    tool_to_openai,
)
from scripts.bench_assist_tools import ASSIST_TOOLS
from tests.peers.openai_server import OpenAIPeer, Text, WaitFor

RT = ChannelDef(realtime=True)


def pct(values: list[float], q: float) -> float:
    """Return the q-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Row:
    """One line of the result table."""

    name: str
    measured: str
    target: str


class EndlessProvider:
    """Streams deltas tagged with the newest user text until cancelled.

    ``pause`` seconds between deltas (0 = yield to the loop only). Records the time of
    the last yield so the output handler can measure delta → handler latency.
    """

    def __init__(self, pause: float = 0.0) -> None:
        """Stream with ``pause`` seconds between deltas."""
        self.pause = pause
        self.calls = 0
        self.last_yield = 0.0

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[Delta]:
        """Yield tagged deltas until the consumer closes the stream."""
        self.calls += 1
        tag = messages[-1].content
        while True:
            self.last_yield = time.perf_counter()
            yield Delta(f"{tag}|")
            await asyncio.sleep(self.pause)


async def spawn(
    kernel: Kernel,
    channels: ChannelRegistry,
    child_id: str,
    handler: Callable[[str], None],
) -> None:
    """Register an RT channel pair for ``child_id`` and spawn the child."""
    channels.register_input(f"{child_id}:in", RT)
    channels.register_output(f"{child_id}:out", handler, definition=RT)
    await kernel.spawn(ChildOptions(child_id, f"{child_id}:in", f"{child_id}:out"))


async def bench_barge_in(trials: int) -> tuple[Row, Row]:
    """1 and 3: push → round cancelled (no further delta); delta → handler."""
    provider = EndlessProvider(pause=0.0)
    channels = ChannelRegistry()
    kernel = Kernel(provider, channels)
    first_delta = asyncio.Event()
    late_deltas = 0
    handler_lat: list[float] = []
    current = {"tag": ""}
    cut_at = {"tag": "", "t": 0.0}

    def on_delta(text: str) -> None:
        nonlocal late_deltas
        handler_lat.append(time.perf_counter() - provider.last_yield)
        tag = text[:-1]
        if tag == cut_at["tag"]:
            late_deltas += 1
        if tag == current["tag"]:
            first_delta.set()

    await spawn(kernel, channels, "c", on_delta)
    latencies: list[float] = []
    ticket: Ticket | None = None
    for trial in range(trials + 1):
        tag = f"t{trial}"
        first_delta.clear()
        t0 = time.perf_counter()
        new_ticket = kernel.push("c", tag)
        previous_tag = current["tag"]
        current["tag"] = tag
        if ticket is not None:
            cut_at["tag"] = previous_tag
            outcome = await ticket.outcome
            latencies.append(time.perf_counter() - t0)
            assert outcome.status == "interrupted", outcome
        ticket = new_ticket
        await first_delta.wait()
    await kernel.stop_all()
    barge = Row(
        "1 barge-in: push → round cancelled",
        f"p50 {pct(latencies, 50) * 1e3:.3f} ms, p99 {pct(latencies, 99) * 1e3:.3f} ms"
        f" ({trials} trials, {late_deltas} deltas after push)",
        "≤ 0.5 ms, 0 late deltas",
    )
    delta = Row(
        "3 first model delta → output handler",
        f"p50 {pct(handler_lat, 50) * 1e3:.3f} ms, p99 {pct(handler_lat, 99) * 1e3:.3f} ms"
        f" ({len(handler_lat)} deltas)",
        "p99 ≤ 0.5 ms",
    )
    return barge, delta


async def bench_http(trials: int) -> Row:
    """2: push → the loopback server observes the hang-up."""
    async with OpenAIPeer() as peer:
        never = asyncio.Event()
        peer.default_reply(Text("hello"), WaitFor(never))
        provider = OpenAIChatProvider(
            base_url=peer.base_url, api_key=None, model="test-model"
        )
        channels = ChannelRegistry()
        kernel = Kernel(provider, channels)
        got_delta = asyncio.Event()
        await spawn(kernel, channels, "c", lambda _text: got_delta.set())
        latencies: list[float] = []
        cpu: list[float] = []
        kernel.push("c", "start")
        for trial in range(trials):
            await got_delta.wait()
            got_delta.clear()
            request = peer.requests[trial]
            c0 = time.thread_time()
            t0 = time.perf_counter()
            kernel.push("c", f"input {trial}")
            await request.disconnected.wait()
            assert request.disconnected_at is not None
            latencies.append(request.disconnected_at - t0)
            cpu.append(time.thread_time() - c0)
        await got_delta.wait()
        await kernel.stop_all()
    edge = min(50, len(latencies))
    first, last = latencies[:edge], latencies[-edge:]
    return Row(
        "2 through HTTP: push → server sees hang-up",
        f"p50 {pct(latencies, 50) * 1e3:.3f} ms, p99 {pct(latencies, 99) * 1e3:.3f} ms"
        f" ({trials} trials, history grows to {len(peer.requests[-1].messages)}"
        f" messages, {sum(x > 1e-3 for x in latencies)} over 1 ms; CPU p99"
        f" {pct(cpu, 99) * 1e3:.3f} ms);"
        f" p99 first {edge} {pct(first, 99) * 1e3:.3f} ms,"
        f" last {edge} {pct(last, 99) * 1e3:.3f} ms",
        "p99 ≤ 5 ms; last-50 p99 ≤ 1.5 × first-50 p99",
    )


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts event-loop iterations (each one is a wake-up)."""

    iterations = 0

    def _run_once(self) -> None:
        CountingLoop.iterations += 1
        super()._run_once()  # type: ignore[misc]


async def _idle_window(seconds: float) -> tuple[int, float]:
    """Sleep ``seconds`` on the loop; return (loop iterations, CPU ms) meanwhile."""
    start_iter = CountingLoop.iterations
    cpu0 = time.process_time()
    await asyncio.sleep(seconds)
    return CountingLoop.iterations - start_iter, (time.process_time() - cpu0) * 1e3


async def bench_idle(children: int, seconds: float) -> Row:
    """4: idle children cost nothing: no provider calls, no wake-ups, no CPU.

    The same window is measured first with no kernel at all: this VM accounts some
    CPU to a process that only sleeps, and that baseline is not the kernel's.
    """
    await asyncio.sleep(0)
    base_iterations, base_cpu = await _idle_window(seconds)
    provider = EndlessProvider()
    channels = ChannelRegistry()
    kernel = Kernel(provider, channels)
    for index in range(children):
        await spawn(kernel, channels, f"c{index}", lambda _t: None)
    await asyncio.sleep(0)  # let every child loop reach its wait
    iterations, cpu_ms = await _idle_window(seconds)
    await kernel.stop_all()
    return Row(
        f"4 idle: {children} children for {seconds:.0f} s",
        f"{provider.calls} provider calls,"
        f" {iterations - base_iterations} kernel wake-ups"
        f" ({iterations} loop iterations, {base_iterations} with no kernel),"
        f" {cpu_ms - base_cpu:.1f} ms CPU over the no-kernel baseline"
        f" ({cpu_ms:.1f} vs {base_cpu:.1f} ms)",
        "0 / 0 / < 10 ms",
    )


async def bench_scale(children: int, hz: float, seconds: float) -> Row:
    """5: many children interrupted at ``hz`` each: misses, cross-talk, latency."""
    provider = EndlessProvider(pause=0.05)  # ~20 tokens/s per stream, like a model
    channels = ChannelRegistry()
    kernel = Kernel(provider, channels)
    cut_tags: dict[str, set[str]] = {}
    missed = 0
    cross = 0
    latencies: list[float] = []
    wrong_outcomes = 0

    def handler_for(child_id: str) -> Callable[[str], None]:
        def on_delta(text: str) -> None:
            nonlocal missed, cross
            tag = text[:-1]
            owner, _, _ = tag.partition("#")
            if owner != child_id:
                cross += 1
            elif tag in cut_tags[child_id]:
                missed += 1

        return on_delta

    for index in range(children):
        child_id = f"c{index}"
        cut_tags[child_id] = set()
        await spawn(kernel, channels, child_id, handler_for(child_id))
    tickets: dict[str, tuple[str, Ticket]] = {}

    def record(child_id: str, tag: str, t0: float, ticket: Ticket) -> None:
        def done(fut: asyncio.Future) -> None:  # type: ignore[type-arg]
            nonlocal wrong_outcomes
            latencies.append(time.perf_counter() - t0)
            if fut.result().status not in ("interrupted", "superseded"):
                wrong_outcomes += 1

        ticket.outcome.add_done_callback(done)

    period = 1 / hz
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def drive(index: int) -> None:
        """Interrupt one child every period, phase-shifted so pushes spread out."""
        child_id = f"c{index}"
        tick = 0
        phase = period * index / children
        while (due := start + phase + tick * period) - start < seconds:
            await asyncio.sleep(max(0.0, due - loop.time()))
            tag = f"{child_id}#{tick}"
            t0 = time.perf_counter()
            previous = tickets.get(child_id)
            ticket = kernel.push(child_id, tag)
            if previous is not None:
                cut_tags[child_id].add(previous[0])
                record(child_id, previous[0], t0, previous[1])
            tickets[child_id] = (tag, ticket)
            tick += 1

    await asyncio.gather(*(drive(index) for index in range(children)))
    await kernel.stop_all()
    return Row(
        f"5 scale: {children} children × {hz:.0f} Hz for {seconds:.0f} s",
        f"{missed} missed cancels, {cross} cross-talk, {wrong_outcomes} wrong outcomes,"
        f" cancel p50 {pct(latencies, 50) * 1e3:.2f} ms p99 {pct(latencies, 99) * 1e3:.2f} ms"
        f" ({len(latencies)} cancels)",
        "0 / 0 / ≤ 5 ms",
    )


def history_of(size: int) -> list[Message]:
    """Build a realistic history: user, assistant with tool calls + results, answers."""
    messages = [Message("system", "You are a voice assistant. " * 20)]
    index = 0
    while len(messages) < size:
        messages.append(Message("user", f"turn on light number {index} please"))
        call = ToolCall(f"call{index}", "HassTurnOn", {"name": f"light {index}"})
        messages.append(Message("assistant", "One moment.", tool_calls=[call]))
        messages.append(
            Message("tool", '{"success": true}', tool_call_id=f"call{index}")
        )
        messages.append(Message("assistant", f"Light {index} is on now."))
        index += 1
    messages = messages[:size]
    messages.append(Message("user", "and now the kitchen"))
    return messages


def bench_trim(rounds: int) -> Row:
    """6: trim + pairing check on a 500-message history."""
    messages = history_of(500)
    results = {}
    for label, window in (("fits", 1_000_000), ("trims", 2000)):
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            drop_unpaired_tool_calls(trim_to_window(messages, window))
            samples.append(time.perf_counter() - t0)
        results[label] = samples
    clean = messages
    samples_clean = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        same = drop_unpaired_tool_calls(clean)
        samples_clean.append(time.perf_counter() - t0)
    assert same is clean
    return Row(
        "6 trim + pairing, 500 messages",
        f"fits p50 {pct(results['fits'], 50) * 1e6:.0f} µs,"
        f" trims p50 {pct(results['trims'], 50) * 1e6:.0f} µs"
        f" (p99 {pct(results['trims'], 99) * 1e6:.0f} µs),"
        f" pairing alone p50 {pct(samples_clean, 50) * 1e6:.0f} µs",
        "≤ 1 ms",
    )


async def bench_build(history_size: int, sdk_rounds: int, rounds: int) -> Row:
    """7: CPU to build one request: history + HA's Assist tools, SDK path vs ours.

    Both go through a real ``openai`` client whose HTTP transport is in-process;
    the time is the thread's CPU from the call to the transport receiving the
    request. The SDK path is what the provider did before: convert, then the typed
    ``chat.completions.create``. Each request adds a new user message to the same
    history, as a conversation does.
    """
    arrived: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        arrived.append(time.thread_time())
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=b"data: [DONE]\n\n",
        )

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    base_url = "http://model.invalid/v1"
    tools = [
        ToolSpec(t["name"], t["description"], t["parameters"]) for t in ASSIST_TOOLS
    ]
    history = history_of(history_size)[:-1]
    sdk = openai.AsyncOpenAI(
        base_url=base_url, api_key="no-key", http_client=http, max_retries=0
    )
    provider = OpenAIChatProvider(
        base_url=base_url, api_key=None, model="m", http_client=http
    )

    async def sdk_path(messages: list[Message]) -> None:
        request: dict[str, Any] = {
            "model": "m",
            "messages": [message_to_openai(message) for message in messages],
            "stream": True,
            "tools": [tool_to_openai(tool) for tool in tools],
        }
        async for _chunk in await sdk.chat.completions.create(**request):
            pass

    async def our_path(messages: list[Message]) -> None:
        async for _delta in provider.stream(messages, tools):
            pass

    async def measure(path: Callable[[list[Message]], Any], count: int) -> list[float]:
        samples = []
        for index in range(count):
            messages = [*history, Message("user", f"and now lamp {index}")]
            t0 = time.thread_time()
            await path(messages)
            samples.append(arrived[-1] - t0)
        return samples

    fresh = [Message(m.role, m.content, m.tool_calls, m.tool_call_id) for m in history]
    t0 = time.thread_time()
    await our_path([*fresh, Message("user", "first")])
    first = arrived[-1] - t0
    ours = await measure(our_path, rounds)
    typed = await measure(sdk_path, sdk_rounds)
    await http.aclose()
    return Row(
        f"7 build one request: {history_size} messages, {len(tools)} Assist tools",
        f"ours p50 {pct(ours, 50) * 1e3:.2f} ms, p99 {pct(ours, 99) * 1e3:.2f} ms"
        f" (first, uncached: {first * 1e3:.2f} ms) vs SDK typed path"
        f" p50 {pct(typed, 50) * 1e3:.2f} ms, p99 {pct(typed, 99) * 1e3:.2f} ms"
        f" (openai {openai.__version__}; CPU)",
        "≤ 2 ms",
    )


def machine() -> str:
    """Describe this machine: CPU, cores, Python, kernel."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" {platform.system()} {platform.release()}"
    )


async def main(args: argparse.Namespace) -> None:
    """Run the selected benchmarks and print the table."""
    only = {int(n) for n in args.only.split(",")} if args.only else None

    def wanted(*numbers: int) -> bool:
        return only is None or any(n in only for n in numbers)

    rows: list[Row] = []
    # Each phase starts from a collected heap, so a phase never pays for the
    # garbage of the one before it (the GC runs whenever allocation triggers it).
    delta = None
    if wanted(1, 3):
        gc.collect()
        barge, delta = await bench_barge_in(args.trials)
        rows.append(barge)
    if wanted(2):
        gc.collect()
        rows.append(await bench_http(args.http_trials))
    if delta is not None:
        rows.append(delta)
    if wanted(4):
        gc.collect()
        rows.append(await bench_idle(100, args.idle_seconds))
    if wanted(5):
        gc.collect()
        rows.append(await bench_scale(200, 10, args.scale_seconds))
    if wanted(6):
        gc.collect()
        rows.append(bench_trim(200))
    if wanted(7):
        gc.collect()
        rows.append(await bench_build(200, args.build_rounds // 10, args.build_rounds))
    print(f"rtvoice kernel benchmark — {time.strftime('%Y-%m-%d')} — {machine()}")
    if not rows:
        return
    width = max(len(r.name) for r in rows)
    print(f"{'benchmark'.ljust(width)} | measured | target")
    for row in rows:
        print(f"{row.name.ljust(width)} | {row.measured} | {row.target}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short idle/scale phases")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--http-trials", type=int, default=300)
    parser.add_argument("--build-rounds", type=int, default=200)
    parser.add_argument("--only", help="comma-separated row numbers, e.g. 2,7")
    parsed = parser.parse_args()
    parsed.idle_seconds = 1.0 if parsed.quick else 10.0
    parsed.scale_seconds = 1.0 if parsed.quick else 10.0
    if parsed.quick:
        parsed.trials, parsed.http_trials, parsed.build_rounds = 300, 50, 50
    runner = asyncio.Runner(loop_factory=CountingLoop)
    with runner:
        runner.run(main(parsed))
