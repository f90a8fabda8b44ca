"""The "Realtime Voice control" LLM API: HA's main assistant as the parent.

DESIGN §4.8 / §5.4. Home Assistant's own conversation agent (any LLM agent whose
"Control Home Assistant" option includes this API) supervises the realtime
conversations of one config entry through two tools:

- ``rt_children``: ``list`` the conversations with their counters, ``create`` one on a
  satellite, ``send`` it text (an interrupting input, never queued), ``stop`` it (the
  transcript is handed off).
- ``rt_transcript``: read a transcript (live or stopped) page by page.

One API per config entry, id ``rtvoice_control_<entry_id>``: every entry has its own
kernel, so an API is bound to exactly one of them and the tools need no entry
argument; the entry id is stable across restarts, so an agent's API choice survives
them. Its name carries the entry title when there are several.

Errors are results, not exceptions: ``{"error": "..."}`` with what to do instead (the
satellites to choose from, the list action), so the model can correct itself in one
step; they never name other conversations. The same rules as the actions
(``control``): listing and reading transcripts reveal what people said, so a caller
who is a user must be an administrator; a user who is not may send to and stop only
the conversations that belong to them. Unlike the actions, a call **without a user**
is not trusted: the main agent hears anyone speaking at any satellite, and a
satellite's speaker is not an administrator. Such a caller may start a conversation
on the satellite it speaks from (with the entry's instructions) and send to / stop
the conversation of that satellite, nothing else. Every input sent here runs its
tools with the agent's context (its user, or none), as the agent's own tools do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import voluptuous as vol
from voluptuous.humanize import humanize_error

from homeassistant.config_entries import ConfigEntryState
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.helpers import config_validation as cv, llm
from homeassistant.util.json import JsonObjectType, JsonValueType

from .const import DEFAULT_NAME
from .control import (
    FORMAT_TEXT,
    MAX_PAGE_LIMIT,
    TRANSCRIPT_FORMATS,
    async_is_privileged,
)
from .errors import NotAllowedError, RtVoiceError, UnknownConversationError
from .kernel.transcript import DEFAULT_PAGE_LIMIT
from .runtime import RtVoiceConfigEntry

API_ID_PREFIX: Final = "rtvoice_control"
API_NAME: Final = "Realtime Voice control"

TOOL_CHILDREN: Final = "rt_children"
TOOL_TRANSCRIPT: Final = "rt_transcript"

ACTION_LIST: Final = "list"
ACTION_CREATE: Final = "create"
ACTION_SEND: Final = "send"
ACTION_STOP: Final = "stop"
ACTIONS: Final = (ACTION_LIST, ACTION_CREATE, ACTION_SEND, ACTION_STOP)

API_PROMPT: Final = (
    "You supervise realtime voice conversations that Realtime Voice holds on the voice"
    " satellites of this home. Use the tools {children} and {transcript}:\n"
    "- {children} action=list: the running conversations and their counters.\n"
    "- {children} action=create, satellite=<entity id>: start a conversation on that"
    " satellite (optional system_prompt: its instructions). It talks with whoever is"
    " at the satellite; its answers are spoken there.\n"
    "- {children} action=send, id, text: give a conversation new input. This"
    " interrupts its current round at once: nothing is queued, it answers the newest"
    " input. A conversation may ask you something; answer it this way.\n"
    "- {children} action=stop, id: end a conversation. Its transcript is handed off"
    " to you: you decide what is worth keeping.\n"
    "- {transcript} id, offset, limit, format: read a transcript (of a running or a"
    " stopped conversation) page by page, {limit} messages by default. Read only the"
    " pages you need instead of loading it all."
)


def api_id(entry: RtVoiceConfigEntry) -> str:
    """Return the LLM API id of an entry's control API."""
    return f"{API_ID_PREFIX}_{entry.entry_id}"


def api_name(entry: RtVoiceConfigEntry) -> str:
    """Return the name an agent's options show for the entry's control API."""
    if entry.title in ("", DEFAULT_NAME):
        return API_NAME
    return f"{API_NAME} ({entry.title})"


def _error(message: str) -> JsonObjectType:
    return {"error": message}


def _user_id(llm_context: llm.LLMContext) -> str | None:
    """Return the user the agent acts for (None: a satellite, automation, system)."""
    return llm_context.context.user_id if llm_context.context is not None else None


_NOT_ADMIN: Final = (
    "Only an administrator may read realtime conversations (list and transcripts)."
    " Tell the user to ask an administrator."
)
_NOT_YOURS: Final = (
    "This user may only send to or stop conversations they started. Tell the user to"
    " ask an administrator."
)
_REFUSED_START: Final = {
    "satellite_not_allowed": (
        "This user may not start a conversation on {satellite}: it needs the right"
        " to control that satellite. Tell the user to ask an administrator."
    ),
    "satellite_prompt_admin_only": (
        "Only an administrator may give a conversation on {satellite} its own"
        " instructions; create it without system_prompt."
    ),
    "satellite_busy": (
        "{satellite} already has a conversation that is not this user's; it is not"
        " replaced. Tell the user to try again when it has ended."
    ),
}


def _context(llm_context: llm.LLMContext) -> Context:
    """Return the agent's context (a fresh one without user when it has none)."""
    return llm_context.context if llm_context.context is not None else Context()


async def _async_privileged(hass: HomeAssistant, llm_context: llm.LLMContext) -> bool:
    """Whether the agent's caller is an administrator (no user: never)."""
    return await async_is_privileged(hass, _user_id(llm_context), trust_no_user=False)


class _EntryTool(llm.Tool):
    """A tool bound to one config entry; validates its own arguments."""

    def __init__(self, entry: RtVoiceConfigEntry) -> None:
        """Bind the tool to the entry it controls."""
        self._entry = entry

    def _arguments(self, tool_input: llm.ToolInput) -> dict[str, Any] | str:
        """Validate the arguments; an error message the model can act on if bad."""
        try:
            return dict(self.parameters(tool_input.tool_args))
        except vol.Invalid as err:
            return (
                f"invalid arguments for {self.name}:"
                f" {humanize_error(tool_input.tool_args, err)}"
            )

    def _ready(self, tool_input: llm.ToolInput) -> dict[str, Any] | str:
        """Return the validated arguments, or why the tool cannot run now."""
        args = self._arguments(tool_input)
        if isinstance(args, str):
            return args
        if self._entry.state is not ConfigEntryState.LOADED:
            return "Realtime Voice is not loaded; try again later."
        return args

    def _unknown(self, conversation_id: str) -> JsonObjectType:
        return _error(
            f"no realtime conversation {conversation_id!r}. Use {TOOL_CHILDREN}"
            " action=list to see the running ones."
        )


class RtChildrenTool(_EntryTool):
    """``rt_children``: list, create, send to and stop realtime conversations."""

    name = TOOL_CHILDREN
    description = (
        "Control realtime voice conversations on satellites. action=list shows them;"
        " create starts one on a satellite; send gives one new text and interrupts its"
        " current answer; stop ends one and hands its transcript off (read it with"
        f" {TOOL_TRANSCRIPT})."
    )
    parameters = vol.Schema(
        {
            vol.Optional(
                "action", default=ACTION_LIST, description="What to do."
            ): vol.In(ACTIONS),
            vol.Optional("id", description="Conversation id (send, stop)."): cv.string,
            vol.Optional(
                "satellite",
                description="Entity id of the voice satellite (create).",
            ): cv.string,
            vol.Optional("text", description="Text to send (send)."): cv.string,
            vol.Optional(
                "system_prompt",
                description="Instructions for the new conversation (create, optional).",
            ): cv.string,
        },
        extra=vol.REMOVE_EXTRA,
    )

    async def async_call(
        self,
        hass: HomeAssistant,
        tool_input: llm.ToolInput,
        llm_context: llm.LLMContext,
    ) -> JsonObjectType:
        """Run one action; every failure is an ``error`` result."""
        args = self._ready(tool_input)
        if isinstance(args, str):
            return _error(args)
        action = args["action"]
        user_id = _user_id(llm_context)
        privileged = await _async_privileged(hass, llm_context)
        if action == ACTION_CREATE:
            return await self._async_create(args, llm_context, privileged=privileged)
        if action in (ACTION_SEND, ACTION_STOP):
            control = self._entry.runtime_data.control
            conversation_id = args.get("id", "")
            if not control.may_control(
                conversation_id, user_id, privileged=privileged
            ) and not (
                user_id is None
                and control.is_on_device(conversation_id, llm_context.device_id)
            ):
                return _error(_NOT_YOURS)
            if action == ACTION_SEND:
                return await self._async_send(args, _context(llm_context))
            return await self._async_stop(args)
        if not privileged:
            return _error(_NOT_ADMIN)
        return self._list()

    def _list(self) -> JsonObjectType:
        conversations: list[JsonValueType] = list(
            self._entry.runtime_data.control.list_conversations()
        )
        if not conversations:
            return {
                "conversations": [],
                "result": "No realtime conversation is running.",
            }
        return {
            "conversations": conversations,
            "result": (
                f"{len(conversations)} realtime conversation(s). Sending to one"
                " interrupts its current round (nothing is queued); a stopped one's"
                f" transcript stays readable with {TOOL_TRANSCRIPT}."
            ),
        }

    async def _async_create(
        self, args: dict[str, Any], llm_context: llm.LLMContext, *, privileged: bool
    ) -> JsonObjectType:
        runtime = self._entry.runtime_data
        satellites = _satellite_lines(self._entry)
        requested: str = args.get("satellite", "").strip()
        if not requested:
            return _error(
                "create needs satellite: the entity id of the voice satellite the"
                f" conversation runs on. {satellites}"
            )
        satellite = _resolve_satellite(self._entry, requested)
        if satellite is None:
            return _error(f"unknown satellite {requested!r}. {satellites}")
        try:
            conversation_id = await runtime.control.async_start(
                satellite,
                args.get("system_prompt") or None,
                owner=_user_id(llm_context),
                context=_context(llm_context),
                privileged=privileged,
                origin_device_id=llm_context.device_id,
            )
        except NotAllowedError as err:
            return _error(
                _REFUSED_START.get(err.translation_key or "", _NOT_YOURS).format(
                    satellite=satellite
                )
            )
        except RtVoiceError as err:
            return _error(f"could not create the conversation: {err}. {satellites}")
        return {
            "id": conversation_id,
            "satellite": satellite,
            "result": (
                f"Created realtime conversation {conversation_id} on {satellite}. What"
                " it says is spoken there. Text you send with action=send interrupts"
                " its current round."
            ),
        }

    def _not_live(self, conversation_id: str) -> JsonObjectType:
        """Explain why an id is not a running conversation (ended or unknown)."""
        if self._entry.runtime_data.control.knows(conversation_id):
            return _error(
                f"conversation {conversation_id} has ended; read its transcript with"
                f" {TOOL_TRANSCRIPT}, or create a new one."
            )
        return self._unknown(conversation_id)

    async def _async_send(
        self, args: dict[str, Any], context: Context
    ) -> JsonObjectType:
        conversation_id: str = args.get("id", "")
        text: str = args.get("text", "")
        if not conversation_id or not text.strip():
            return _error("send needs id and a non-blank text.")
        try:
            seq = await self._entry.runtime_data.control.async_send(
                conversation_id, text, context
            )
        except UnknownConversationError:
            return self._not_live(conversation_id)
        return {
            "id": conversation_id,
            "seq": seq,
            "result": (
                f"Delivered (seq {seq}). This input interrupts the conversation's"
                " current round; it answers the new text right away."
            ),
        }

    async def _async_stop(self, args: dict[str, Any]) -> JsonObjectType:
        conversation_id: str = args.get("id", "")
        if not conversation_id:
            return _error("stop needs id.")
        try:
            messages = await self._entry.runtime_data.control.async_stop(
                conversation_id
            )
        except UnknownConversationError:
            return self._not_live(conversation_id)
        if messages == 0:
            result = (
                f"Stopped conversation {conversation_id}; nothing was said, so there"
                " is no transcript to hand off."
            )
        else:
            result = (
                f"Stopped conversation {conversation_id}. Its transcript of {messages}"
                " messages is handed off to you: decide what is worth keeping. Read it"
                f" with {TOOL_TRANSCRIPT}(id={conversation_id}, offset, limit) page by"
                " page instead of loading it all."
            )
        return {"id": conversation_id, "messages": messages, "result": result}


class RtTranscriptTool(_EntryTool):
    """``rt_transcript``: one page of a conversation's transcript."""

    name = TOOL_TRANSCRIPT
    description = (
        "Read the transcript of a realtime conversation (running or stopped), one page"
        " at a time: offset = first message, limit = how many, format text (one line"
        " per message) or raw (JSON messages)."
    )
    parameters = vol.Schema(
        {
            vol.Required("id", description="Conversation id."): cv.string,
            vol.Optional(
                "offset", default=0, description="First message (0 = the start)."
            ): vol.All(vol.Coerce(int), vol.Range(min=0)),
            vol.Optional(
                "limit",
                default=DEFAULT_PAGE_LIMIT,
                description=f"Messages per page, at most {MAX_PAGE_LIMIT}.",
            ): vol.All(vol.Coerce(int), vol.Range(min=1, max=MAX_PAGE_LIMIT)),
            vol.Optional(
                "format", default=FORMAT_TEXT, description="text or raw."
            ): vol.In(TRANSCRIPT_FORMATS),
        },
        extra=vol.REMOVE_EXTRA,
    )

    async def async_call(
        self,
        hass: HomeAssistant,
        tool_input: llm.ToolInput,
        llm_context: llm.LLMContext,
    ) -> JsonObjectType:
        """Return the page, or an ``error`` result."""
        args = self._ready(tool_input)
        if isinstance(args, str):
            return _error(args)
        if not await _async_privileged(hass, llm_context):
            return _error(_NOT_ADMIN)
        conversation_id: str = args["id"]
        offset: int = args["offset"]
        try:
            page = self._entry.runtime_data.control.transcript(
                conversation_id, offset, args["limit"], args["format"]
            )
        except UnknownConversationError:
            return self._unknown(conversation_id)
        total: int = page["total"]
        if offset >= total > 0:
            return _error(
                f"offset {offset} is past the end: conversation {conversation_id} has"
                f" {total} messages (offsets 0 to {total - 1})."
            )
        end = min(offset + args["limit"], total)
        if end < total:
            page["next_offset"] = end
        return page


def _satellite_label(entry: RtVoiceConfigEntry, entity_id: str) -> str:
    info = entry.runtime_data.satellites.info(entity_id)
    if info is None:
        return entity_id
    details = [info.name] if info.name else []
    if info.area:
        details.append(f"area {info.area}")
    return f"{entity_id} ({', '.join(details)})" if details else entity_id


def _satellite_lines(entry: RtVoiceConfigEntry) -> str:
    """Which satellites exist, in one sentence for the model."""
    satellites = entry.runtime_data.satellites.satellites()
    if not satellites:
        return "There is no voice satellite in Home Assistant right now."
    labels = ", ".join(_satellite_label(entry, s) for s in satellites)
    return f"Available satellites: {labels}."


def _resolve_satellite(entry: RtVoiceConfigEntry, requested: str) -> str | None:
    """Find a satellite by entity id or by its unique name (any case)."""
    directory = entry.runtime_data.satellites
    satellites = directory.satellites()
    if requested in satellites:
        return requested
    wanted = requested.casefold()
    matches = [
        s
        for s in satellites
        if (info := directory.info(s)) is not None and info.name.casefold() == wanted
    ]
    return matches[0] if len(matches) == 1 else None


class RtVoiceControlAPI(llm.API):
    """The control plane of one entry as an HA LLM API."""

    def __init__(self, hass: HomeAssistant, entry: RtVoiceConfigEntry) -> None:
        """Create the API of ``entry``."""
        super().__init__(hass=hass, id=api_id(entry), name=api_name(entry))
        self.entry = entry

    async def async_get_api_instance(
        self, llm_context: llm.LLMContext
    ) -> llm.APIInstance:
        """Return the tools and the prompt that explains them (with the satellites)."""
        prompt = API_PROMPT.format(
            children=TOOL_CHILDREN, transcript=TOOL_TRANSCRIPT, limit=DEFAULT_PAGE_LIMIT
        )
        if self.entry.state is ConfigEntryState.LOADED:
            prompt += "\n" + _satellite_lines(self.entry)
        return llm.APIInstance(
            api=self,
            api_prompt=prompt,
            llm_context=llm_context,
            tools=[RtChildrenTool(self.entry), RtTranscriptTool(self.entry)],
        )


@callback
def async_register_control_api(
    hass: HomeAssistant, entry: RtVoiceConfigEntry
) -> Callable[[], None]:
    """Register the entry's control API; returns the callable that removes it."""
    return llm.async_register_api(hass, RtVoiceControlAPI(hass, entry))
