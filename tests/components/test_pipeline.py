"""Pipeline mode: real Assist pipeline runs on a satellite, with barge-in.

A run is started the way satellite firmware starts one: through the satellite entity's
``async_accept_pipeline_from_satellite``. A second run cancels the first exactly as HA
does it (``_cancel_running_pipeline``), which reaches the agent as a cancelled call.
The speech-to-text stage hears a queued text (``LoopbackSTT``); everything after it,
up to and including the intent stage with our agent, is HA's own pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
import contextlib
import json
from typing import Any

import pytest

from homeassistant.components.assist_pipeline import PipelineEventType, PipelineStage
from homeassistant.const import STATE_OFF, STATE_ON
from homeassistant.helpers import intent
from tests.components.pipeline.helpers import (
    BED_LIGHT,
    SATELLITE,
    GatedBedLightOn,
    Home,
    async_setup_rtvoice,
    run_satellite,
    tool_named,
    wait,
)
from tests.peers.openai_server import Hang, OpenAIPeer, Text, ToolCall, WaitFor


def intent_end(home: Home, index: int = -1) -> dict[str, Any]:
    """Return the agent's result as the pipeline reported it (INTENT_END)."""
    event = home.satellite.events_of(PipelineEventType.INTENT_END)[index]
    return event.data["intent_output"]


def spoken(output: dict[str, Any]) -> str:
    """Speech of a pipeline intent output."""
    return str(output["response"]["speech"]["plain"]["speech"])


async def finished(task: asyncio.Task[None]) -> None:
    """Wait for a pipeline run to end."""
    await wait(task)


async def cancelled(task: asyncio.Task[None]) -> None:
    """Wait for a pipeline run that a newer run cancelled."""
    with contextlib.suppress(asyncio.CancelledError):
        await wait(task)
    assert task.cancelled() or task.done()


async def test_pipeline_run_answers(home: Home, openai_peer: OpenAIPeer) -> None:
    """A run through STT and our agent streams the answer into the pipeline."""
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Text("Good "), Text("morning."))
    await finished(run_satellite(home, "good morning"))
    output = intent_end(home)
    assert spoken(output) == "Good morning."
    # The pipeline saw the deltas while the agent was still running.
    assert home.satellite.streamed_text() == "Good morning."
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.id == output["conversation_id"]
    assert openai_peer.requests[0].messages[-1] == {
        "role": "user",
        "content": "good morning",
    }


async def test_new_run_mid_answer_cancels_the_round(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Barge-in: a second run cancels the first round; the new words are answered."""
    await async_setup_rtvoice(home, openai_peer)
    satellite = home.satellite
    openai_peer.enqueue(Text("Once upon a time"), Hang())
    openai_peer.enqueue(Text("It is noon."))
    first = run_satellite(home, "tell me a story")
    held = await openai_peer.wait_for_request(1)
    await satellite.wait_until(lambda: "Once upon" in satellite.streamed_text())

    second = run_satellite(home, "what time is it")
    await wait(held.disconnected.wait())  # the upstream stream was closed at once
    await cancelled(first)
    await finished(second)

    (end,) = satellite.events_of(PipelineEventType.INTENT_END)  # only run 2 ended
    assert spoken(end.data["intent_output"]) == "It is noon."
    # Same conversation. History holds what the user heard: HA 2025.4 speaks only
    # finished answers, so nothing of the cut story reached the satellite.
    messages = openai_peer.requests[1].messages
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "tell me a story"),
        ("user", "what time is it"),
    ]
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.id == end.data["intent_output"]["conversation_id"]
    assert home.sessions.knows(snapshot.id)
    assert snapshot.interrupted_rounds == 1
    assert snapshot.completed_rounds == 1
    assert home.closed == []  # a barge-in is no new conversation


async def test_new_run_hangs_up_a_run_ha_did_not_cancel(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A new run listening on the satellite ends a turn whose run HA forgot.

    HA 2025.4's esphome satellite can lose the record of its running pipeline
    (``_pipeline_task`` cleared by an older run's ``finally``; docs/benchmarks.md row
    10); the next run then cancels nothing. That state is set here directly. The
    new run's STT start (the satellite listens) cancels the old run, the stale
    model request is hung up while the user still speaks, and the new words are
    answered in the same conversation, as after HA's own cancel.
    """
    await async_setup_rtvoice(home, openai_peer)
    satellite = home.satellite
    openai_peer.enqueue(Text("Once upon a time"), Hang())
    openai_peer.enqueue(Text("It is noon."))
    first = run_satellite(home, "tell me a story")
    held = await wait(openai_peer.wait_for_request(1))
    satellite._pipeline_task = None  # noqa: SLF001 - what HA's race leaves behind

    async def speaking() -> AsyncIterator[bytes]:
        """Stream the new words: the user still speaks when the answer is cut."""
        yield bytes(1024)
        await held.disconnected.wait()
        yield bytes(1024)

    home.stt.texts.append("what time is it")
    second = home.hass.async_create_task(
        satellite.async_accept_pipeline_from_satellite(
            speaking(), start_stage=PipelineStage.STT, end_stage=PipelineStage.INTENT
        ),
        eager_start=False,
    )
    try:
        await wait(held.disconnected.wait())
    except TimeoutError:  # not hung up: end both runs, so HA can stop
        first.cancel()
        second.cancel()
        raise
    await cancelled(first)
    assert first.cancelled()
    await finished(second)

    (end,) = satellite.events_of(PipelineEventType.INTENT_END)  # only run 2 ended
    assert spoken(end.data["intent_output"]) == "It is noon."
    messages = openai_peer.requests[1].messages
    assert [(m["role"], m["content"]) for m in messages[1:]] == [
        ("user", "tell me a story"),
        ("user", "what time is it"),
    ]
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.id == end.data["intent_output"]["conversation_id"]
    assert (snapshot.interrupted_rounds, snapshot.completed_rounds) == (1, 1)
    assert home.closed == []  # a barge-in is no new conversation


async def test_tool_running_at_barge_in_completes(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A tool running when the new run starts completes; then the new words run."""
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    await async_setup_rtvoice(home, openai_peer)

    openai_peer.enqueue(Text("Hello."))
    await finished(run_satellite(home, "hello"))
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)

    openai_peer.enqueue(Text("Turning it on. "), ToolCall("call_slow", slow_tool, "{}"))
    openai_peer.enqueue(Text("It is noon."))
    first = run_satellite(home, "turn on the bed light")
    await wait(slow.started.wait())  # the tool runs inside HA now

    second = run_satellite(home, "what time is it")
    await cancelled(first)
    # The new input waits in the slot: both cuts (HA's cancel and the push) were
    # suppressed because a tool is running.
    snapshot = await home.wait_snapshot(
        lambda s: s.last_seq == 3 and s.suppressed_cancels == 2
    )
    assert snapshot.state == "tool"
    assert hass.states.get(BED_LIGHT).state == STATE_OFF
    assert len(openai_peer.requests) == 2

    slow.gate.set()
    await finished(second)
    assert hass.states.get(BED_LIGHT).state == STATE_ON
    assert spoken(intent_end(home)) == "It is noon."

    # The tool result is in the kernel's transcript, before the newest input.
    transcript = home.entry.runtime_data.kernel.transcript(snapshot.id)
    assert transcript is not None
    roles = [(m.role, m.content) for m in transcript]
    tool_index = next(i for i, m in enumerate(transcript) if m.role == "tool")
    assert transcript[tool_index].tool_call_id == "call_slow"
    assert json.loads(transcript[tool_index].content)["response_type"] == "action_done"
    assert roles.index(("user", "what time is it")) > tool_index
    # The model answered the newest words after the tool, knowing its result.
    last = openai_peer.requests[2].messages
    assert last[-1] == {"role": "user", "content": "what time is it"}
    assert any(m.get("tool_call_id") == "call_slow" for m in last)


@pytest.mark.parametrize("held_headers", [False, True])
async def test_new_run_as_the_request_arrives_hangs_it_up(
    home: Home, openai_peer: OpenAIPeer, held_headers: bool
) -> None:
    """Barge-in the instant the peer has the model request: it is hung up at once."""
    await async_setup_rtvoice(home, openai_peer)
    release = asyncio.Event()
    if held_headers:
        openai_peer.enqueue(WaitFor(release), Text("Late."))
    else:
        openai_peer.enqueue(Text("Once upon a time"), Hang())
    openai_peer.enqueue(Text("It is noon."))
    first = run_satellite(home, "tell me a story")
    held = await openai_peer.wait_for_request(1)
    second = run_satellite(home, "what time is it")
    await wait(held.disconnected.wait(), 5)
    await cancelled(first)
    await finished(second)
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.failed_rounds == 0
    release.set()
