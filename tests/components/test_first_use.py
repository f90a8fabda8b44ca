"""What a new user hits first (issue 12): bad input, permissions, honest answers.

Everything runs against a real Home Assistant with the loopback model; the users are
real HA users (``hass_admin_user`` / ``hass_read_only_user``, a non-admin).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import MockConfigEntry, MockUser
from pytest_homeassistant_custom_component.typing import WebSocketGenerator

from custom_components.rtvoice.chat_feed import (
    APOLOGY,
    INTERRUPTED,
    NOT_UNDERSTOOD,
    interrupted_speech,
)
from custom_components.rtvoice.const import (
    BRAIN_HA_AGENT,
    CONF_AGENT_ID,
    CONF_BRAIN,
    CONF_LLM_HASS_API,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_AGENT_ID,
    DEFAULT_LLM_HASS_API,
    DOMAIN,
    LLM_API_NONE,
)
from custom_components.rtvoice.control_api import api_id
from custom_components.rtvoice.services import (
    SERVICE_GET_TRANSCRIPT,
    SERVICE_LIST_CONVERSATIONS,
    SERVICE_SEND,
    SERVICE_START_CONVERSATION,
    SERVICE_STOP_CONVERSATION,
)
from homeassistant.components import conversation
from homeassistant.const import STATE_ON
from homeassistant.core import Context
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import ServiceValidationError, Unauthorized
from homeassistant.helpers import intent, llm
from homeassistant.helpers.selector import SelectSelector
from homeassistant.util.ulid import ulid_now
from tests.components.common import open_settings
from tests.components.pipeline.helpers import (
    AGENT,
    BED_LIGHT,
    Home,
    async_setup_rtvoice,
)
from tests.components.test_config_flow import start_brain
from tests.components.test_services import call, send_answered, start
from tests.peers.openai_server import Hang, OpenAIPeer, Text, WaitFor

TRANSLATIONS = (
    Path(__file__).parents[2]
    / "custom_components"
    / DOMAIN
    / "translations"
    / "en.json"
)


def noisy_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """Return the records above debug from any logger (HA logs our tracebacks too)."""
    return [r for r in caplog.records if r.levelno > logging.DEBUG]


# ── 1: blank input ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
@pytest.mark.parametrize("brain", ["openai", BRAIN_HA_AGENT])
async def test_blank_input_is_not_understood(
    home: Home,
    openai_peer: OpenAIPeer,
    caplog: pytest.LogCaptureFixture,
    text: str,
    brain: str,
) -> None:
    """Blank text gets HA's own "could not understand" answer and starts nothing."""
    hass = home.hass
    if brain == BRAIN_HA_AGENT:
        await async_setup_rtvoice(home, None, data={CONF_BRAIN: BRAIN_HA_AGENT})
    else:
        await async_setup_rtvoice(home, openai_peer)
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    result = await conversation.async_converse(
        hass, text, None, Context(), language="en", agent_id=AGENT
    )
    response = result.response
    assert response.response_type is intent.IntentResponseType.ERROR
    assert response.error_code is intent.IntentResponseErrorCode.NO_INTENT_MATCH
    assert response.speech["plain"]["speech"] == NOT_UNDERSTOOD
    assert home.control.list_conversations() == []
    assert home.control.known_ids() == []
    assert openai_peer.requests == []
    assert noisy_records(caplog) == []


# ── 2: distinct translated errors of the actions ─────────────────────────────────


async def action_error(
    hass: Any, action: str, data: dict[str, Any], context: Context | None = None
) -> ServiceValidationError:
    """Call an rtvoice action that must fail validation; return its error."""
    with pytest.raises(ServiceValidationError) as caught:
        await hass.services.async_call(
            DOMAIN, action, data, blocking=True, return_response=True, context=context
        )
    return caught.value


@pytest.mark.parametrize("text", ["", "   "])
async def test_send_blank_text_on_a_live_conversation(
    home: Home, entry: MockConfigEntry, text: str
) -> None:
    """Blank text is its own error, not "the conversation has ended"."""
    hass = home.hass
    conversation_id = await start(hass, satellite=None)
    err = await action_error(
        hass, SERVICE_SEND, {"conversation_id": conversation_id, "text": text}
    )
    assert err.translation_domain == DOMAIN
    assert err.translation_key == "empty_text"
    assert "ended" not in str(err)
    # The conversation is still live and got no input.
    [listed] = home.control.list_conversations()
    assert listed["id"] == conversation_id
    assert listed["stats"]["last_seq"] == 0


async def test_send_errors_are_distinct(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Unknown id, ended conversation and blank text each have their own message."""
    hass = home.hass
    conversation_id = await start(hass, satellite=None)
    openai_peer.enqueue(Text("Hello."))
    await send_answered(home, conversation_id, "Hi")
    await call(hass, SERVICE_STOP_CONVERSATION, {"conversation_id": conversation_id})
    keys = {
        (await action_error(hass, SERVICE_SEND, data)).translation_key
        for data in (
            {"conversation_id": "01NOSUCHCONVERSATION0000000", "text": "hi"},
            {"conversation_id": conversation_id, "text": "hi"},
            {"conversation_id": conversation_id, "text": " "},
        )
    }
    assert keys == {"unknown_conversation", "conversation_closed", "empty_text"}
    # Messages exist for every key the actions raise.
    messages = json.loads(TRANSLATIONS.read_text())["exceptions"]
    assert {"unknown_conversation", "empty_text", "conversation_closed"} <= set(
        messages
    )


# ── 5/6: who may see and control what ────────────────────────────────────────────


async def test_non_admin_controls_only_their_own_conversations(
    home: Home,
    entry: MockConfigEntry,
    hass_admin_user: MockUser,
    hass_read_only_user: MockUser,
) -> None:
    """A user sends to and stops their own conversations; others' ids stay hidden."""
    hass = home.hass
    user = Context(user_id=hass_read_only_user.id)
    admin = Context(user_id=hass_admin_user.id)
    theirs = (await call(hass, SERVICE_START_CONVERSATION, {}, context=admin))[
        "conversation_id"
    ]
    satellites = await start(hass)  # an automation's, on the kitchen satellite
    mine = (await call(hass, SERVICE_START_CONVERSATION, {}, context=user))[
        "conversation_id"
    ]

    for action, data in (
        (SERVICE_SEND, {"text": "Hello"}),
        (SERVICE_STOP_CONVERSATION, {}),
    ):
        for other in (theirs, satellites, "01NOSUCHCONVERSATION0000000"):
            err = await action_error(
                hass, action, {"conversation_id": other, **data}, context=user
            )
            assert isinstance(err, Unauthorized)
            assert err.translation_key == "not_your_conversation"
            # Never a list of ids: neither the admin's nor the satellite's.
            for hidden in {theirs, satellites, mine} - {other}:
                assert hidden not in str(err)
    assert await call(
        hass, SERVICE_SEND, {"conversation_id": mine, "text": "Hi"}, context=user
    ) == {"seq": 1}
    assert "messages" in await call(
        hass, SERVICE_STOP_CONVERSATION, {"conversation_id": mine}, context=user
    )
    # Admins control every conversation.
    assert "messages" in await call(
        hass, SERVICE_STOP_CONVERSATION, {"conversation_id": theirs}, context=admin
    )


async def test_unknown_conversation_lists_no_ids_for_anyone(
    home: Home, entry: MockConfigEntry, hass_admin_user: MockUser
) -> None:
    """Even an admin's "unknown conversation" error names only the id asked for."""
    hass = home.hass
    live = await start(hass)
    admin = Context(user_id=hass_admin_user.id)
    for action, data in (
        (SERVICE_SEND, {"text": "Hi"}),
        (SERVICE_STOP_CONVERSATION, {}),
        (SERVICE_GET_TRANSCRIPT, {}),
    ):
        err = await action_error(
            hass, action, {"conversation_id": "01NOPE", **data}, context=admin
        )
        assert err.translation_key == "unknown_conversation"
        assert live not in str(err)
        assert live not in str(err.translation_placeholders)


@pytest.mark.parametrize(
    "case",
    [
        (SERVICE_LIST_CONVERSATIONS, {}),
        (SERVICE_GET_TRANSCRIPT, {"conversation_id": "01NOPE"}),
        (SERVICE_SEND, {"conversation_id": "01NOPE", "text": "Hi"}),
    ],
)
@pytest.mark.usefixtures("entry")
async def test_non_admin_gets_a_clean_unauthorized_over_the_websocket(
    home: Home,
    hass_ws_client: WebSocketGenerator,
    hass_read_only_access_token: str,
    caplog: pytest.LogCaptureFixture,
    case: tuple[str, dict[str, Any]],
) -> None:
    """The frontend's way to call an action: a refusal, never a logged traceback."""
    action, data = case
    client = await hass_ws_client(home.hass, access_token=hass_read_only_access_token)
    caplog.clear()
    await client.send_json_auto_id(
        {
            "type": "call_service",
            "domain": DOMAIN,
            "service": action,
            "service_data": data,
            "return_response": True,
        }
    )
    reply = await client.receive_json()
    assert not reply["success"]
    assert reply["error"]["translation_domain"] == DOMAIN
    assert reply["error"]["translation_key"] in ("admin_only", "not_your_conversation")
    # HA logs the refusal in one line (its traceback only at debug).
    assert [r for r in caplog.records if r.exc_info and r.levelno > logging.DEBUG] == []
    assert "Unexpected exception" not in caplog.text


# ── 9: a turn cut during a tool call never answers with blank speech ─────────────
# (end to end: test_sessions.py::test_cancelled_input_waiting_behind_a_tool_…)


def test_interrupted_speech_says_what_the_tools_did() -> None:
    """Assist tool speech, the delegated agent's speech, entity names, or "interrupted"."""
    assist = {"speech": {"plain": {"speech": "The bed light is on."}}, "data": {}}
    targets = {
        "speech": {},
        "response_type": "action_done",
        "data": {"success": [{"name": "Kitchen Lights", "type": "entity"}]},
    }
    delegated = {"speech": "Turned on the lights", "response_type": "action_done"}
    assert interrupted_speech([json.dumps(assist)]) == "The bed light is on."
    assert interrupted_speech([json.dumps(targets)]) == "Done: Kitchen Lights."
    assert interrupted_speech([json.dumps(delegated)]) == "Turned on the lights"
    assert interrupted_speech(['{"error": "boom"}', "plain text"]) == INTERRUPTED
    assert interrupted_speech([]) == INTERRUPTED


# ── 21: the delegated agent's targets are passed on ───────────────────────────────


async def test_delegated_agent_results_are_passed_on(home: Home) -> None:
    """An action through HA's own agent lists the entities it switched, like HA."""
    hass = home.hass
    await async_setup_rtvoice(home, None, data={CONF_BRAIN: BRAIN_HA_AGENT})
    await hass.services.async_call(
        "light", "turn_off", {"entity_id": BED_LIGHT}, blocking=True
    )
    result = await conversation.async_converse(
        hass, "turn on the bed light", None, Context(), language="en", agent_id=AGENT
    )
    assert hass.states.get(BED_LIGHT).state == STATE_ON
    response = result.response
    assert response.response_type is intent.IntentResponseType.ACTION_DONE
    data = response.as_dict()["data"]
    assert [target["id"] for target in data["success"]] == [BED_LIGHT]
    assert data["failed"] == []
    assert response.speech["plain"]["speech"]


# ── 10: first-token and stalled-stream timeouts ───────────────────────────────────
# The peer never answers (Hang): the timeout is the only way out, so the tests
# assert what happens, not how long it took.


async def test_silent_server_fails_the_round_after_the_first_token_timeout(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A server that never starts answering: apology, and the request is hung up."""
    await async_setup_rtvoice(
        home, openai_peer, first_token_timeout=0.05, chunk_timeout=60
    )
    openai_peer.enqueue(Hang())
    result = await conversation.async_converse(
        home.hass, "hello", None, Context(), language="en", agent_id=AGENT
    )
    assert result.response.speech["plain"]["speech"] == APOLOGY
    await openai_peer.requests[0].disconnected.wait()


async def test_stalled_stream_fails_the_round_after_the_chunk_timeout(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A stream that stops mid-answer ends with the apology, not a 30 s stall."""
    await async_setup_rtvoice(
        home, openai_peer, first_token_timeout=60, chunk_timeout=0.05
    )
    openai_peer.enqueue(Text("Once upon"), Hang())
    result = await conversation.async_converse(
        home.hass, "tell a story", None, Context(), language="en", agent_id=AGENT
    )
    assert result.response.speech["plain"]["speech"] == APOLOGY
    await openai_peer.requests[0].disconnected.wait()
    assert home.sessions.stats(result.conversation_id).failed_rounds == 1


async def test_first_token_may_take_longer_than_a_chunk(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """A model that takes its time to start (loading) is not cut by the chunk timeout."""
    await async_setup_rtvoice(
        home, openai_peer, first_token_timeout=60, chunk_timeout=0.01
    )
    release = asyncio.Event()
    openai_peer.enqueue(WaitFor(release), Text("Ready."))
    answer = home.hass.async_create_task(
        conversation.async_converse(
            home.hass, "hello", None, Context(), language="en", agent_id=AGENT
        )
    )
    await openai_peer.wait_for_request(1)
    # Let the loop run well past the chunk timeout while the first token is due.
    await asyncio.sleep(0.1)  # not a synchronisation: time passing is the point
    release.set()
    result = await answer
    assert result.response.speech["plain"]["speech"] == "Ready."


# ── 12: options apply without a reload ───────────────────────────────────────────


async def test_options_apply_without_closing_conversations(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """Saved options reach the next conversation; live ones and transcripts stay."""
    hass = home.hass
    ended = await start(hass, satellite=None)
    openai_peer.enqueue(Text("Bye."))
    await send_answered(home, ended, "Hi")
    await call(hass, SERVICE_STOP_CONVERSATION, {"conversation_id": ended})
    live = await start(hass)
    runtime = entry.runtime_data

    flow = await open_settings(hass, entry)
    result = await hass.config_entries.options.async_configure(
        flow["flow_id"],
        {
            **{k: v for k, v in entry.options.items() if k != CONF_PROMPT},
            CONF_PROMPT: "You are the new butler.",
            CONF_TEMPERATURE: 0.3,
        },
    )
    assert result["type"] is FlowResultType.CREATE_ENTRY
    await hass.async_block_till_done()

    assert entry.runtime_data is runtime  # not reloaded
    assert [c["id"] for c in home.control.list_conversations()] == [live]
    page = await call(hass, SERVICE_GET_TRANSCRIPT, {"conversation_id": ended})
    assert page["total"] == 2
    # A new conversation gets the new prompt; requests the new temperature.
    openai_peer.enqueue(Text("At your service."))
    answer = await conversation.async_converse(
        hass, "hello", None, Context(), language="en", agent_id=AGENT
    )
    assert answer.response.speech["plain"]["speech"] == "At your service."
    request = openai_peer.requests[-1]
    assert request.messages[0]["content"].startswith("You are the new butler.")
    assert request.body["temperature"] == 0.3


async def test_switching_tools_off_reloads(home: Home, entry: MockConfigEntry) -> None:
    """Tools on/off is wired at load: that one change reloads the entry."""
    hass = home.hass
    runtime = entry.runtime_data
    hass.config_entries.async_update_entry(
        entry, options={**entry.options, CONF_LLM_HASS_API: LLM_API_NONE}
    )
    await hass.async_block_till_done()
    assert entry.runtime_data is not runtime
    assert entry.runtime_data.tools is None


# ── 13: the option lists leave out what cannot work ──────────────────────────────


def select_values(result: Mapping[str, Any], field: str) -> list[str]:
    """Return the values a select field of a form offers."""
    schema = result["data_schema"]
    selector = schema.schema[next(k for k in schema.schema if str(k) == field)]
    assert isinstance(selector, SelectSelector)
    return [option["value"] for option in selector.config["options"]]


async def test_lists_leave_out_what_cannot_work(
    home: Home, openai_peer: OpenAIPeer
) -> None:
    """No control API among the tools; no Realtime Voice agent among the agents."""
    hass = home.hass
    entry = await async_setup_rtvoice(home, openai_peer)
    assert any(api.id == api_id(entry) for api in llm.async_get_apis(hass))

    options = await open_settings(hass, entry)
    apis = select_values(options, CONF_LLM_HASS_API)
    assert DEFAULT_LLM_HASS_API in apis
    assert not [a for a in apis if a.startswith("rtvoice")]

    agent_form = await start_brain(hass, BRAIN_HA_AGENT)
    agents = select_values(agent_form, CONF_AGENT_ID)
    assert DEFAULT_AGENT_ID in agents
    assert AGENT not in agents  # this integration's own agent
    # The agent field has helper text (the conversation agent picker shows none).
    step = json.loads(TRANSLATIONS.read_text())["config"]["step"][BRAIN_HA_AGENT]
    assert step["data_description"][CONF_AGENT_ID]


# ── 11: the browser's Assist dialog ───────────────────────────────────────────────


def dialog_turn(
    home: Home, text: str, user: MockUser, conversation_id: str | None = None
) -> asyncio.Task[conversation.ConversationResult]:
    """Send a message as the Assist dialog does: that user, no device, no satellite."""
    return home.hass.async_create_task(
        conversation.async_converse(
            home.hass,
            text,
            conversation_id,
            Context(user_id=user.id),
            language="en",
            agent_id=AGENT,
        )
    )


@pytest.mark.parametrize("second_id", [None, "fresh"])
async def test_message_during_the_first_answer_interrupts_it(
    home: Home,
    entry: MockConfigEntry,
    openai_peer: OpenAIPeer,
    hass_admin_user: MockUser,
    second_id: str | None,
) -> None:
    """The dialog has no id yet: its second message still barges into its first.

    Sent as conversation/process does (no id), or as assist_pipeline/run does (the
    pipeline makes up a fresh id for a run without one; found with a real browser,
    tests/components/browser/check_first_use.py).
    """
    openai_peer.enqueue(Text("Once upon a time"), Hang())
    openai_peer.enqueue(Text("Sure, stopping."))
    first = dialog_turn(home, "tell me a long story", hass_admin_user)
    held = await openai_peer.wait_for_request(1)
    await home.wait_snapshot(lambda s: s.state == "speaking")
    second = dialog_turn(
        home, "stop, thanks", hass_admin_user, ulid_now() if second_id else None
    )

    answered = await second
    await held.disconnected.wait()  # the first answer stopped at the model
    cut = await first
    assert answered.conversation_id == cut.conversation_id
    assert answered.response.speech["plain"]["speech"] == "Sure, stopping."
    assert [c["id"] for c in home.control.list_conversations()] == [
        answered.conversation_id
    ]
    # The model saw one conversation: the cut story, then the new words.
    assert openai_peer.requests[1].messages[-1] == {
        "role": "user",
        "content": "stop, thanks",
    }
    assert {"role": "user", "content": "tell me a long story"} in openai_peer.requests[
        1
    ].messages


async def test_two_separate_dialogs_stay_separate(
    home: Home,
    entry: MockConfigEntry,
    openai_peer: OpenAIPeer,
    hass_admin_user: MockUser,
    hass_read_only_user: MockUser,
) -> None:
    """Other users' dialogs, and a new dialog after an answer, are conversations of their own."""
    release = asyncio.Event()
    openai_peer.enqueue(Text("One"), WaitFor(release), Text("."))
    openai_peer.enqueue(Text("Two."))
    first = dialog_turn(home, "hello", hass_admin_user)
    await openai_peer.wait_for_request(1)
    other = await dialog_turn(home, "hi", hass_read_only_user)
    release.set()
    mine = await first
    assert mine.conversation_id != other.conversation_id
    assert mine.response.speech["plain"]["speech"] == "One."
    assert other.response.speech["plain"]["speech"] == "Two."

    # The first dialog's turn is over: an id-less message now opens a new dialog.
    openai_peer.enqueue(Text("Three."))
    again = await dialog_turn(home, "hello again", hass_admin_user)
    assert again.conversation_id not in {mine.conversation_id, other.conversation_id}
    assert len(home.control.list_conversations()) == 3


# ── 15: an ended conversation's id is not reused (documented why) ────────────────


async def test_an_ended_conversation_keeps_its_id_and_transcript(
    home: Home, entry: MockConfigEntry, openai_peer: OpenAIPeer
) -> None:
    """A caller's own id is used while free; after its close it names the transcript."""
    hass = home.hass
    openai_peer.enqueue(Text("Noted."))
    first = await conversation.async_converse(
        hass, "remember milk", "kitchen-notes", Context(), language="en", agent_id=AGENT
    )
    assert first.conversation_id == "kitchen-notes"  # free: the caller's id is kept
    await call(hass, SERVICE_STOP_CONVERSATION, {"conversation_id": "kitchen-notes"})

    openai_peer.enqueue(Text("Noted too."))
    again = await conversation.async_converse(
        hass, "and eggs", "kitchen-notes", Context(), language="en", agent_id=AGENT
    )
    assert again.conversation_id != "kitchen-notes"
    page = await call(
        hass,
        SERVICE_GET_TRANSCRIPT,
        {"conversation_id": "kitchen-notes", "format": "raw"},
    )
    assert [m["content"] for m in page["transcript"]] == ["remember milk", "Noted."]


async def test_own_ended_conversation_says_it_ended(
    home: Home,
    entry: MockConfigEntry,
    openai_peer: OpenAIPeer,
    hass_read_only_user: MockUser,
) -> None:
    """A user sending to their own ended conversation is told it ended, not refused."""
    hass = home.hass
    user = Context(user_id=hass_read_only_user.id)
    mine = (await call(hass, SERVICE_START_CONVERSATION, {}, context=user))[
        "conversation_id"
    ]
    openai_peer.enqueue(Text("Hello."))
    await send_answered(home, mine, "Hi")
    await call(hass, SERVICE_STOP_CONVERSATION, {"conversation_id": mine}, context=user)
    err = await action_error(
        hass, SERVICE_SEND, {"conversation_id": mine, "text": "again"}, context=user
    )
    assert err.translation_key == "conversation_closed"


async def test_message_after_the_frontend_cancelled_the_first_turn(
    home: Home,
    entry: MockConfigEntry,
    openai_peer: OpenAIPeer,
    hass_admin_user: MockUser,
) -> None:
    """HA 2025.4's dialog cancels the running turn, then sends: still one conversation.

    Found with a real browser (tests/components/browser/check_first_use.py): the
    frontend ends the first pipeline run before it starts the next one.
    """
    openai_peer.enqueue(Text("Once upon a time"), Hang())
    openai_peer.enqueue(Text("Sure, stopping."))
    first = dialog_turn(home, "tell me a long story", hass_admin_user)
    held = await openai_peer.wait_for_request(1)
    await home.wait_snapshot(lambda s: s.state == "speaking")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await held.disconnected.wait()

    answered = await dialog_turn(home, "stop, thanks", hass_admin_user)
    assert answered.response.speech["plain"]["speech"] == "Sure, stopping."
    assert len(home.control.list_conversations()) == 1
    said = [
        m["content"] for m in openai_peer.requests[1].messages if m["role"] == "user"
    ]
    assert said == ["tell me a long story", "stop, thanks"]

    # Answered: the dialog now knows its id, an id-less message is a new dialog.
    openai_peer.enqueue(Text("Hello."))
    fresh = await dialog_turn(home, "hi", hass_admin_user)
    assert fresh.conversation_id != answered.conversation_id
