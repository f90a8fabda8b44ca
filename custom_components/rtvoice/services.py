"""The ``rtvoice.*`` actions: start, talk to, stop, list and read conversations.

DESIGN §5.4. The actions serve every config entry, so they are registered once in
``async_setup``; each call finds the loaded entry it concerns: the one named by
``config_entry_id`` (start), the one that knows the conversation id (send, stop,
transcript), or all of them (list).

Who may call what (docs/actions.md; the policy itself is in ``control``):

- ``list_conversations`` and ``get_transcript`` return what people said to their
  satellites: administrators only (like HA's own actions that reveal private data).
- ``start_conversation`` is open to every user, like
  ``assist_satellite.start_conversation``; the conversation belongs to the caller.
  On a satellite a user who is not an administrator needs the right to control
  the satellite's entity, may not set ``system_prompt``, and may not replace a
  conversation that is not theirs (``ControlPlane.async_check_start``).
- ``send`` and ``stop_conversation``: administrators, and any user for the
  conversations that belong to them (started by them, or their own Assist dialog).
- Calls without a user (automations, scripts run by the system) may do everything.
- Every input's tools run with the caller's context (user), so Home Assistant's
  permission checks apply to what they do.
- A refused call raises ``NotAllowedError`` (HA's ``Unauthorized``); no error names
  a conversation other than the one asked for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final

import voluptuous as vol

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import (
    HomeAssistant,
    ServiceCall,
    ServiceResponse,
    SupportsResponse,
    callback,
)
from homeassistant.exceptions import (
    HomeAssistantError,
    ServiceValidationError,
    UnknownUser,
)
from homeassistant.helpers import config_validation as cv
from homeassistant.util.json import JsonValueType

from .const import DOMAIN
from .control import (
    FORMAT_TEXT,
    MAX_PAGE_LIMIT,
    TRANSCRIPT_FORMATS,
    async_is_privileged,
    id_list,
)
from .errors import NotAllowedError, UnknownConversationError, UnknownSatelliteError
from .kernel.transcript import DEFAULT_PAGE_LIMIT
from .runtime import RtVoiceConfigEntry

SERVICE_START_CONVERSATION: Final = "start_conversation"
SERVICE_SEND: Final = "send"
SERVICE_STOP_CONVERSATION: Final = "stop_conversation"
SERVICE_LIST_CONVERSATIONS: Final = "list_conversations"
SERVICE_GET_TRANSCRIPT: Final = "get_transcript"
SERVICE_GET_QUESTION: Final = "get_question"

ATTR_SATELLITE: Final = "satellite"
ATTR_SYSTEM_PROMPT: Final = "system_prompt"
ATTR_MESSAGE: Final = "message"
ATTR_CONFIG_ENTRY_ID: Final = "config_entry_id"
ATTR_CONVERSATION_ID: Final = "conversation_id"
ATTR_TEXT: Final = "text"
ATTR_OFFSET: Final = "offset"
ATTR_LIMIT: Final = "limit"
ATTR_FORMAT: Final = "format"
ATTR_QUESTION_ID: Final = "question_id"

_CONVERSATION_ID = vol.All(cv.string, vol.Length(min=1))

START_CONVERSATION_SCHEMA: Final = vol.Schema(
    {
        vol.Optional(ATTR_SATELLITE): cv.entity_domain("assist_satellite"),
        vol.Optional(ATTR_SYSTEM_PROMPT): cv.string,
        vol.Optional(ATTR_MESSAGE): cv.string,
        vol.Optional(ATTR_CONFIG_ENTRY_ID): cv.string,
    }
)
SEND_SCHEMA: Final = vol.Schema(
    {
        vol.Required(ATTR_CONVERSATION_ID): _CONVERSATION_ID,
        # Blank text gets its own translated error from the handler.
        vol.Required(ATTR_TEXT): cv.string,
    }
)
STOP_CONVERSATION_SCHEMA: Final = vol.Schema(
    {vol.Required(ATTR_CONVERSATION_ID): _CONVERSATION_ID}
)
LIST_CONVERSATIONS_SCHEMA: Final = vol.Schema({})
GET_TRANSCRIPT_SCHEMA: Final = vol.Schema(
    {
        vol.Required(ATTR_CONVERSATION_ID): _CONVERSATION_ID,
        vol.Optional(ATTR_OFFSET, default=0): vol.All(
            vol.Coerce(int), vol.Range(min=0)
        ),
        vol.Optional(ATTR_LIMIT, default=DEFAULT_PAGE_LIMIT): vol.All(
            vol.Coerce(int), vol.Range(min=1, max=MAX_PAGE_LIMIT)
        ),
        vol.Optional(ATTR_FORMAT, default=FORMAT_TEXT): vol.In(TRANSCRIPT_FORMATS),
    }
)

GET_QUESTION_SCHEMA: Final = vol.Schema(
    {
        vol.Required(ATTR_CONVERSATION_ID): _CONVERSATION_ID,
        vol.Required(ATTR_QUESTION_ID): vol.All(cv.string, vol.Length(min=1)),
    }
)

type _Handler = Callable[[ServiceCall], Awaitable[ServiceResponse]]


# ── resolving the entry a call is about ──────────────────────────────────────


def _loaded_entries(hass: HomeAssistant) -> list[RtVoiceConfigEntry]:
    """Every loaded rtvoice entry; ``not_loaded`` when there is none."""
    entries: list[RtVoiceConfigEntry] = hass.config_entries.async_loaded_entries(DOMAIN)
    if not entries:
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="not_loaded"
        )
    return entries


def _entry_for_start(hass: HomeAssistant, entry_id: str | None) -> RtVoiceConfigEntry:
    """Return the entry named by ``config_entry_id``, or the only loaded one."""
    if entry_id is not None:
        entry = hass.config_entries.async_get_entry(entry_id)
        if (
            entry is None
            or entry.domain != DOMAIN
            or entry.state is not ConfigEntryState.LOADED
        ):
            raise ServiceValidationError(
                translation_domain=DOMAIN,
                translation_key="entry_not_loaded",
                translation_placeholders={"config_entry_id": entry_id},
            )
        return entry
    entries = _loaded_entries(hass)
    if len(entries) > 1:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="entry_required",
            translation_placeholders={
                "entries": ", ".join(f"{e.entry_id} ({e.title})" for e in entries)
            },
        )
    return entries[0]


def _entry_for_conversation(
    hass: HomeAssistant, conversation_id: str
) -> RtVoiceConfigEntry:
    """Return the loaded entry that knows the conversation (live or archived)."""
    for entry in _loaded_entries(hass):
        if entry.runtime_data.control.knows(conversation_id):
            return entry
    raise ServiceValidationError(
        translation_domain=DOMAIN,
        translation_key="unknown_conversation",
        translation_placeholders={"conversation_id": conversation_id},
    )


async def _async_entry_to_control(
    call: ServiceCall, conversation_id: str
) -> RtVoiceConfigEntry:
    """Return the entry of a conversation the caller may send to or stop.

    A caller who is not privileged learns nothing about conversations that are not
    theirs: unknown and foreign ids get the same refusal.
    """
    user_id = call.context.user_id
    privileged = await async_is_privileged(call.hass, user_id)
    if privileged:
        return _entry_for_conversation(call.hass, conversation_id)
    for entry in _loaded_entries(call.hass):
        if entry.runtime_data.control.may_control(
            conversation_id, user_id, privileged=False
        ):
            return entry
    raise NotAllowedError(
        call.context,
        "not_your_conversation",
        {"conversation_id": conversation_id},
    )


def _closed_error(conversation_id: str) -> ServiceValidationError:
    return ServiceValidationError(
        translation_domain=DOMAIN,
        translation_key="conversation_closed",
        translation_placeholders={"conversation_id": conversation_id},
    )


# ── the actions ───────────────────────────────────────────────────────────────


async def _async_start_conversation(call: ServiceCall) -> ServiceResponse:
    entry = _entry_for_start(call.hass, call.data.get(ATTR_CONFIG_ENTRY_ID))
    runtime = entry.runtime_data
    satellite: str | None = call.data.get(ATTR_SATELLITE)
    privileged = await async_is_privileged(call.hass, call.context.user_id)
    try:
        conversation_id = await runtime.control.async_start(
            satellite,
            call.data.get(ATTR_SYSTEM_PROMPT) or None,
            owner=call.context.user_id,
            message=call.data.get(ATTR_MESSAGE) or None,
            context=call.context,
            privileged=privileged,
        )
    except NotAllowedError:
        raise
    except UnknownSatelliteError as err:
        raise ServiceValidationError(
            translation_domain=DOMAIN,
            translation_key="unknown_satellite",
            translation_placeholders={
                "satellite": str(satellite),
                "satellites": id_list(runtime.satellites.satellites(), limit=50),
            },
        ) from err
    except HomeAssistantError as err:
        raise HomeAssistantError(
            translation_domain=DOMAIN,
            translation_key="start_failed",
            translation_placeholders={"error": str(err)},
        ) from err
    return {"conversation_id": conversation_id}


async def _async_send(call: ServiceCall) -> ServiceResponse:
    conversation_id: str = call.data[ATTR_CONVERSATION_ID]
    text: str = call.data[ATTR_TEXT]
    if not text.strip():
        raise ServiceValidationError(
            translation_domain=DOMAIN, translation_key="empty_text"
        )
    entry = await _async_entry_to_control(call, conversation_id)
    try:
        seq = await entry.runtime_data.control.async_send(
            conversation_id, text, call.context
        )
    except UnknownConversationError as err:  # known, but not live: ended or closing
        raise _closed_error(conversation_id) from err
    return {"seq": seq}


async def _async_stop_conversation(call: ServiceCall) -> ServiceResponse:
    conversation_id: str = call.data[ATTR_CONVERSATION_ID]
    entry = await _async_entry_to_control(call, conversation_id)
    try:
        messages = await entry.runtime_data.control.async_stop(conversation_id)
    except UnknownConversationError as err:  # known, but not live: ended or closing
        raise _closed_error(conversation_id) from err
    return {"messages": messages}


async def _async_list_conversations(call: ServiceCall) -> ServiceResponse:
    conversations: list[JsonValueType] = []
    for entry in _loaded_entries(call.hass):
        conversations.extend(
            {**item, "config_entry_id": entry.entry_id}
            for item in entry.runtime_data.control.list_conversations()
        )
    return {"conversations": conversations}


async def _async_get_transcript(call: ServiceCall) -> ServiceResponse:
    conversation_id: str = call.data[ATTR_CONVERSATION_ID]
    entry = _entry_for_conversation(call.hass, conversation_id)
    # No await since the lookup: the transcript cannot have gone meanwhile.
    return entry.runtime_data.control.transcript(
        conversation_id,
        call.data[ATTR_OFFSET],
        call.data[ATTR_LIMIT],
        call.data[ATTR_FORMAT],
    )


async def _async_get_question(call: ServiceCall) -> ServiceResponse:
    conversation_id: str = call.data[ATTR_CONVERSATION_ID]
    question_id: str = call.data[ATTR_QUESTION_ID]
    for entry in _loaded_entries(call.hass):
        text = entry.runtime_data.control.question(conversation_id, question_id)
        if text is not None:
            return {
                "conversation_id": conversation_id,
                "question_id": question_id,
                "text": text,
            }
    raise ServiceValidationError(
        translation_domain=DOMAIN,
        translation_key="unknown_question",
        translation_placeholders={
            "conversation_id": conversation_id,
            "question_id": question_id,
        },
    )


# ── registration ──────────────────────────────────────────────────────────────


async def _async_check_admin(hass: HomeAssistant, call: ServiceCall) -> None:
    """Let administrators and calls without a user through (as HA's admin actions).

    Not ``async_register_admin_service``: on HA 2025.4 it drops responses, and its
    plain ``Unauthorized`` is logged with a traceback by the websocket API.
    """
    if not call.context.user_id:
        return  # automations, scripts, the system
    user = await hass.auth.async_get_user(call.context.user_id)
    if user is None:
        raise UnknownUser(context=call.context)
    if not user.is_admin:
        raise NotAllowedError(
            call.context, "admin_only", {"action": f"{DOMAIN}.{call.service}"}
        )


@callback
def _async_register_admin(
    hass: HomeAssistant,
    service: str,
    handler: _Handler,
    schema: vol.Schema,
    supports_response: SupportsResponse,
) -> None:
    """Register an admin-only action that returns a response."""

    async def admin_handler(call: ServiceCall) -> ServiceResponse:
        await _async_check_admin(hass, call)
        return await handler(call)

    hass.services.async_register(
        DOMAIN, service, admin_handler, schema, supports_response
    )


@callback
def async_setup_services(hass: HomeAssistant) -> None:
    """Register the ``rtvoice.*`` actions (once, for every entry)."""
    # Start: any user. Send and stop: checked per conversation in the handlers.
    # List and transcript reveal what was said: admins only (module docstring).
    hass.services.async_register(
        DOMAIN,
        SERVICE_START_CONVERSATION,
        _async_start_conversation,
        START_CONVERSATION_SCHEMA,
        SupportsResponse.OPTIONAL,
    )
    hass.services.async_register(
        DOMAIN, SERVICE_SEND, _async_send, SEND_SCHEMA, SupportsResponse.OPTIONAL
    )
    hass.services.async_register(
        DOMAIN,
        SERVICE_STOP_CONVERSATION,
        _async_stop_conversation,
        STOP_CONVERSATION_SCHEMA,
        SupportsResponse.OPTIONAL,
    )
    _async_register_admin(
        hass,
        SERVICE_LIST_CONVERSATIONS,
        _async_list_conversations,
        LIST_CONVERSATIONS_SCHEMA,
        SupportsResponse.ONLY,
    )
    _async_register_admin(
        hass,
        SERVICE_GET_TRANSCRIPT,
        _async_get_transcript,
        GET_TRANSCRIPT_SCHEMA,
        SupportsResponse.ONLY,
    )
    _async_register_admin(
        hass,
        SERVICE_GET_QUESTION,
        _async_get_question,
        GET_QUESTION_SCHEMA,
        SupportsResponse.ONLY,
    )
