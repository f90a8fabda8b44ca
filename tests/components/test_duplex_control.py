"""Duplex conversations are the entry's: its settings, and the rtvoice actions on them.

The rig of ``test_duplex_entity``: the emulated Voice PE-like satellite (real
aioesphomeapi client), the offline Wyoming speech servers through HA's
``wyoming`` integration, the OpenAI-compatible peer. Waits are on events;
timeouts are safety nets. For Wyoming, the real wyoming-satellite of
``test_wyoming_satellite``. One test gate: the link's close is held open (wrapped,
not replaced) so that the caller of a stop can be cancelled while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from pytest_homeassistant_custom_component.common import async_capture_events
from pytest_homeassistant_custom_component.typing import ClientSessionGenerator

from custom_components.rtvoice.const import (
    CONF_END_SILENCE,
    CONF_IDLE_TIMEOUT,
    CONF_PROMPT,
    CONF_WAKE_WORD,
    DOMAIN,
    EVENT_CONVERSATION_CLOSED,
)
from custom_components.rtvoice.duplex_link import DuplexConversation
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import Event, HomeAssistant, callback
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import ServiceValidationError
from tests.components.common import async_load_entry, openai_entry
from tests.components.esphome_rig import entity_of, spoken, wait
from tests.components.test_duplex_entity import (
    ASK,
    NEWS,
    OPENING,
    REPLY,
    SAFETY,
    duplex_rig,
)
from tests.components.test_wyoming_satellite import (
    ASK_LIGHTS,
    WAKE,
    add_wyoming,
    sat_python,  # noqa: F401 - a fixture
    satellite_rig,
    say,
    speech_pipeline,
    the_link,
    wait_for_state,
    wake_available,  # noqa: F401 - a fixture
)
from tests.peers.esphome import EventType
from tests.peers.openai_server import OpenAIPeer, Text

pytestmark = pytest.mark.usefixtures("socket_enabled")

PROMPT = "You are the helper of the {{ 'kitchen' | upper }}."
EXTRA = "The user just came home."


async def call(hass: HomeAssistant, service: str, **data: Any) -> dict[str, Any]:
    """Call an rtvoice action and return its response."""
    response = await hass.services.async_call(
        DOMAIN, service, data, blocking=True, return_response=True
    )
    assert response is not None
    return dict(response)


def closed_signal(hass: HomeAssistant) -> asyncio.Event:
    """Return an event set when a conversation of the entry closes."""
    closed = asyncio.Event()

    @callback
    def _closed(_event: Event) -> None:
        closed.set()

    hass.bus.async_listen(EVENT_CONVERSATION_CLOSED, _closed)
    return closed


def roles(request_messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Return (role, content) of a model request's messages."""
    return [(m["role"], m["content"]) for m in request_messages]


async def test_duplex_conversation_follows_the_entry_settings(
    hass: HomeAssistant, tmp_path: Path, openai_peer: OpenAIPeer
) -> None:
    """The entry's prompt (rendered) and idle timeout reach the duplex conversation.

    With a 1 s idle timeout the conversation closes soon after the satellite
    went back to its wake word (the default, 300 s, would outlast the safety
    net). A changed setting applies without a reload: the satellite stays
    connected and its next conversation uses it.
    """
    async with duplex_rig(
        hass,
        tmp_path,
        openai_peer,
        options={CONF_PROMPT: PROMPT, CONF_IDLE_TIMEOUT: 1},
        **{CONF_END_SILENCE: 1},
    ) as rig:
        closed = async_capture_events(hass, EVENT_CONVERSATION_CLOSED)
        was_closed = closed_signal(hass)
        openai_peer.enqueue(Text("The kitchen lights are on."))
        since = rig.device.mark()
        rig.device.say(await spoken(ASK))
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        system, *_ = request.messages
        assert system["role"] == "system"
        assert "You are the helper of the KITCHEN." in system["content"]
        conversation = rig.link.conversation
        assert conversation is not None
        assert conversation.binding.idle_timeout_s == 1
        # Back to the wake word after the answer; then the idle timeout closes it.
        await wait(rig.device.wait_for_event(EventType.RUN_END, since), SAFETY)
        await wait(was_closed.wait(), SAFETY)
        assert [e.data["id"] for e in closed] == [conversation.child_id]
        assert closed[0].data["satellite"] == rig.satellite

        link = rig.link
        hass.config_entries.async_update_entry(
            rig.entry,
            options={
                **rig.entry.options,
                CONF_PROMPT: "You are the helper of the hall.",
                CONF_IDLE_TIMEOUT: 600,
            },
        )
        await hass.async_block_till_done()
        assert rig.link is link and link.available  # not reloaded
        assert link.binding.idle_timeout_s == 600
        openai_peer.enqueue(Text("The kitchen lights are on."))
        rig.device.say(await spoken(ASK))
        request = await wait(openai_peer.wait_for_request(2), SAFETY)
        assert "You are the helper of the hall." in request.messages[0]["content"]


async def test_rtvoice_controls_the_duplex_conversation(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """start_conversation returns the duplex id; list, send, transcript, stop on it.

    The reply lands in the conversation the action returned; an input sent while
    its session listens is answered on the satellite; a stop whose caller is
    cancelled still closes the conversation, once.
    """
    async with duplex_rig(
        hass, tmp_path, openai_peer, client_factory=hass_client_no_auth
    ) as rig:
        openai_peer.enqueue(Text("The kitchen lights are on."))
        rig.device.say(await spoken(REPLY), wake_word=None)  # for the run to come
        started = await call(
            hass, "start_conversation", satellite=rig.satellite, message=OPENING
        )
        conversation_id = started["conversation_id"]
        conversation = rig.link.conversation
        assert conversation is not None
        assert conversation.child_id == conversation_id
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        assert roles(request.messages)[-2:] == [
            ("assistant", OPENING),
            ("user", REPLY),
        ]
        assert rig.link.conversation is conversation  # the reply landed there

        listed = await call(hass, "list_conversations")
        [item] = listed["conversations"]
        assert item["id"] == conversation_id
        assert item["satellite"] == rig.satellite
        assert item["device_id"] is not None

        # Sent while the session listens (the answer has played): answered on
        # the satellite.
        await rig.states.reached("responding", "listening", "responding", "listening")
        openai_peer.enqueue(Text("Dinner is ready."))
        since = rig.device.mark()
        await call(hass, "send", conversation_id=conversation_id, text=NEWS)
        request = await wait(openai_peer.wait_for_request(2), SAFETY)
        assert roles(request.messages)[-1] == ("user", NEWS)
        # A media-player satellite: the answer is an announcement of the stream.
        await wait(
            rig.device.wait_for_message("MediaPlayerCommandRequest", since), SAFETY
        )

        page = await call(
            hass, "get_transcript", conversation_id=conversation_id, format="raw"
        )
        said = [(m["role"], m["content"]) for m in page["transcript"]]
        assert said[:3] == [
            ("assistant", OPENING),
            ("user", REPLY),
            ("assistant", "The kitchen lights are on."),
        ]

        # Stop: the caller is cancelled while the close runs; it completes once.
        closed = async_capture_events(hass, EVENT_CONVERSATION_CLOSED)
        link = rig.link
        closing = asyncio.Event()
        release = asyncio.Event()
        close = link.close_conversation

        async def held_close(target: DuplexConversation) -> None:
            closing.set()
            await release.wait()
            await close(target)

        link.close_conversation = held_close  # type: ignore[method-assign]
        stop = hass.async_create_task(
            rig.entry.runtime_data.control.async_stop(conversation_id)
        )
        await wait(closing.wait(), SAFETY)
        stop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stop
        assert stop.cancelled()
        with pytest.raises(ServiceValidationError):  # closing: not live any more
            await call(hass, "stop_conversation", conversation_id=conversation_id)
        release.set()
        await hass.async_block_till_done()
        assert [e.data["id"] for e in closed] == [conversation_id]
        assert rig.link.conversation is None
        assert (await call(hass, "list_conversations"))["conversations"] == []
        archived = await call(hass, "get_transcript", conversation_id=conversation_id)
        assert archived["total"] >= 4
        with pytest.raises(ServiceValidationError):
            await call(hass, "send", conversation_id=conversation_id, text=NEWS)


async def test_extra_system_prompt_reaches_the_duplex_conversation(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """HA's start_conversation: its extra_system_prompt is in the system prompt."""
    async with duplex_rig(
        hass,
        tmp_path,
        openai_peer,
        client_factory=hass_client_no_auth,
        options={CONF_PROMPT: PROMPT},
    ) as rig:
        openai_peer.enqueue(Text("The kitchen lights are on."))
        rig.device.say(await spoken(REPLY), wake_word=None)
        await hass.services.async_call(
            "assist_satellite",
            "start_conversation",
            {
                "start_message": OPENING,
                "extra_system_prompt": EXTRA,
                "preannounce": False,
            },
            target={"entity_id": rig.satellite},
            blocking=True,
        )
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        system = request.messages[0]["content"]
        assert "You are the helper of the KITCHEN." in system
        assert EXTRA in system
        assert roles(request.messages)[-2:] == [
            ("assistant", OPENING),
            ("user", REPLY),
        ]
        listed = await call(hass, "list_conversations")
        assert [c["satellite"] for c in listed["conversations"]] == [rig.satellite]


async def test_wyoming_conversation_is_the_entrys(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    sat_python: str,  # noqa: F811 - the imported fixture
    wake_available: None,  # noqa: F811 - the imported fixture
) -> None:
    """A Wyoming satellite's conversation: the entry's settings, listed, stopped.

    A real wyoming-satellite (the rig of ``test_wyoming_satellite``). The
    entry's prompt reaches the model with the satellite entity's prompt scope;
    the conversation is listed under the satellite and a stop closes it.
    """
    hass.config.config_dir = str(tmp_path)  # the TTS cache is written there
    entry = await async_load_entry(
        hass,
        openai_entry(
            hass, openai_peer, options={CONF_PROMPT: PROMPT, CONF_IDLE_TIMEOUT: 77}
        ),
    )
    async with speech_pipeline(hass), satellite_rig(sat_python) as satellite:
        result = await add_wyoming(
            hass,
            entry,
            {
                CONF_HOST: satellite.host,
                CONF_PORT: satellite.port,
                CONF_WAKE_WORD: "hey_jarvis",
            },
        )
        assert result["type"] is FlowResultType.CREATE_ENTRY, result
        await hass.async_block_till_done()  # the entry reloads with the satellite
        entity_id = entity_of(hass, entry, "assist_satellite")
        link = the_link(entry)
        await wait(link.wait_connected(), SAFETY)
        openai_peer.enqueue(Text("The kitchen lights are on."))
        await say(satellite, WAKE)
        await wait_for_state(hass, entity_id, {"listening"})
        await say(satellite, ASK_LIGHTS)
        request = await wait(openai_peer.wait_for_request(1), SAFETY)
        assert "You are the helper of the KITCHEN." in request.messages[0]["content"]
        conversation = link.conversation
        assert conversation is not None
        assert conversation.binding.idle_timeout_s == 77
        assert conversation.binding.prompt_scope == entity_id

        listed = await call(hass, "list_conversations")
        assert [(c["id"], c["satellite"]) for c in listed["conversations"]] == [
            (conversation.child_id, entity_id)
        ]
        stopped = await call(
            hass, "stop_conversation", conversation_id=conversation.child_id
        )
        assert stopped["messages"] >= 1
        assert (await call(hass, "list_conversations"))["conversations"] == []
        assert await hass.config_entries.async_unload(entry.entry_id)


async def test_send_to_a_waiting_duplex_conversation_is_said_then_heard(
    hass: HomeAssistant,
    tmp_path: Path,
    openai_peer: OpenAIPeer,
    hass_client_no_auth: ClientSessionGenerator,
) -> None:
    """Sent while the satellite waits for its wake word: said, then it listens.

    The answer is announced (start_conversation) and the reply lands in the same
    conversation, after the answer in its history.
    """
    async with duplex_rig(
        hass,
        tmp_path,
        openai_peer,
        client_factory=hass_client_no_auth,
        **{CONF_END_SILENCE: 1},
    ) as rig:
        openai_peer.enqueue(Text("The kitchen lights are on."))
        since = rig.device.mark()
        rig.device.say(await spoken(ASK))
        await wait(openai_peer.wait_for_request(1), SAFETY)
        await wait(rig.device.wait_for_event(EventType.RUN_END, since), SAFETY)
        conversation = rig.link.conversation
        assert conversation is not None and conversation.idle
        [item] = (await call(hass, "list_conversations"))["conversations"]
        assert item["id"] == conversation.child_id

        openai_peer.enqueue(Text("Dinner is ready."))
        openai_peer.enqueue(Text("Enjoy your meal."))
        rig.device.say(await spoken(REPLY), wake_word=None)  # for the run to come
        await call(hass, "send", conversation_id=item["id"], text="call them in")
        request = await wait(openai_peer.wait_for_request(3), SAFETY)
        assert roles(request.messages)[-3:] == [
            ("user", "call them in"),
            ("assistant", "Dinner is ready."),
            ("user", REPLY),
        ]
        assert rig.link.conversation is conversation
        [announced] = [p for p in rig.device.playbacks if p.source == "announce"]
        assert await rig.link.binding.stt(announced.pcm) == NEWS
