"""The "Realtime Voice control" LLM API, used the way an HA conversation agent does."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser

from custom_components.rtvoice import compat
from custom_components.rtvoice.const import CONF_LLM_HASS_API, LLM_API_NONE
from custom_components.rtvoice.control_api import (
    API_NAME,
    TOOL_CHILDREN,
    TOOL_TRANSCRIPT,
    api_id,
)
from custom_components.rtvoice.kernel import KernelError
from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import (
    area_registry as ar,
    device_registry as dr,
    entity_registry as er,
    llm,
)
from homeassistant.setup import async_setup_component
from tests.components.common import PEER_API_KEY, PEER_MODEL, openai_entry
from tests.components.pipeline.helpers import (
    QUIET_SATELLITE,
    SATELLITE,
    Home,
    async_unload,
    tool_named,
)
from tests.peers.openai_server import OpenAIPeer, Text, ToolCall


def llm_context(hass: HomeAssistant, user_id: str | None = None) -> llm.LLMContext:
    """Build the LLM context a conversation agent would pass (English)."""
    turn = SimpleNamespace(
        context=Context(user_id=user_id), language="en", device_id=None, text=None
    )
    return compat.llm_context(hass, turn, "conversation")


class Agent:
    """Calls the API's tools like an LLM conversation agent does."""

    def __init__(self, instance: llm.APIInstance) -> None:
        """Wrap an API instance."""
        self.instance = instance

    async def children(self, **args: Any) -> dict[str, Any]:
        """Call rt_children."""
        return await self.instance.async_call_tool(
            llm.ToolInput(tool_name=TOOL_CHILDREN, tool_args=args)
        )

    async def transcript(self, **args: Any) -> dict[str, Any]:
        """Call rt_transcript."""
        return await self.instance.async_call_tool(
            llm.ToolInput(tool_name=TOOL_TRANSCRIPT, tool_args=args)
        )


ADMIN = "admin"  # agent_for: an administrator's agent (created on first use)


async def user_in(hass: HomeAssistant, group: str) -> str:
    """Return the id of a (new) user in ``group`` (system-admin, system-users …)."""
    user = await hass.auth.async_create_user(f"a {group}", group_ids=[group])
    user.is_owner = False  # the first user HA creates is its owner (an admin)
    return user.id


async def agent_for(
    hass: HomeAssistant, entry: MockConfigEntry, user_id: str | None = ADMIN
) -> Agent:
    """Get the entry's control API the way an agent does and wrap it.

    By default the agent acts for an administrator: without a user the control
    API is not privileged (test_permissions.py).
    """
    if user_id == ADMIN:
        user_id = await user_in(hass, "system-admin")
    instance = await llm.async_get_api(hass, api_id(entry), llm_context(hass, user_id))
    return Agent(instance)


async def test_registered_per_entry_and_removed_on_unload(
    home: Home, entry: MockConfigEntry
) -> None:
    """The entry registers its API; unloading removes it."""
    apis = {api.id: api for api in llm.async_get_apis(home.hass)}
    assert api_id(entry) == f"rtvoice_control_{entry.entry_id}"
    assert apis[api_id(entry)].name == API_NAME

    agent = await agent_for(home.hass, entry)
    assert [tool.name for tool in agent.instance.tools] == [
        TOOL_CHILDREN,
        TOOL_TRANSCRIPT,
    ]
    prompt = agent.instance.api_prompt
    assert "interrupts" in prompt
    assert "handed off" in prompt
    assert TOOL_TRANSCRIPT in prompt
    assert f"{SATELLITE} (Kitchen satellite)" in prompt
    assert QUIET_SATELLITE in prompt

    await async_unload(home)
    assert api_id(entry) not in {api.id for api in llm.async_get_apis(home.hass)}
    # An instance an agent still holds answers, but only with an error.
    assert await agent.children(action="list") == {
        "error": "Realtime Voice is not loaded; try again later."
    }
    assert "error" in await agent.transcript(id="x")


async def test_agent_drives_a_child(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Create on a satellite, send (the child answers), list, stop, page."""
    hass = home.hass
    agent = await agent_for(hass, entry)

    assert await agent.children(action="list") == {
        "conversations": [],
        "result": "No realtime conversation is running.",
    }
    created = await agent.children(
        action="create", satellite=SATELLITE, system_prompt="You are a kitchen aid."
    )
    child = created["id"]
    assert isinstance(child, str)
    assert created["satellite"] == SATELLITE
    assert "interrupts" in str(created["result"])

    openai_peer.enqueue(Text("Pasta"), Text(" tonight."))
    answered = home.wait_snapshot(
        lambda s: s.id == child and s.completed_rounds == 1 and s.state == "idle"
    )
    sent = await agent.children(action="send", id=child, text="What is for dinner?")
    assert sent["seq"] == 1
    assert "interrupts" in str(sent["result"])
    await answered
    request = openai_peer.requests[-1]
    assert request.messages[0]["content"].startswith("You are a kitchen aid.")
    assert request.messages[-1] == {"role": "user", "content": "What is for dinner?"}

    listed = await agent.children(action="list")
    conversations = listed["conversations"]
    assert isinstance(conversations, list)
    [item] = conversations
    assert isinstance(item, dict)
    assert (item["id"], item["satellite"]) == (child, SATELLITE)
    assert item["stats"]["rounds"] == 1

    page = await agent.transcript(id=child)
    assert page == {
        "conversation_id": child,
        "offset": 0,
        "total": 2,
        "transcript": "[user] What is for dinner?\n[assistant] Pasta tonight.",
    }
    first = await agent.transcript(id=child, limit=1, format="raw")
    assert first["transcript"] == [{"role": "user", "content": "What is for dinner?"}]
    assert first["next_offset"] == 1
    # Numbers as a model may send them: strings and floats.
    second = await agent.transcript(id=child, offset="1", limit=1.0)
    assert second["transcript"] == "[assistant] Pasta tonight."
    assert "next_offset" not in second

    stopped = await agent.children(action="stop", id=child)
    assert stopped["messages"] == 2
    assert f"{TOOL_TRANSCRIPT}(id={child}" in str(stopped["result"])
    [closed] = await home.wait_closed(1)
    assert closed["id"] == child

    # After the hand-off: readable, but no longer running.
    archived = await agent.transcript(id=child, offset=1)
    assert archived["transcript"] == "[assistant] Pasta tonight."
    for args in (
        {"action": "send", "id": child, "text": "Hi"},
        {"action": "stop", "id": child},
    ):
        result = await agent.children(**args)
        assert "has ended" in str(result["error"])
        assert TOOL_TRANSCRIPT in str(result["error"])
    assert (await agent.children(action="list"))["conversations"] == []


async def test_create_errors_list_the_satellites(
    home: Home, entry: MockConfigEntry
) -> None:
    """A create the model got wrong says which satellites exist."""
    agent = await agent_for(home.hass, entry)
    missing = await agent.children(action="create")
    assert "create needs satellite" in str(missing["error"])
    assert f"{SATELLITE} (Kitchen satellite)" in str(missing["error"])
    assert f"{QUIET_SATELLITE} (Hall satellite)" in str(missing["error"])

    unknown = await agent.children(action="create", satellite="assist_satellite.attic")
    assert "unknown satellite 'assist_satellite.attic'" in str(unknown["error"])
    assert SATELLITE in str(unknown["error"])
    assert entry.runtime_data.control.list_conversations() == []

    # Where a satellite is, is named too.
    kitchen = ar.async_get(home.hass).async_create("Kitchen")
    dr.async_get(home.hass).async_update_device(
        home.device_of(SATELLITE), area_id=kitchen.id
    )
    await home.hass.async_block_till_done()
    missing = await agent.children(action="create")
    assert f"{SATELLITE} (Kitchen satellite, area Kitchen)" in str(missing["error"])

    # A satellite's name works as well as its entity id.
    by_name = await agent.children(action="create", satellite="hall SATELLITE")
    assert by_name["satellite"] == QUIET_SATELLITE


async def test_no_satellites(hass: HomeAssistant, openai_peer: OpenAIPeer) -> None:
    """Without any satellite, the prompt and create say so."""
    assert await async_setup_component(hass, "homeassistant", {})
    entry = openai_entry(hass, openai_peer, options={CONF_LLM_HASS_API: LLM_API_NONE})
    assert await hass.config_entries.async_setup(entry.entry_id)
    await hass.async_block_till_done()
    try:
        agent = await agent_for(hass, entry)
        assert "There is no voice satellite" in agent.instance.api_prompt
        result = await agent.children(action="create", satellite="assist_satellite.x")
        assert "There is no voice satellite" in str(result["error"])
    finally:
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_bad_arguments_and_unknown_ids(
    home: Home, entry: MockConfigEntry
) -> None:
    """Wrong arguments and unknown ids are results the model can act on."""
    agent = await agent_for(home.hass, entry)
    live = (await agent.children(action="create", satellite=SATELLITE))["id"]

    bad_action = await agent.children(action="dance")
    assert str(bad_action["error"]).startswith("invalid arguments for rt_children")
    assert "action" in str(bad_action["error"])
    assert "error" in await agent.children(action="send", id=live)
    assert (await agent.children(action="send", text="Hi")) == {
        "error": "send needs id and a non-blank text."
    }
    assert (await agent.children(action="stop")) == {"error": "stop needs id."}
    # Unknown arguments are ignored (models add some), unknown ids are explained.
    for args in (
        {"action": "send", "id": "01NOPE", "text": "Hi", "mood": "cheerful"},
        {"action": "stop", "id": "01NOPE"},
    ):
        result = await agent.children(**args)
        assert "no realtime conversation '01NOPE'." in str(result["error"])
        assert live not in str(result["error"])
    unknown = await agent.transcript(id="01NOPE")
    assert "no realtime conversation '01NOPE'." in str(unknown["error"])
    assert live not in str(unknown["error"])

    for args in (
        {"id": live, "limit": 0},
        {"id": live, "limit": 501},
        {"id": live, "offset": -1},
        {"id": live, "format": "xml"},
        {},
    ):
        result = await agent.transcript(**args)
        assert str(result["error"]).startswith("invalid arguments for rt_transcript")

    # An empty conversation has an empty first page; past the end is an error.
    assert (await agent.transcript(id=live))["total"] == 0
    await agent.children(action="send", id=live, text="Hi")
    await home.wait_snapshot(lambda s: s.id == live and s.completed_rounds == 1)
    past = await agent.transcript(id=live, offset=2)
    assert past == {
        "error": f"offset 2 is past the end: conversation {live} has 2 messages"
        " (offsets 0 to 1)."
    }


async def test_start_failure_is_a_result(
    home: Home, entry: MockConfigEntry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel refusal while creating is reported with the satellites."""

    async def refuse(*_args: Any, **_kwargs: Any) -> str:
        raise KernelError("channel owned by the parent")

    monkeypatch.setattr(entry.runtime_data.sessions, "async_open", refuse)
    agent = await agent_for(home.hass, entry)
    result = await agent.children(action="create", satellite=SATELLITE)
    assert str(result["error"]).startswith(
        "could not create the conversation: channel owned by the parent."
    )
    assert SATELLITE in str(result["error"])


async def test_reading_needs_an_admin(
    home: Home,
    entry: MockConfigEntry,
    hass_admin_user: MockUser,
    hass_read_only_user: MockUser,
) -> None:
    """A known non-admin user may control, but not list or read conversations."""
    hass = home.hass
    # A user who may control the satellite (not a read-only one) may start there.
    user = await agent_for(hass, entry, await user_in(hass, "system-users"))
    child = (await user.children(action="create", satellite=SATELLITE))["id"]
    assert (await user.children(action="send", id=child, text="Hi"))["seq"] == 1
    for result in (
        await user.children(action="list"),
        await user.transcript(id=child),
    ):
        assert "Only an administrator" in str(result["error"])
    ghost = await agent_for(hass, entry, "no-such-user")
    assert "error" in await ghost.children(action="list")

    admin = await agent_for(hass, entry, hass_admin_user.id)
    assert "conversations" in await admin.children(action="list")
    assert "transcript" in await admin.transcript(id=child)

    # Another conversation (the admin's) is not the user's to send to or stop,
    # and the refusal names no id (issue 12 item 5).
    theirs = (await admin.children(action="create", satellite=QUIET_SATELLITE))["id"]
    for args in (
        {"action": "send", "id": theirs, "text": "Hi"},
        {"action": "stop", "id": theirs},
    ):
        refused = str((await user.children(**args))["error"])
        assert "only send to or stop conversations they started" in refused
        assert theirs not in refused and child not in refused
    assert (await user.children(action="stop", id=child))["id"] == child


async def test_one_api_per_entry(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Each entry has its own API that controls only its own conversations."""
    hass = home.hass
    second = openai_entry(hass, openai_peer, title="Upstairs")
    assert await hass.config_entries.async_setup(second.entry_id)
    await hass.async_block_till_done()
    try:
        apis = {api.id: api.name for api in llm.async_get_apis(hass)}
        assert apis[api_id(entry)] == API_NAME
        assert apis[api_id(second)] == f"{API_NAME} (Upstairs)"

        upstairs = await agent_for(hass, second)
        child = (await upstairs.children(action="create", satellite=SATELLITE))["id"]
        assert child in second.runtime_data.sessions.known_ids()
        assert entry.runtime_data.sessions.known_ids() == []
        downstairs = await agent_for(hass, entry)
        assert "no realtime conversation" in str(
            (await downstairs.children(action="stop", id=child))["error"]
        )
    finally:
        assert await hass.config_entries.async_unload(second.entry_id)
    assert second.state is ConfigEntryState.NOT_LOADED
    assert api_id(second) not in {api.id for api in llm.async_get_apis(hass)}
    assert api_id(entry) in {api.id for api in llm.async_get_apis(hass)}


async def test_a_realtime_voice_agent_as_the_parent(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """A real LLM conversation agent whose tools are the control API runs a child.

    The parent is a second Realtime Voice entry whose "Control Home Assistant" API is
    the first entry's control API; its model is a second loopback server, so the
    scripts of parent and child never mix.
    """
    hass = home.hass
    async with OpenAIPeer(api_key=PEER_API_KEY, models=[PEER_MODEL]) as parent_peer:
        parent = openai_entry(
            hass,
            parent_peer,
            title="Parent",
            options={CONF_LLM_HASS_API: api_id(entry)},
        )
        assert await hass.config_entries.async_setup(parent.entry_id)
        await hass.async_block_till_done()
        [parent_agent] = [
            e.entity_id
            for e in er.async_entries_for_config_entry(
                er.async_get(hass), parent.entry_id
            )
            if e.domain == "conversation"
        ]
        try:
            await _parent_conversation(home, parent_agent, parent_peer, openai_peer)
        finally:
            assert await hass.config_entries.async_unload(parent.entry_id)


async def _converse(
    hass: HomeAssistant, user_id: str, agent_id: str, text: str, cid: str | None
) -> str:
    result = await conversation.async_converse(
        hass, text, cid, Context(user_id=user_id), language="en", agent_id=agent_id
    )
    assert result.conversation_id is not None
    return result.conversation_id


def _tool_results(request_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in request_messages if m["role"] == "tool"]


async def _parent_conversation(
    home: Home, parent_agent: str, parent_peer: OpenAIPeer, child_peer: OpenAIPeer
) -> None:
    hass = home.hass
    admin = await user_in(hass, "system-admin")  # without a user: not privileged
    # Turn 1: the parent's model creates a child on the kitchen satellite.
    parent_peer.enqueue(
        ToolCall(
            "call_1",
            "rt_children",
            json.dumps({"action": "create", "satellite": SATELLITE}),
        )
    )
    parent_peer.enqueue(Text("I started a chat in the kitchen."))
    cid = await _converse(
        hass, admin, parent_agent, "Start a chat in the kitchen", None
    )
    first = parent_peer.requests[0]
    assert tool_named(first.tools, TOOL_CHILDREN) == TOOL_CHILDREN
    assert tool_named(first.tools, TOOL_TRANSCRIPT) == TOOL_TRANSCRIPT
    assert "interrupts" in first.messages[0]["content"]  # the API prompt
    [created] = _tool_results(parent_peer.requests[1].messages)
    child = created["id"]
    assert [c["id"] for c in home.control.list_conversations()] == [child]

    # Turn 2: it sends the child text; the child answers through its own model.
    child_peer.enqueue(Text("Hello from the kitchen."))
    answered = home.wait_snapshot(
        lambda s: s.id == child and s.completed_rounds == 1 and s.state == "idle"
    )
    parent_peer.enqueue(
        ToolCall(
            "call_2",
            "rt_children",
            json.dumps({"action": "send", "id": child, "text": "Say hello"}),
        )
    )
    parent_peer.enqueue(Text("Done."))
    await _converse(hass, admin, parent_agent, "Say hello there", cid)
    await answered
    assert child_peer.requests[-1].messages[-1] == {
        "role": "user",
        "content": "Say hello",
    }

    # Turn 3: it stops the child and reads the transcript it was handed.
    parent_peer.enqueue(
        ToolCall("call_3", "rt_children", json.dumps({"action": "stop", "id": child})),
        ToolCall("call_4", "rt_transcript", json.dumps({"id": child})),
    )
    parent_peer.enqueue(Text("The kitchen said hello."))
    await _converse(hass, admin, parent_agent, "Stop it and tell me what it said", cid)
    stopped, page = _tool_results(parent_peer.requests[-1].messages)[-2:]
    assert stopped["messages"] == 2
    assert page["transcript"] == "[user] Say hello\n[assistant] Hello from the kitchen."
    assert home.control.list_conversations() == []
