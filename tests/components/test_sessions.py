"""SessionManager: routing, hand-off, idle timers, carry-over and the control plane.

Everything runs on a real Home Assistant with the loopback OpenAI peer as the model
(see tests/components/pipeline/helpers.py for the few test-made parts).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
import json
import logging

import pytest
from pytest_homeassistant_custom_component.common import (
    MockConfigEntry,
    async_fire_time_changed,
    get_scheduled_timer_handles,
)

from custom_components.rtvoice.chat_feed import INTERRUPTED, tool_result_object
from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BRAIN,
    CONF_CARRY_OVER,
    CONF_CHUNK_TIMEOUT,
    CONF_FIRST_TOKEN_TIMEOUT,
    CONF_IDLE_TIMEOUT,
    CONF_LLM_HASS_API,
    DOMAIN,
    LLM_API_NONE,
    SIGNAL_SESSION_UPDATE,
    STATE_CLOSED,
)
from custom_components.rtvoice.errors import (
    UnknownConversationError,
    UnknownSatelliteError,
)
from custom_components.rtvoice.kernel import INTERRUPTED_MARKER, Capability, ChildStats
from custom_components.rtvoice.satellites.directory import channel_names
from homeassistant.components import conversation
from homeassistant.components.assist_pipeline.pipeline import (
    async_get_pipeline,
    async_update_pipeline,
)
from homeassistant.config_entries import ConfigEntryState
from homeassistant.const import STATE_ON
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.exceptions import ServiceValidationError
from homeassistant.helpers import (
    area_registry as ar,
    device_registry as dr,
    entity_registry as er,
    intent,
    llm,
)
from homeassistant.helpers.dispatcher import async_dispatcher_connect
from homeassistant.util import dt as dt_util
from tests.components.common import PEER_API_KEY
from tests.components.pipeline.helpers import (
    AGENT,
    BED_LIGHT,
    QUIET_SATELLITE,
    SATELLITE,
    GatedBedLightOn,
    Home,
    async_setup_rtvoice,
    async_unload,
    tool_named,
    wait,
)
from tests.peers.openai_server import Fail, Hang, OpenAIPeer, Text, ToolCall, WaitFor

IDLE = 60


async def converse(
    home: Home,
    text: str,
    conversation_id: str | None = None,
    device_id: str | None = None,
) -> conversation.ConversationResult:
    """One turn through HA's conversation component."""
    return await conversation.async_converse(
        home.hass,
        text,
        conversation_id,
        Context(),
        language="en",
        agent_id=AGENT,
        device_id=device_id,
    )


def speech(result: conversation.ConversationResult) -> str:
    """Return the plain speech of a result."""
    return str(result.response.speech["plain"]["speech"])


def idle_handles() -> list[asyncio.TimerHandle]:
    """Scheduled idle timers of sessions."""
    handles = []
    for handle in get_scheduled_timer_handles(asyncio.get_running_loop()):
        if handle.cancelled() or not handle._args:  # noqa: SLF001
            continue
        job = handle._args[-1]  # noqa: SLF001 - HassJob of async_call_later
        func = getattr(getattr(job, "target", None), "func", None)
        if getattr(func, "__name__", "") == "_idle_expired":
            handles.append(handle)
    return handles


def fire_idle(hass: HomeAssistant) -> None:
    """Let the idle timeout pass."""
    async_fire_time_changed(hass, dt_util.utcnow() + timedelta(seconds=IDLE + 1))


# ── routing and hand-off ───────────────────────────────────────────────────


async def test_new_conversation_on_a_satellite_closes_the_old_one(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A turn with an id the satellite's session does not know hands the old one off."""
    await async_setup_rtvoice(home, openai_peer)
    device_id = home.device_of(SATELLITE)
    first = await converse(home, "hello", device_id=device_id)
    again = await converse(home, "and again", first.conversation_id, device_id)
    assert again.conversation_id == first.conversation_id
    assert home.closed == []

    fresh = await converse(home, "new topic", None, device_id)
    assert fresh.conversation_id != first.conversation_id
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == first.conversation_id
    assert closed["messages"] == 4  # two user inputs, two answers
    assert closed["chars"] > 0
    assert closed["satellite"] == SATELLITE
    assert "text" not in closed  # the transcript is pulled, never pushed
    snapshot = home.sessions.stats(SATELLITE)
    assert snapshot is not None
    assert snapshot.id == fresh.conversation_id
    # The new child starts with an empty history.
    assert [m["content"] for m in openai_peer.requests[-1].messages[1:]] == [
        "new topic"
    ]
    # The closed transcript stays retrievable.
    page = home.control.transcript(first.conversation_id, 0, 10, "raw")
    assert page["total"] == 4
    assert first.conversation_id in home.sessions.known_ids()


async def test_sessions_are_per_satellite_and_per_conversation(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Two satellites talk at once; a conversation without device uses its id."""
    await async_setup_rtvoice(home, openai_peer)
    kitchen = await converse(home, "hi", device_id=home.device_of(SATELLITE))
    hall = await converse(home, "hi", device_id=home.device_of(QUIET_SATELLITE))
    browser = await converse(home, "hi")
    ids = {kitchen.conversation_id, hall.conversation_id, browser.conversation_id}
    assert len(ids) == 3
    listed = {c["id"]: c for c in home.control.list_conversations()}
    assert set(listed) == ids
    assert listed[kitchen.conversation_id]["satellite"] == SATELLITE
    assert listed[hall.conversation_id]["satellite"] == QUIET_SATELLITE
    assert listed[browser.conversation_id]["satellite"] is None
    assert listed[browser.conversation_id]["stats"]["completed_rounds"] == 1
    # A conversation without satellite holds an ad-hoc RT pair while it lives.
    channels = home.entry.runtime_data.channels
    adhoc = f"conversation.{browser.conversation_id}:in"
    assert channels.lookup(adhoc) is not None
    again = await converse(home, "more", browser.conversation_id)
    assert again.conversation_id == browser.conversation_id
    assert await home.control.async_stop(browser.conversation_id) == 4
    assert channels.lookup(adhoc) is None
    assert channels.lookup(f"conversation.{browser.conversation_id}:out") is None
    assert {c["id"] for c in home.control.list_conversations()} == {
        kitchen.conversation_id,
        hall.conversation_id,
    }


async def test_each_conversation_is_told_only_its_own_area(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """HA's API prompt is per device: satellites never read each other's area.

    The kitchen's turn is held inside a tool while the hall satellite prepares and
    answers a turn; the kitchen's next request (after the tool) is still told the
    kitchen. A conversation without a device is told no area at all.
    """
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    areas = ar.async_get(hass)
    devices = dr.async_get(hass)
    kitchen_device = home.device_of(SATELLITE)
    hall_device = home.device_of(QUIET_SATELLITE)
    devices.async_update_device(
        kitchen_device, area_id=areas.async_create("Scullery").id
    )
    devices.async_update_device(hall_device, area_id=areas.async_create("Foyer").id)
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello", device_id=kitchen_device)
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)

    openai_peer.enqueue(ToolCall("call_slow", slow_tool, "{}"))
    kitchen_turn = hass.async_create_task(
        converse(home, "bed light on", first.conversation_id, kitchen_device)
    )
    await wait(slow.started.wait())
    openai_peer.enqueue(Text("Hello hall."))
    assert speech(await converse(home, "hi", device_id=hall_device)) == "Hello hall."
    openai_peer.enqueue(Text("Hello browser."))
    assert speech(await converse(home, "hi")) == "Hello browser."
    openai_peer.enqueue(Text("The bed light is on."))
    slow.gate.set()
    assert speech(await wait(kitchen_turn)) == "The bed light is on."

    def system(number: int) -> str:
        return str(openai_peer.requests[number].messages[0]["content"])

    kitchen = [system(0), system(1), system(4)]
    hall, browser = system(2), system(3)
    for text in kitchen:
        assert "You are in area Scullery" in text
        assert "Foyer" not in text
    assert "You are in area Foyer" in hall
    assert "Scullery" not in hall
    assert "You are in area" not in browser
    # Each conversation's section goes with it.
    await home.control.async_stop(first.conversation_id)
    prompts = home.entry.runtime_data.prompts
    assert not any(
        "Scullery" in s.content and s.owner == "hass" for s in prompts.snapshot()
    )


async def test_a_close_waiting_for_a_tool_blocks_no_other_satellite(
    home: Home, openai_peer: OpenAIPeer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new conversation on the kitchen waits for the old one's tool; the hall talks.

    The kernel's close is wrapped only to learn when it began (the real close runs).
    """
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    await async_setup_rtvoice(home, openai_peer)
    kitchen_device = home.device_of(SATELLITE)
    first = await converse(home, "hello", device_id=kitchen_device)
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)
    openai_peer.enqueue(ToolCall("call_slow", slow_tool, "{}"))
    tool_turn = hass.async_create_task(
        converse(home, "bed light on", first.conversation_id, kitchen_device)
    )
    await wait(slow.started.wait())

    kernel = home.entry.runtime_data.kernel
    closing = asyncio.Event()
    real_close = kernel.close

    async def close(child_id: str) -> int:
        closing.set()
        return await real_close(child_id)

    monkeypatch.setattr(kernel, "close", close)
    new_topic = hass.async_create_task(
        converse(home, "new topic", None, kitchen_device)
    )
    await wait(closing.wait())
    openai_peer.enqueue(Text("Hello hall."))
    hall = await wait(converse(home, "hi", device_id=home.device_of(QUIET_SATELLITE)))
    assert speech(hall) == "Hello hall."
    # The kitchen's close is still waiting for its tool.
    assert first.conversation_id in kernel.children()
    assert not new_topic.done()

    openai_peer.enqueue(Text("Sure."))
    slow.gate.set()
    await wait(tool_turn)
    assert speech(await wait(new_topic)) == "Sure."
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == first.conversation_id
    assert hass.states.get(BED_LIGHT).state == STATE_ON


class GatedApi(llm.API):
    """A real LLM API whose instance is handed out only when the gate opens."""

    def __init__(self, hass: HomeAssistant) -> None:
        """Create the API with an open gate."""
        super().__init__(hass=hass, id="rtvoice_test_gated", name="Gated")
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def async_get_api_instance(
        self, llm_context: llm.LLMContext
    ) -> llm.APIInstance:
        """Wait for the gate, then return an instance without tools."""
        self.waiting.set()
        await self.gate.wait()
        return llm.APIInstance(
            api=self, api_prompt="Gated.", llm_context=llm_context, tools=[]
        )


async def test_cancel_while_preparing_is_a_barge_in(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """HA cancelling a turn before its push keeps the call together.

    A cancelled pipeline run never stores its chat session, so the next run comes
    with a fresh id: it continues the same conversation instead of closing it.
    """
    hass = home.hass
    api = GatedApi(hass)
    unregister = llm.async_register_api(hass, api)
    await async_setup_rtvoice(home, openai_peer, **{CONF_LLM_HASS_API: api.id})
    device_id = home.device_of(SATELLITE)
    first = await converse(home, "hello", device_id=device_id)

    api.gate.clear()
    api.waiting.clear()
    cut = hass.async_create_task(
        converse(home, "what is", first.conversation_id, device_id)
    )
    await wait(api.waiting.wait())
    cut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut
    api.gate.set()

    openai_peer.enqueue(Text("Noon."))
    again = await converse(home, "the time", None, device_id)
    assert speech(again) == "Noon."
    assert again.conversation_id == first.conversation_id
    assert home.closed == []
    unregister()


async def test_device_without_satellite_is_its_own_key(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A device that is no satellite still keeps one conversation."""
    await async_setup_rtvoice(home, openai_peer)
    light_device = home.device_of("light.kitchen_lights")
    first = await converse(home, "hi", device_id=light_device)
    second = await converse(home, "hi again", first.conversation_id, light_device)
    assert second.conversation_id == first.conversation_id
    fresh = await converse(home, "other", None, light_device)
    assert fresh.conversation_id != first.conversation_id
    (closed,) = await home.wait_closed(1)
    assert closed == {
        "id": first.conversation_id,
        "messages": 4,
        "chars": closed["chars"],
        "satellite": None,
    }


async def test_vanished_satellite_closes_its_conversation(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Removing a satellite entity hands its conversation off."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    result = await converse(home, "hello", device_id=home.device_of(SATELLITE))
    er.async_get(hass).async_remove(SATELLITE)
    await hass.async_block_till_done()
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == result.conversation_id
    assert home.sessions.stats(SATELLITE) is None
    channels = home.entry.runtime_data.channels
    assert all(channels.lookup(name) is None for name in channel_names(SATELLITE))


async def test_satellite_pairs_belong_to_the_session_manager(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Each satellite is an RT pair (no memory) while the entry is loaded."""
    await async_setup_rtvoice(home, openai_peer)
    channels = home.entry.runtime_data.channels
    for satellite in (SATELLITE, QUIET_SATELLITE):
        input_name, output_name = channel_names(satellite)
        pair = (channels.lookup(input_name), channels.lookup(output_name))
        assert all(c is not None for c in pair)
        assert all(Capability.RT in c.capabilities for c in pair if c)
        assert all(c.definition.no_memory for c in pair if c)
    openai_peer.enqueue(Text("Hello kitchen."))
    result = await converse(home, "hi", device_id=home.device_of(SATELLITE))
    assert speech(result) == "Hello kitchen."
    assert channels.lookup(channel_names(SATELLITE)[1]).owner == result.conversation_id
    await async_unload(home)
    assert channels.list() == []


# ── idle timer ─────────────────────────────────────────────────────────────


async def test_idle_timeout_closes_with_hand_off(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """One timer per session, reset on every turn; on expiry the session closes."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer, **{CONF_IDLE_TIMEOUT: IDLE})
    assert idle_handles() == []  # nothing runs while nobody talks
    device_id = home.device_of(SATELLITE)
    first = await converse(home, "hello", device_id=device_id)
    assert len(idle_handles()) == 1
    await converse(home, "again", first.conversation_id, device_id)
    assert len(idle_handles()) == 1  # reset, not added

    fire_idle(hass)
    await hass.async_block_till_done()
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == first.conversation_id
    assert closed["messages"] == 4
    assert home.sessions.stats(SATELLITE) is None
    assert home.control.list_conversations() == []
    assert idle_handles() == []
    with pytest.raises(UnknownConversationError, match="no live conversation"):
        home.control.send(first.conversation_id, "are you there?")

    # HA still knows the id; the closed transcript keeps it: a new id is used.
    again = await converse(home, "back again", first.conversation_id, device_id)
    assert again.conversation_id != first.conversation_id
    page = home.control.transcript(first.conversation_id, 0, 40, "raw")
    assert page["total"] == 4


async def test_idle_timer_waits_for_a_running_turn(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A turn that outlasts the idle timeout is not cut by it.

    The stream pauses longer than the idle timeout: the stream timeouts are set
    above it (the faked clock fires every timer that is due).
    """
    hass = home.hass
    await async_setup_rtvoice(
        home,
        openai_peer,
        **{
            CONF_IDLE_TIMEOUT: IDLE,
            CONF_FIRST_TOKEN_TIMEOUT: IDLE * 10,
            CONF_CHUNK_TIMEOUT: IDLE * 10,
        },
    )
    release = asyncio.Event()
    openai_peer.enqueue(Text("Still"), WaitFor(release), Text(" here."))
    turn = hass.async_create_task(converse(home, "slow one"))
    await openai_peer.wait_for_request(1)
    fire_idle(hass)
    assert home.closed == []
    assert len(idle_handles()) == 1  # re-armed
    release.set()
    result = await wait(turn)
    assert speech(result) == "Still here."
    assert home.control.list_conversations()[0]["id"] == result.conversation_id


# ── carry-over ─────────────────────────────────────────────────────────────


async def test_carry_over_of_an_input_superseded_in_the_slot(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Two inputs racing: the first never reaches the model and rides along."""
    await async_setup_rtvoice(home, openai_peer)
    control = home.control
    conversation_id = await control.async_start(None)
    first = control.send(conversation_id, "turn on the")
    second = control.send(conversation_id, "kitchen light")
    assert second == first + 1
    request = await openai_peer.wait_for_request(1)
    assert request.messages[-1] == {
        "role": "user",
        "content": "turn on the kitchen light",
    }
    snapshot = await home.wait_snapshot(lambda s: s.completed_rounds == 1)
    assert snapshot.dropped == 1  # superseded in the slot: counted as dropped
    assert len(openai_peer.requests) == 1


async def test_a_cut_turn_before_output_is_kept_once(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A turn cut after its model call started stays in history, not carried twice.

    Its input reached the model, so the kernel committed it (as an interrupted round);
    carrying it into the next input too would make the model read it twice.
    """
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello")
    conversation_id = first.conversation_id
    openai_peer.enqueue(Hang())
    cut = hass.async_create_task(converse(home, "what is the", conversation_id))
    held = await openai_peer.wait_for_request(2)
    openai_peer.enqueue(Text("Noon."))
    answered = await converse(home, "time", conversation_id)
    await held.disconnected.wait()
    # Interrupted before it said anything: says so, never blank speech.
    assert speech(await wait(cut)) == INTERRUPTED
    assert speech(answered) == "Noon."
    messages = openai_peer.requests[2].messages
    assert messages[-2:] == [
        {"role": "user", "content": "what is the"},
        {"role": "user", "content": "time"},
    ]


async def test_no_carry_over_after_output_or_when_off(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """An input that already produced output is not repeated; the option turns it off."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello")
    openai_peer.enqueue(Text("Let me"), Hang())
    cut = hass.async_create_task(converse(home, "tell a story", first.conversation_id))
    await openai_peer.wait_for_request(2)
    await home.wait_snapshot(lambda s: s.state == "speaking")
    await converse(home, "stop", first.conversation_id)
    assert speech(await wait(cut)) == "Let me"
    messages = openai_peer.requests[2].messages
    assert messages[-3:] == [
        {"role": "user", "content": "tell a story"},
        # A text caller saw the partial; the model is told where it was cut.
        {"role": "assistant", "content": "Let me" + INTERRUPTED_MARKER},
        {"role": "user", "content": "stop"},
    ]


async def test_carry_over_option_off(home: Home, openai_peer: OpenAIPeer) -> None:
    """With carry-over off the superseded input is simply dropped."""
    await async_setup_rtvoice(home, openai_peer, **{CONF_CARRY_OVER: False})
    control = home.control
    conversation_id = await control.async_start(None)
    control.send(conversation_id, "turn on the")
    control.send(conversation_id, "kitchen light")
    request = await openai_peer.wait_for_request(1)
    assert request.messages[-1] == {"role": "user", "content": "kitchen light"}


async def test_cancelled_caller_interrupts_the_round(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """HA cancelling the call cuts the round at once, even with no newer input."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Text("Let me think"), Hang())
    task = hass.async_create_task(converse(home, "a hard question"))
    held = await openai_peer.wait_for_request(1)
    await home.wait_snapshot(lambda s: s.state == "speaking")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait(held.disconnected.wait())
    snapshot = await home.wait_snapshot(lambda s: s.interrupted_rounds == 1)
    assert snapshot.state == "idle"
    assert snapshot.messages == 2  # the input and what was said before the cut


async def test_cancel_before_the_round_started(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """HA cancels the caller right inside its push: the round is cut at once.

    By the time the cancellation reaches the caller the round has started (its model
    call began), so the input is committed as an interrupted round and the next
    request shows both inputs. (An input still waiting in the slot is taken back
    instead: see the kernel's withdraw tests and the queued-behind-a-tool test.)
    """
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello")
    entry = home.entry
    task: asyncio.Task[conversation.ConversationResult] | None = None

    @callback
    def pushed(_satellite: str | None, snapshot: ChildStats) -> None:
        # Runs inside the push, before the caller awaits: cancel it right there.
        if snapshot.last_seq == 2 and task is not None and not task.done():
            task.cancel()

    unsub = async_dispatcher_connect(
        hass, SIGNAL_SESSION_UPDATE.format(entry.entry_id), pushed
    )
    task = hass.async_create_task(converse(home, "what is", first.conversation_id))
    with pytest.raises(asyncio.CancelledError):
        await task
    unsub()
    snapshot = await home.wait_snapshot(lambda s: s.interrupted_rounds == 1)
    assert snapshot.completed_rounds == 1
    openai_peer.enqueue(Text("Noon."))
    answered = await converse(home, "the time", first.conversation_id)
    assert speech(answered) == "Noon."
    assert openai_peer.requests[-1].messages[-2:] == [
        {"role": "user", "content": "what is"},
        {"role": "user", "content": "the time"},
    ]


async def test_cancel_after_the_answer_was_complete(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A cancel that arrives after the round finished cuts nothing."""
    hass = home.hass
    entry = await async_setup_rtvoice(home, openai_peer)
    task: asyncio.Task[conversation.ConversationResult] | None = None

    @callback
    def finished(_satellite: str | None, snapshot: ChildStats) -> None:
        # The round has settled its outcome; the caller has not resumed yet.
        if snapshot.completed_rounds == 1 and task is not None and not task.done():
            task.cancel()

    unsub = async_dispatcher_connect(
        hass, SIGNAL_SESSION_UPDATE.format(entry.entry_id), finished
    )
    openai_peer.enqueue(Text("All done."))
    task = hass.async_create_task(converse(home, "hello"))
    with pytest.raises(asyncio.CancelledError):
        await task
    unsub()
    (listed,) = home.control.list_conversations()
    assert listed["stats"]["interrupted_rounds"] == 0
    assert listed["stats"]["messages"] == 2
    page = home.control.transcript(listed["id"], 0, 40, "text")["transcript"]
    assert "[assistant] All done." in page


async def test_cancelled_input_waiting_behind_a_tool_is_never_answered_alone(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """HA cancels a turn queued behind a running tool: it is taken back, never run."""
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello")
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)
    conversation_id = first.conversation_id

    openai_peer.enqueue(ToolCall("call_slow", slow_tool, "{}"))
    tool_turn = hass.async_create_task(
        converse(home, "bed light on, slowly", conversation_id)
    )
    await wait(slow.started.wait())
    queued = hass.async_create_task(converse(home, "what is the", conversation_id))
    await home.wait_snapshot(lambda s: s.last_seq == 3 and s.pending)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    slow.gate.set()
    # The tool finished and its round ended (a newer input had arrived meanwhile);
    # the withdrawn input never got a round of its own.
    snapshot = await home.wait_snapshot(
        lambda s: s.interrupted_rounds == 1 and s.state == "idle"
    )
    assert snapshot.dropped == 1
    assert snapshot.rounds == 2
    assert hass.states.get(BED_LIGHT).state == STATE_ON
    # Cut after its tool before saying anything: it answers what the tool did
    # (never blank speech; issue 12 item 9).
    assert speech(await wait(tool_turn)) == "The bed light is on."
    asked = [r.messages[-1].get("content") for r in openai_peer.requests]
    assert "what is the" not in asked

    openai_peer.enqueue(Text("Noon."))
    answered = await converse(home, "time", conversation_id)
    assert speech(answered) == "Noon."
    assert openai_peer.requests[-1].messages[-1] == {
        "role": "user",
        "content": "what is the time",
    }


async def test_stop_during_a_tool_with_a_cancelled_caller(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Stopping waits for the running tool; a caller cancelled meanwhile is fine."""
    hass = home.hass
    slow = GatedBedLightOn()
    intent.async_register(hass, slow)
    await async_setup_rtvoice(home, openai_peer)
    first = await converse(home, "hello")
    slow_tool = tool_named(openai_peer.requests[0].tools, slow.intent_type)
    openai_peer.enqueue(ToolCall("call_slow", slow_tool, "{}"))
    turn = hass.async_create_task(
        converse(home, "bed light on, slowly", first.conversation_id)
    )
    await wait(slow.started.wait())
    stop = hass.async_create_task(home.control.async_stop(first.conversation_id))
    turn.cancel()
    with pytest.raises(asyncio.CancelledError):
        await turn
    assert not stop.done()
    slow.gate.set()
    assert await wait(stop) == 5  # hello, answer, input, tool call, tool result
    assert hass.states.get(BED_LIGHT).state == STATE_ON
    (closed,) = await home.wait_closed(1)
    assert closed["messages"] == 5


# ── the control plane ──────────────────────────────────────────────────────


async def test_start_send_and_announce_on_a_satellite(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A started conversation speaks its answers on the satellite and can be stopped."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    sessions = home.sessions
    control = home.control
    conversation_id = await control.async_start(SATELLITE, "You are the doorbell.")
    assert sessions.stats(SATELLITE).id == conversation_id
    openai_peer.enqueue(Text("Someone is "), Text("at the door."))
    assert control.send(conversation_id, "Tell the user about the visitor.") == 1
    await home.satellite.wait_until(lambda: bool(home.satellite.announcements))
    assert home.satellite.announcements == ["Someone is at the door."]
    system = openai_peer.requests[0].messages[0]["content"]
    assert system.startswith("You are the doorbell.")

    # The user answers through the satellite's pipeline: same conversation.
    openai_peer.enqueue(Text("I will open."))
    reply = await converse(home, "let them in", device_id=home.device_of(SATELLITE))
    assert reply.conversation_id == conversation_id
    assert speech(reply) == "I will open."
    assert home.satellite.announcements == ["Someone is at the door."]

    text = control.transcript(conversation_id, 0, 40, "text")["transcript"]
    assert "[user] Tell the user about the visitor." in text
    assert "[assistant] I will open." in text
    assert await control.async_stop(conversation_id) == 4
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == conversation_id
    assert closed["satellite"] == SATELLITE
    with pytest.raises(UnknownConversationError):
        await control.async_stop(conversation_id)
    await hass.async_block_till_done()


async def test_satellite_without_announce_keeps_the_answer_in_the_transcript(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """No announcement feature: the answer is only in the transcript."""
    await async_setup_rtvoice(home, openai_peer)
    control = home.control
    conversation_id = await control.async_start(QUIET_SATELLITE)
    openai_peer.enqueue(Text("Quiet answer."))
    control.send(conversation_id, "hello")
    await home.wait_snapshot(lambda s: s.completed_rounds == 1)
    assert home.quiet_satellite.announcements == []
    raw = control.transcript(conversation_id, 0, 40, "raw")
    assert raw["transcript"][-1]["content"] == "Quiet answer."


async def test_starting_again_on_a_satellite_replaces_the_conversation(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A second start on the same satellite closes the first (hand-off)."""
    await async_setup_rtvoice(home, openai_peer)
    control = home.control
    first = await control.async_start(QUIET_SATELLITE)
    control.send(first, "hello")
    await home.wait_snapshot(lambda s: s.completed_rounds == 1)
    second = await control.async_start(QUIET_SATELLITE)
    assert second != first
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == first
    assert [c["id"] for c in control.list_conversations()] == [second]


async def test_failed_announcement_is_only_logged(
    home: Home, openai_peer: OpenAIPeer, caplog: pytest.LogCaptureFixture
) -> None:
    """A satellite whose TTS engine is gone cannot announce: logged, nothing breaks."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    await async_update_pipeline(hass, async_get_pipeline(hass), tts_engine="tts.gone")
    control = home.control
    conversation_id = await control.async_start(SATELLITE)
    openai_peer.enqueue(Text("Unheard."))
    control.send(conversation_id, "hello")
    await home.wait_snapshot(lambda s: s.completed_rounds == 1)
    await hass.async_block_till_done()
    assert f"announce on {SATELLITE} failed: HomeAssistantError" in caplog.text
    assert "Unheard" not in caplog.text  # what was said never reaches the log
    assert home.satellite.announcements == []


async def test_unload_while_announcing(home: Home, openai_peer: OpenAIPeer) -> None:
    """An announcement still playing is cancelled by the unload."""
    await async_setup_rtvoice(home, openai_peer)
    home.satellite.announce_gate = asyncio.Event()  # never opens
    control = home.control
    conversation_id = await control.async_start(SATELLITE)
    openai_peer.enqueue(Text("A long announcement."))
    control.send(conversation_id, "hello")
    await home.satellite.wait_until(lambda: bool(home.satellite.announcements))
    await async_unload(home)
    assert _rtvoice_tasks() == []
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == conversation_id


async def test_conversation_id_parent_is_not_taken(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """The kernel's parent id cannot be a conversation id: a new one is used."""
    await async_setup_rtvoice(home, openai_peer)
    result = await converse(home, "hello", "parent")
    assert result.conversation_id != "parent"
    assert speech(result) == "ok"


def test_tool_result_shapes() -> None:
    """Tool results become JSON objects for HA's chat log, whatever their shape."""
    assert tool_result_object('{"a": 1}') == {"a": 1}
    assert tool_result_object("[1, 2]") == {"result": [1, 2]}
    assert tool_result_object("plain text") == {"result": "plain text"}


async def test_control_plane_errors(home: Home, openai_peer: OpenAIPeer) -> None:
    """Unknown satellites and conversations are clear errors (HA errors)."""
    await async_setup_rtvoice(home, openai_peer)
    sessions = home.sessions
    control = home.control
    with pytest.raises(UnknownSatelliteError, match=SATELLITE):
        await control.async_start("assist_satellite.nowhere")
    with pytest.raises(UnknownConversationError, match="nope"):
        control.send("nope", "hello")
    with pytest.raises(UnknownConversationError, match="nope"):
        control.transcript("nope", 0, 40, "text")
    assert sessions.stats(SATELLITE) is None
    assert sessions.known_ids() == []
    assert not sessions.knows("nope")


async def test_ask_parent_event(home: Home, openai_peer: OpenAIPeer) -> None:
    """The model's ask_parent reaches automations as an event."""
    await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(
        ToolCall("call_ask", "ask_parent", json.dumps({"text": "Is dinner ready?"}))
    )
    openai_peer.enqueue(Text("I asked."))
    result = await converse(
        home, "ask about dinner", device_id=home.device_of(SATELLITE)
    )
    assert speech(result) == "I asked."
    async with home.events_changed:
        await wait(home.events_changed.wait_for(lambda: bool(home.asked)))
    # Events are recorded: the event carries ids only, never the model's text
    # (issue 16); an automation (or an administrator) reads it with get_question.
    [asked] = home.asked
    assert asked == {
        "id": result.conversation_id,
        "question_id": asked["question_id"],
        "chars": len("Is dinner ready?"),
        "satellite": SATELLITE,
    }
    assert "dinner" not in json.dumps(asked)
    response = await home.hass.services.async_call(
        DOMAIN,
        "get_question",
        {"conversation_id": asked["id"], "question_id": asked["question_id"]},
        blocking=True,
        return_response=True,
    )
    assert response == {
        "conversation_id": asked["id"],
        "question_id": asked["question_id"],
        "text": "Is dinner ready?",
    }
    with pytest.raises(ServiceValidationError):
        await home.hass.services.async_call(
            DOMAIN,
            "get_question",
            {"conversation_id": asked["id"], "question_id": "nope"},
            blocking=True,
            return_response=True,
        )


async def test_no_tools_means_no_tools_at_all(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """With the LLM API set to none the request offers no tool, not even ask_parent."""
    await async_setup_rtvoice(home, openai_peer, **{CONF_LLM_HASS_API: LLM_API_NONE})
    openai_peer.enqueue(Text("Hi."))
    assert speech(await converse(home, "hello")) == "Hi."
    assert openai_peer.requests[0].tools is None


async def test_state_updates_for_sensors(home: Home, openai_peer: OpenAIPeer) -> None:
    """Every state change and the close are signalled with a snapshot."""
    hass = home.hass
    entry = await async_setup_rtvoice(home, openai_peer)
    seen: list[tuple[str | None, ChildStats]] = []

    @callback  # run in the loop, in order (a plain lambda runs in an executor)
    def record(satellite: str | None, snapshot: ChildStats) -> None:
        seen.append((satellite, snapshot))

    unsub = async_dispatcher_connect(
        hass, SIGNAL_SESSION_UPDATE.format(entry.entry_id), record
    )
    result = await converse(home, "hello", device_id=home.device_of(SATELLITE))
    await home.control.async_stop(result.conversation_id)
    await hass.async_block_till_done()
    unsub()
    states = [snap.state for _, snap in seen]
    assert {"thinking", "speaking", "idle"} <= set(states)
    assert states[-1] == STATE_CLOSED
    assert {sat for sat, _ in seen} == {SATELLITE}
    final = seen[-1][1]
    assert final.id == result.conversation_id
    assert final.messages == 2
    assert final.completed_rounds == 1
    assert final.first_delta_ms is not None


# ── lifecycle ──────────────────────────────────────────────────────────────


def _rtvoice_tasks() -> list[asyncio.Task]:
    return [
        t for t in asyncio.all_tasks() if "rtvoice" in t.get_name() and not t.done()
    ]


async def test_unload_leaves_nothing_behind(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Unloading hands every conversation off and leaves no task or timer."""
    await async_setup_rtvoice(home, openai_peer)
    result = await converse(home, "hello", device_id=home.device_of(SATELLITE))
    started = await home.control.async_start(None)
    assert _rtvoice_tasks()
    assert len(idle_handles()) == 2
    await async_unload(home)
    (closed,) = await home.wait_closed(1)  # the empty one hands nothing off
    assert closed["id"] == result.conversation_id
    assert started != result.conversation_id
    assert _rtvoice_tasks() == []
    assert idle_handles() == []
    assert home.entry.state is ConfigEntryState.NOT_LOADED


async def test_reload_with_a_conversation_in_flight(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Reloading cuts a running turn (it still returns) and starts afresh."""
    hass = home.hass
    entry = await async_setup_rtvoice(home, openai_peer)
    openai_peer.enqueue(Text("Half an"), Hang())
    turn = hass.async_create_task(
        converse(home, "long story", device_id=home.device_of(SATELLITE))
    )
    held = await openai_peer.wait_for_request(1)
    await home.wait_snapshot(lambda s: s.state == "speaking")
    assert await hass.config_entries.async_reload(entry.entry_id)
    await hass.async_block_till_done()
    result = await wait(turn)
    assert speech(result) == "Half an"
    await held.disconnected.wait()
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == result.conversation_id
    # The input and the partial answer: the turn returns it to the pipeline, which
    # speaks it, so the session acknowledges it as heard.
    assert closed["messages"] == 2

    openai_peer.enqueue(Text("Fresh start."))
    again = await converse(
        home, "hello", result.conversation_id, home.device_of(SATELLITE)
    )
    assert speech(again) == "Fresh start."
    assert [m["content"] for m in openai_peer.requests[-1].messages[1:]] == ["hello"]


async def test_home_assistant_stop_closes_conversations(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """Stopping HA hands every conversation off even without an unload."""
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    result = await converse(home, "hello")
    hass.bus.async_fire("homeassistant_stop")
    await hass.async_block_till_done()
    (closed,) = await home.wait_closed(1)
    assert closed["id"] == result.conversation_id
    assert _rtvoice_tasks() == []


# ── availability of the brain in the log ─────────────────────────────────


def rtvoice_records(
    caplog: pytest.LogCaptureFixture, level: int
) -> list[logging.LogRecord]:
    """Return the integration's records (kernel included) at exactly ``level``."""
    return [
        r
        for r in caplog.records
        if r.name.startswith("custom_components.rtvoice") and r.levelno == level
    ]


async def test_unavailable_model_is_logged_once_and_when_back(
    home: Home, openai_peer: OpenAIPeer, caplog: pytest.LogCaptureFixture
) -> None:
    """One warning when the endpoint fails, one info when it answers again.

    Failures in between are debug only; the log names the error type and the
    server's short message, never the user's words or the API key.
    """
    caplog.set_level(logging.DEBUG, logger="custom_components.rtvoice")
    await async_setup_rtvoice(home, openai_peer)
    device_id = home.device_of(SATELLITE)
    openai_peer.enqueue(Fail(500, "upstream exploded"))
    openai_peer.enqueue(Fail(503, f"still down for {PEER_API_KEY}"))

    first = await converse(home, "unlock the secret door", device_id=device_id)
    second = await converse(
        home, "the secret door please", first.conversation_id, device_id
    )

    assert first.response.error_code is intent.IntentResponseErrorCode.UNKNOWN
    assert second.response.error_code is intent.IntentResponseErrorCode.UNKNOWN
    (warning,) = rtvoice_records(caplog, logging.WARNING)
    assert warning.getMessage() == (
        "The language model of Realtime Voice is unavailable: "
        "ProviderConnectionError: the model server failed (HTTP 500): "
        "upstream exploded"
    )
    still = [
        r.getMessage()
        for r in rtvoice_records(caplog, logging.DEBUG)
        if "still unavailable" in r.getMessage()
    ]
    assert still == [
        (
            "The language model of Realtime Voice is still unavailable: "
            "ProviderConnectionError: the model server failed (HTTP 503): "
            "still down for ***"
        )
    ]
    assert not rtvoice_records(caplog, logging.INFO)

    openai_peer.enqueue(Text("I am back."))
    openai_peer.enqueue(Text("Still here."))
    back = await converse(home, "hello again", first.conversation_id, device_id)
    assert speech(back) == "I am back."
    await converse(home, "and again", first.conversation_id, device_id)
    (info,) = rtvoice_records(caplog, logging.INFO)
    assert info.getMessage() == "The language model of Realtime Voice is back"

    # A new outage is a new warning; a long message is cut short.
    openai_peer.enqueue(Fail(502, "x" * 500))
    await converse(home, "one more", first.conversation_id, device_id)
    warnings = [r.getMessage() for r in rtvoice_records(caplog, logging.WARNING)]
    assert len(warnings) == 2
    assert warnings[1].startswith(
        "The language model of Realtime Voice is unavailable: "
        "ProviderConnectionError: the model server failed (HTTP 502): xxx"
    )
    assert warnings[1].endswith("…")
    assert len(warnings[1]) < 300
    ours = "\n".join(
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("custom_components.rtvoice")
    )
    assert "Round of" in ours  # the kernel's debug record is there
    assert "secret door" not in ours
    assert PEER_API_KEY not in caplog.text


class FailingAgent(conversation.AbstractConversationAgent):
    """Stand-in for another integration's conversation agent that can break."""

    def __init__(self) -> None:
        """Answer until ``error`` is set."""
        self.error: Exception | None = None

    @property
    def supported_languages(self) -> str:
        """Any language."""
        return "*"

    async def async_process(
        self, user_input: conversation.ConversationInput
    ) -> conversation.ConversationResult:
        """Raise ``error``, else answer."""
        if self.error is not None:
            raise self.error
        response = intent.IntentResponse(language=user_input.language)
        response.async_set_speech("Here I am.")
        return conversation.ConversationResult(
            response=response, conversation_id=user_input.conversation_id
        )


async def test_unavailable_agent_is_logged_once_and_when_back(
    home: Home, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for an entry that delegates to another conversation agent."""
    caplog.set_level(logging.DEBUG, logger="custom_components.rtvoice")
    hass = home.hass
    agent = FailingAgent()
    owner = MockConfigEntry(domain="test_failing_agent")
    owner.add_to_hass(hass)
    conversation.async_set_agent(hass, owner, agent)
    await async_setup_rtvoice(
        home, None, data={CONF_BRAIN: BRAIN_HA_AGENT, CONF_AGENT_ID: owner.entry_id}
    )
    agent.error = RuntimeError("agent crashed")

    first = await converse(home, "hello")
    await converse(home, "hello?", first.conversation_id)
    (warning,) = rtvoice_records(caplog, logging.WARNING)
    assert warning.getMessage() == (
        "The conversation agent of Realtime Voice is unavailable: ProviderError: "
        f"conversation agent {owner.entry_id} failed (RuntimeError: agent crashed)"
    )

    agent.error = None
    assert speech(await converse(home, "there?", first.conversation_id)) == (
        "Here I am."
    )
    (info,) = rtvoice_records(caplog, logging.INFO)
    assert info.getMessage() == "The conversation agent of Realtime Voice is back"


@pytest.mark.parametrize("second_run", [False, True])
@pytest.mark.parametrize("satellite", [False, True])
@pytest.mark.parametrize(
    "cut_at", ["request_sent", "request_arrived", "arrived_streaming", "headers"]
)
async def test_cancelled_caller_hangs_up_the_model_request(
    home: Home,
    openai_peer: OpenAIPeer,
    cut_at: str,
    second_run: bool,
    satellite: bool,
) -> None:
    """HA cancels the caller around the model request: the request is hung up.

    Benchmark row 10's race: a barge-in the instant the peer has the request (no
    response headers yet) left it open until the read timeout, then apologised.
    Cut before it arrives, right as it arrives, and once the answer streams; alone
    or with the new run's words pushed right after (a second cancel of the round).
    """
    hass = home.hass
    await async_setup_rtvoice(home, openai_peer)
    device_id = home.device_of(SATELLITE) if satellite else None
    first = await converse(home, "hello", device_id=device_id)
    cid = first.conversation_id
    release = asyncio.Event()
    if cut_at in ("headers", "arrived_streaming"):
        openai_peer.enqueue(Text("Let me"), WaitFor(release), Text(" see."))
    else:
        openai_peer.enqueue(WaitFor(release), Text("Late."))
    openai_peer.enqueue(Text("Fresh."))
    task = hass.async_create_task(converse(home, "a hard question", cid, device_id))
    if cut_at == "request_sent":
        await home.wait_snapshot(lambda s: s.state == "thinking")
    elif cut_at in ("request_arrived", "arrived_streaming"):
        await openai_peer.wait_for_request(2)
    else:
        await home.wait_snapshot(lambda s: s.state == "speaking")
    task.cancel()
    if cut_at == "request_sent":
        # It may never reach the peer: the next request must not get its script.
        release.set()
    again = (
        hass.async_create_task(converse(home, "never mind", cid, device_id))
        if second_run
        else None
    )
    with pytest.raises(asyncio.CancelledError):
        await task
    if again is not None:
        await wait(again)
    snapshot = await home.wait_snapshot(
        lambda s: s.state == "idle" and s.rounds == (3 if second_run else 2)
    )
    if cut_at != "request_sent":
        await wait(openai_peer.requests[1].disconnected.wait(), 5)
    assert snapshot.interrupted_rounds + snapshot.superseded_rounds == 1
    assert snapshot.failed_rounds == 0
    release.set()
