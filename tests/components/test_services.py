"""The ``rtvoice.*`` actions against a real Home Assistant and the loopback model."""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser
import voluptuous as vol

from custom_components.rtvoice.const import DOMAIN
from custom_components.rtvoice.kernel import KernelError
from custom_components.rtvoice.services import (
    SERVICE_GET_QUESTION,
    SERVICE_GET_TRANSCRIPT,
    SERVICE_LIST_CONVERSATIONS,
    SERVICE_SEND,
    SERVICE_START_CONVERSATION,
    SERVICE_STOP_CONVERSATION,
    id_list,
)
from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import (
    HomeAssistantError,
    ServiceValidationError,
    Unauthorized,
    UnknownUser,
)
from homeassistant.helpers import icon, service
from tests.components.common import async_load_entry, openai_entry
from tests.components.pipeline.helpers import (
    QUIET_SATELLITE,
    SATELLITE,
    Home,
    async_unload,
)
from tests.peers.openai_server import OpenAIPeer, Text

ALL_SERVICES = (
    SERVICE_START_CONVERSATION,
    SERVICE_SEND,
    SERVICE_STOP_CONVERSATION,
    SERVICE_LIST_CONVERSATIONS,
    SERVICE_GET_TRANSCRIPT,
    SERVICE_GET_QUESTION,
)


async def call(
    hass: HomeAssistant,
    action: str,
    data: dict[str, Any] | None = None,
    context: Context | None = None,
) -> dict[str, Any]:
    """Call an rtvoice action and return its response."""
    response = await hass.services.async_call(
        DOMAIN,
        action,
        data or {},
        blocking=True,
        return_response=True,
        context=context,
    )
    assert isinstance(response, dict)
    return response


async def start(
    hass: HomeAssistant, satellite: str | None = SATELLITE, **data: Any
) -> str:
    """Start a conversation; its id."""
    if satellite is not None:
        data["satellite"] = satellite
    response = await call(hass, SERVICE_START_CONVERSATION, data)
    assert response is not None
    conversation_id = response["conversation_id"]
    assert isinstance(conversation_id, str)
    return conversation_id


async def send_answered(home: Home, conversation_id: str, text: str) -> None:
    """Send the first input (seq 1) by the action; wait until it was answered."""
    answered = home.wait_snapshot(
        lambda s: (
            s.id == conversation_id and s.completed_rounds == 1 and s.state == "idle"
        )
    )
    assert await call(
        home.hass, SERVICE_SEND, {"conversation_id": conversation_id, "text": text}
    ) == {"seq": 1}
    await answered


async def add_second_entry(
    hass: HomeAssistant, peer: OpenAIPeer, title: str = "Second voice"
) -> MockConfigEntry:
    """Load a second Realtime Voice entry against the same model."""
    return await async_load_entry(hass, openai_entry(hass, peer, title=title))


async def test_conversation_round_trip(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Start on a satellite, talk, read, stop: the whole control plane in order."""
    hass = home.hass
    conversation_id = await start(
        hass, system_prompt="You are the kitchen butler. Be brief."
    )

    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed is not None
    [item] = listed["conversations"]
    assert item["id"] == conversation_id
    assert item["satellite"] == SATELLITE
    assert item["state"] == "idle"
    assert item["config_entry_id"] == entry.entry_id
    assert item["stats"]["rounds"] == 0

    openai_peer.enqueue(Text("It is"), Text(" sunny."))
    await send_answered(home, conversation_id, "Weather?")
    request = openai_peer.requests[-1]
    assert request.messages[0]["role"] == "system"
    assert request.messages[0]["content"].startswith(
        "You are the kitchen butler. Be brief."
    )
    assert request.messages[-1] == {"role": "user", "content": "Weather?"}

    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed is not None
    assert listed["conversations"][0]["stats"]["rounds"] == 1

    page = await call(
        hass, SERVICE_GET_TRANSCRIPT, {"conversation_id": conversation_id}
    )
    assert page == {
        "conversation_id": conversation_id,
        "offset": 0,
        "total": 2,
        "transcript": "[user] Weather?\n[assistant] It is sunny.",
    }
    raw = await call(
        hass,
        SERVICE_GET_TRANSCRIPT,
        {"conversation_id": conversation_id, "format": "raw"},
    )
    assert raw is not None
    assert raw["transcript"] == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    second = await call(
        hass,
        SERVICE_GET_TRANSCRIPT,
        {"conversation_id": conversation_id, "offset": 1, "limit": 1},
    )
    assert second is not None
    assert (second["offset"], second["total"]) == (1, 2)
    assert second["transcript"] == "[assistant] It is sunny."
    beyond = await call(
        hass,
        SERVICE_GET_TRANSCRIPT,
        {"conversation_id": conversation_id, "offset": 5},
    )
    assert beyond is not None
    assert (beyond["total"], beyond["transcript"]) == (2, "")

    assert await call(
        hass, SERVICE_STOP_CONVERSATION, {"conversation_id": conversation_id}
    ) == {"messages": 2}
    [closed] = await home.wait_closed(1)
    assert closed["id"] == conversation_id
    assert closed["messages"] == 2

    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed == {"conversations": []}
    # The transcript stays readable after the hand-off.
    archived = await call(
        hass, SERVICE_GET_TRANSCRIPT, {"conversation_id": conversation_id}
    )
    assert archived is not None
    assert archived["total"] == 2

    # An ended conversation takes no input and cannot be stopped again.
    for action, data in (
        (SERVICE_SEND, {"conversation_id": conversation_id, "text": "Hello?"}),
        (SERVICE_STOP_CONVERSATION, {"conversation_id": conversation_id}),
    ):
        with pytest.raises(ServiceValidationError) as err:
            await call(hass, action, data)
        assert err.value.translation_key == "conversation_closed"
        assert conversation_id in str(err.value)
        assert "get transcript" in str(err.value)


async def test_start_without_satellite(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """A conversation without a satellite answers too; nothing is announced."""
    hass = home.hass
    conversation_id = await start(hass, satellite=None)
    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed is not None
    assert [(c["id"], c["satellite"]) for c in listed["conversations"]] == [
        (conversation_id, None)
    ]

    openai_peer.enqueue(Text("Forty-two."))
    await send_answered(home, conversation_id, "Answer?")
    page = await call(
        hass, SERVICE_GET_TRANSCRIPT, {"conversation_id": conversation_id}
    )
    assert page is not None
    assert page["transcript"] == "[user] Answer?\n[assistant] Forty-two."
    assert home.satellite.announcements == []
    assert home.quiet_satellite.announcements == []


async def test_start_on_a_busy_satellite_hands_the_old_one_off(
    home: Home, entry: MockConfigEntry
) -> None:
    """A second start on the same satellite closes the first conversation."""
    hass = home.hass
    first = await start(hass)
    second = await start(hass)
    assert first != second
    # Nothing was said in the first one: nothing to hand off or archive.
    assert entry.runtime_data.sessions.known_ids() == [second]
    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed is not None
    assert [c["id"] for c in listed["conversations"]] == [second]


async def test_unknown_satellite(home: Home, entry: MockConfigEntry) -> None:
    """An assist_satellite the entry does not know: the error lists the known ones."""
    with pytest.raises(ServiceValidationError) as err:
        await start(home.hass, satellite="assist_satellite.attic")
    assert err.value.translation_key == "unknown_satellite"
    message = str(err.value)
    assert "assist_satellite.attic" in message
    assert SATELLITE in message
    assert QUIET_SATELLITE in message


async def test_satellite_of_another_domain_is_a_schema_error(
    home: Home, entry: MockConfigEntry
) -> None:
    """Only assist_satellite entities are accepted."""
    with pytest.raises(vol.Invalid):
        await start(home.hass, satellite="light.bed_light")


@pytest.mark.parametrize(
    ("action", "data"),
    [
        (SERVICE_SEND, {"text": "Hello"}),
        (SERVICE_STOP_CONVERSATION, {}),
        (SERVICE_GET_TRANSCRIPT, {}),
    ],
)
async def test_unknown_conversation(
    home: Home, entry: MockConfigEntry, action: str, data: dict[str, Any]
) -> None:
    """An id nobody knows: the error names it and no other conversation."""
    known = await start(home.hass)
    with pytest.raises(ServiceValidationError) as err:
        await call(home.hass, action, {"conversation_id": "01NOPE", **data})
    assert err.value.translation_key == "unknown_conversation"
    assert err.value.translation_placeholders == {"conversation_id": "01NOPE"}
    assert known not in str(err.value)
    assert str(err.value) == (
        # HA drops the final full stop of translated messages.
        "There is no conversation 01NOPE. The list conversations action shows the"
        " running ones"
    )


@pytest.mark.parametrize(
    "data",
    [
        {"offset": -1},
        {"limit": 0},
        {"limit": 501},
        {"format": "xml"},
        {"offset": "many"},
    ],
)
async def test_transcript_page_bounds_are_validated(
    home: Home, entry: MockConfigEntry, data: dict[str, Any]
) -> None:
    """Offset, limit and format are checked by the schema."""
    conversation_id = await start(home.hass)
    with pytest.raises(vol.Invalid):
        await call(
            home.hass,
            SERVICE_GET_TRANSCRIPT,
            {"conversation_id": conversation_id, **data},
        )


@pytest.mark.parametrize(
    ("action", "data"),
    [
        (SERVICE_SEND, {}),
        (SERVICE_STOP_CONVERSATION, {"conversation_id": ""}),
    ],
)
async def test_required_fields(
    home: Home, entry: MockConfigEntry, action: str, data: dict[str, Any]
) -> None:
    """Empty or missing ids and a missing text are schema errors.

    Blank text is the action's own translated error (tests/components/test_first_use.py).
    """
    with pytest.raises(vol.Invalid):
        await call(home.hass, action, {"conversation_id": "x", **data})


async def test_not_loaded(home: Home, entry: MockConfigEntry) -> None:
    """The actions stay registered without an entry and say so."""
    await async_unload(home)
    assert entry.state is ConfigEntryState.NOT_LOADED
    for action, data in (
        (SERVICE_START_CONVERSATION, {"satellite": SATELLITE}),
        (SERVICE_SEND, {"conversation_id": "x", "text": "Hello"}),
        (SERVICE_STOP_CONVERSATION, {"conversation_id": "x"}),
        (SERVICE_LIST_CONVERSATIONS, {}),
        (SERVICE_GET_TRANSCRIPT, {"conversation_id": "x"}),
    ):
        assert home.hass.services.has_service(DOMAIN, action)
        with pytest.raises(ServiceValidationError) as err:
            await call(home.hass, action, data)
        assert err.value.translation_key == "not_loaded"
        assert str(err.value) == "No Realtime Voice entry is loaded"


async def test_several_entries(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """With two entries start needs config_entry_id; the rest follows the id."""
    hass = home.hass
    second = await add_second_entry(hass, openai_peer)

    with pytest.raises(ServiceValidationError) as err:
        await start(hass)
    assert err.value.translation_key == "entry_required"
    message = str(err.value)
    assert f"{entry.entry_id} (Realtime Voice)" in message
    assert f"{second.entry_id} (Second voice)" in message

    for wrong in ("no-such-entry", home.test_entry.entry_id):
        with pytest.raises(ServiceValidationError) as err:
            await start(hass, config_entry_id=wrong)
        assert err.value.translation_key == "entry_not_loaded"
        assert wrong in str(err.value)

    on_second = await start(hass, config_entry_id=second.entry_id)
    on_first = await start(
        hass, satellite=QUIET_SATELLITE, config_entry_id=entry.entry_id
    )
    assert on_second in second.runtime_data.sessions.known_ids()
    assert on_second not in entry.runtime_data.sessions.known_ids()
    assert on_first in entry.runtime_data.sessions.known_ids()

    listed = await call(hass, SERVICE_LIST_CONVERSATIONS)
    assert listed is not None
    assert {(c["id"], c["config_entry_id"]) for c in listed["conversations"]} == {
        (on_first, entry.entry_id),
        (on_second, second.entry_id),
    }

    # send and stop find the entry by the conversation id.
    assert await call(
        hass, SERVICE_SEND, {"conversation_id": on_second, "text": "Hi"}
    ) == {"seq": 1}
    assert second.runtime_data.kernel.stats(on_second).last_seq == 1
    await call(hass, SERVICE_STOP_CONVERSATION, {"conversation_id": on_second})
    assert on_second not in second.runtime_data.kernel.children()
    assert on_first in entry.runtime_data.kernel.children()

    # A config entry that is not loaded any more.
    assert await hass.config_entries.async_unload(second.entry_id)
    with pytest.raises(ServiceValidationError) as err:
        await start(hass, config_entry_id=second.entry_id)
    assert err.value.translation_key == "entry_not_loaded"
    # One entry left: config_entry_id is optional again.
    await start(hass, satellite=SATELLITE)


async def test_start_failure_is_reported(home: Home, entry: MockConfigEntry) -> None:
    """A kernel refusal while starting becomes a translated error."""
    with (
        patch.object(
            entry.runtime_data.sessions,
            "async_open",
            side_effect=KernelError("channel owned by the parent"),
        ),
        pytest.raises(HomeAssistantError) as err,
    ):
        await start(home.hass)
    assert not isinstance(err.value, ServiceValidationError)
    assert err.value.translation_key == "start_failed"
    assert str(err.value) == (
        "Could not start the conversation: channel owned by the parent"
    )


async def test_reading_needs_an_admin(
    home: Home,
    entry: MockConfigEntry,
    hass_admin_user: MockUser,
    hass_read_only_user: MockUser,
) -> None:
    """List and transcript reveal what was said: admins only; control is open."""
    hass = home.hass
    user = Context(user_id=hass_read_only_user.id)
    admin = Context(user_id=hass_admin_user.id)

    # Start, send and stop return ids and counters only: any user may call them
    # (on a satellite only with the right to control it: test_permissions.py).
    response = await call(hass, SERVICE_START_CONVERSATION, {}, context=user)
    assert response is not None
    conversation_id = response["conversation_id"]
    assert await call(
        hass,
        SERVICE_SEND,
        {"conversation_id": conversation_id, "text": "Hello"},
        context=user,
    ) == {"seq": 1}

    for action, data in (
        (SERVICE_LIST_CONVERSATIONS, {}),
        (SERVICE_GET_TRANSCRIPT, {"conversation_id": conversation_id}),
    ):
        with pytest.raises(Unauthorized):
            await call(hass, action, data, context=user)
        with pytest.raises(UnknownUser):
            await call(hass, action, data, context=Context(user_id="no-such-user"))
        assert await call(hass, action, data, context=admin) is not None

    assert (
        await call(
            hass,
            SERVICE_STOP_CONVERSATION,
            {"conversation_id": conversation_id},
            context=user,
        )
        is not None
    )


async def test_descriptions_and_icons(home: Home, entry: MockConfigEntry) -> None:
    """services.yaml, en.json and icons.json describe every action and field."""
    descriptions = await service.async_get_all_descriptions(home.hass)
    ours = descriptions[DOMAIN]
    assert set(ours) == set(ALL_SERVICES)
    for action in ALL_SERVICES:
        schema = home.hass.services.async_services_for_domain(DOMAIN)[action].schema
        assert isinstance(schema, vol.Schema)
        assert isinstance(schema.schema, dict)
        assert ours[action]["name"]
        assert ours[action]["description"]
        fields = ours[action].get("fields", {})
        assert set(fields) == {str(key) for key in schema.schema}
        for name, field in fields.items():
            assert field["name"], f"{action}.{name} has no name"
            assert field["description"], f"{action}.{name} has no description"
            assert "selector" in field
    icons = await icon.async_get_icons(home.hass, "services", [DOMAIN])
    assert set(icons[DOMAIN]) == set(ALL_SERVICES)
    entity_icons = await icon.async_get_icons(home.hass, "entity", [DOMAIN])
    assert set(entity_icons[DOMAIN]["sensor"]) == {
        "state",
        "rounds",
        "dropped_inputs",
        "suppressed_cancels",
    }


def test_id_list() -> None:
    """Ids in messages: "none", a plain list, or a cut list with the rest counted."""
    assert id_list([]) == "none"
    assert id_list(["a", "b"]) == "a, b"
    assert id_list(["a", "b", "c"], limit=2) == "a, b … (+1 more)"
