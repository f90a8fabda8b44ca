"""The control plane: start, send to, stop, list and read conversations.

DESIGN §4.8 / §5.4. One ``ControlPlane`` per entry serves both the ``rtvoice.*``
actions (``services``) and the control LLM API (``control_api``); each of them only
turns its callers' input into these calls and the errors into its own messages.

Who may do what is decided here too (``async_is_privileged``, ``may_control``,
``async_check_start``), so the actions and the LLM API apply one policy
(docs/actions.md, "Who may call what"): administrators may do everything, and so may
actions called without a user (automations, scripts); the control LLM API called
without a user (a satellite's speaker talking to the main agent) may not. Any other
user may start conversations (on a satellite only as ``assist_satellite`` would let
them, never with instructions of their own, never replacing someone else's) and send
to / stop the ones that belong to them, and may not list them or read transcripts.

Every input runs its tools with the Home Assistant ``Context`` of whoever gave it
(``async_send``, ``async_start``): Home Assistant's own permission checks apply to
the service calls the tools make, and those calls carry that user's id.

Answers of inputs sent here (``send``) are spoken on the satellite with
``assist_satellite.announce`` when the satellite supports announcements; otherwise
they are only kept in the transcript.

Duplex satellites (ESPHome and Wyoming satellites this entry owns) run their
conversations on their own links; the ``SessionManager`` indexes them, so they
are listed, sent to, stopped and read here like any other. Starting one on a duplex
ESPHome satellite opens the satellite's duplex conversation (``DuplexSatellites``)
and returns its id; an input sent to one while its session listens is answered on
the satellite by that session; while it waits for a wake word, the answer is
spoken with ``assist_satellite.start_conversation`` and the satellite listens for
the reply, in the same conversation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import asdict
from functools import partial
import logging
from typing import Any, Final

from homeassistant.auth.permissions.const import POLICY_CONTROL
from homeassistant.components.assist_satellite.const import PREANNOUNCE_URL
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import Context, HomeAssistant, callback
from homeassistant.exceptions import HomeAssistantError

from .const import DOMAIN
from .duplex_ha import DuplexSatellites
from .errors import (
    NotAllowedError,
    RtVoiceError,
    UnknownConversationError,
    UnknownSatelliteError,
)
from .kernel import Kernel, KernelError, Outcome, Ticket, format_transcript
from .satellites.directory import SATELLITE_DOMAIN, SatelliteDirectory
from .sessions import DuplexHandle, SessionManager

_LOGGER = logging.getLogger(__name__)

FORMAT_TEXT: Final = "text"
FORMAT_RAW: Final = "raw"
TRANSCRIPT_FORMATS: Final = (FORMAT_TEXT, FORMAT_RAW)
MAX_PAGE_LIMIT: Final = 500
# At most this many names (satellites) are listed in a message.
MAX_IDS_IN_MESSAGE: Final = 50
FEATURE_ANNOUNCE: Final = "announce"
FEATURE_START_CONVERSATION: Final = "start_conversation"


async def async_is_privileged(
    hass: HomeAssistant, user_id: str | None, *, trust_no_user: bool = True
) -> bool:
    """Whether a caller may see and control every conversation.

    True for administrators; for calls without a user when ``trust_no_user`` (the
    actions: automations, scripts started by the system); False for other users and
    unknown ids. The control LLM API passes ``trust_no_user=False``: without a user
    its caller may be anyone speaking at a satellite.
    """
    if not user_id:
        return trust_no_user
    user = await hass.auth.async_get_user(user_id)
    return user is not None and user.is_admin


def id_list(ids: Iterable[str], limit: int = MAX_IDS_IN_MESSAGE) -> str:
    """Names for a message: comma separated, at most ``limit``, "none" when empty.

    Only for what every caller may see (satellites); never for conversation ids.
    """
    ids = list(ids)
    if not ids:
        return "none"
    text = ", ".join(ids[:limit])
    if len(ids) > limit:
        text += f" … (+{len(ids) - limit} more)"
    return text


class ControlPlane:
    """The parent's side of one entry's conversations."""

    def __init__(
        self,
        hass: HomeAssistant,
        entry: ConfigEntry,
        kernel: Kernel,
        sessions: SessionManager,
        satellites: SatelliteDirectory,
        *,
        duplex: DuplexSatellites | None = None,
    ) -> None:
        """Serve the conversations of ``sessions`` (on ``kernel``).

        ``duplex``: the entry's duplex ESPHome satellites (conversations started
        on them are theirs).
        """
        self._hass = hass
        self._entry = entry
        self._kernel = kernel
        self._sessions = sessions
        self._satellites = satellites
        self._duplex = duplex
        self._announce_tasks: set[asyncio.Task[None]] = set()
        self._shut_down = False

    async def async_start(
        self,
        satellite: str | None,
        system_prompt: str | None = None,
        owner: str | None = None,
        message: str | None = None,
        *,
        context: Context | None = None,
        privileged: bool = True,
        origin_device_id: str | None = None,
    ) -> str:
        """Start a conversation (on a satellite, else on an ad-hoc pair); its id.

        ``owner``: the user who asked for it (they may send to it and stop it).
        ``context``: the caller's, with which the conversation's first inputs run
        their tools (until the next input brings its own). ``privileged``:
        ``async_is_privileged`` of the caller; who else may start what is
        ``async_check_start`` (``origin_device_id``: the device the caller speaks
        from, when known).
        On a satellite that can start conversations, the satellite then speaks
        ``message`` (or plays its chime when there is none) and listens: the user's
        answer continues this conversation. One that can only announce speaks the
        message. The model is told what the satellite said.

        Raises ``UnknownSatelliteError`` for a satellite the entry does not know,
        ``NotAllowedError`` when the caller may not start it there (nothing is
        closed), ``RtVoiceError`` when the kernel refuses the conversation.
        """
        info = self._satellites.info(satellite) if satellite is not None else None
        if satellite is not None and info is None:
            raise UnknownSatelliteError(
                f"unknown satellite {satellite!r}"
                f" (known: {id_list(self._satellites.satellites(), limit=50)})"
            )
        context = context if context is not None else Context()
        if not privileged and satellite is not None:
            await self.async_check_start(
                satellite,
                context,
                system_prompt=system_prompt,
                origin_device_id=origin_device_id,
            )
        if (
            satellite is not None
            and info is not None
            and self._duplex is not None
            and (key := self._duplex.key_for(satellite)) is not None
        ):
            return await self._async_start_duplex(
                key,
                satellite,
                features=info.features,
                system_prompt=system_prompt,
                owner=owner,
                message=message,
            )
        language = (info.language if info else None) or self._hass.config.language
        opening = (
            f'You opened this conversation by saying: "{message}"' if message else None
        )
        try:
            conversation_id = await self._sessions.async_open(
                satellite,
                system_prompt,
                language,
                owner,
                extra_prompt=opening,
                context=context,
            )
        except KernelError as err:
            raise RtVoiceError(str(err)) from err
        if satellite is not None and info is not None:
            self._start_speaking(conversation_id, satellite, info.features, message)
        return conversation_id

    async def _async_start_duplex(
        self,
        key: str,
        satellite: str,
        *,
        features: Iterable[str],
        system_prompt: str | None,
        owner: str | None,
        message: str | None,
    ) -> str:
        """Open the duplex satellite's conversation; the satellite then speaks first."""
        assert self._duplex is not None
        features = set(features)
        speaks = FEATURE_START_CONVERSATION in features or (
            bool(message) and FEATURE_ANNOUNCE in features
        )
        try:
            conversation_id = await self._duplex.async_open(
                key,
                system_prompt=system_prompt,
                said=message if speaks else None,
                owner=owner,
            )
        except HomeAssistantError as err:
            raise RtVoiceError(f"satellite {satellite} is not connected") from err
        self._start_speaking(conversation_id, satellite, features, message)
        return conversation_id

    def _start_speaking(
        self,
        conversation_id: str,
        satellite: str,
        features: Iterable[str],
        message: str | None,
    ) -> None:
        """Let the satellite speak first and then listen (when it can)."""
        features = set(features)
        if FEATURE_START_CONVERSATION in features:
            data: dict[str, Any] = (
                {"start_message": message}
                if message
                else {"start_media_id": PREANNOUNCE_URL, "preannounce": False}
            )
            service = "start_conversation"
        elif message and FEATURE_ANNOUNCE in features:
            data = {"message": message}
            service = "announce"
        else:
            return
        task = self._entry.async_create_background_task(
            self._hass,
            self._async_satellite_call(satellite, service, data),
            f"{DOMAIN} {service} {conversation_id}",
        )
        self._announce_tasks.add(task)
        task.add_done_callback(self._announce_tasks.discard)

    async def async_check_start(
        self,
        satellite: str,
        context: Context,
        *,
        system_prompt: str | None,
        origin_device_id: str | None = None,
    ) -> None:
        """Refuse an unprivileged caller's start on a satellite it may not change.

        A satellite's conversation speaks to whoever is there: a caller who is
        neither an administrator nor an automation may start one only

        - as a user with the right to control the satellite's entity (what
          ``assist_satellite.start_conversation`` requires), or from the
          satellite itself (``origin_device_id``, e.g. the main agent asked there);
        - with the entry's instructions (no ``system_prompt`` of their own);
        - when the satellite has no conversation, or one that is theirs (from
          the satellite itself: any, it is the speaker's own).

        Raises ``NotAllowedError``; nothing is closed then.
        """
        info = self._satellites.info(satellite)
        from_there = (
            origin_device_id is not None
            and info is not None
            and info.device_id == origin_device_id
        )
        user = (
            await self._hass.auth.async_get_user(context.user_id)
            if context.user_id
            else None
        )
        if not from_there and (
            user is None or not user.permissions.check_entity(satellite, POLICY_CONTROL)
        ):
            raise NotAllowedError(
                context, "satellite_not_allowed", {"satellite": satellite}
            )
        if system_prompt:
            raise NotAllowedError(
                context, "satellite_prompt_admin_only", {"satellite": satellite}
            )
        running = self._sessions.running_on(satellite)
        if (
            not from_there
            and running is not None
            and (user is None or self._sessions.owner(running) != user.id)
        ):
            raise NotAllowedError(context, "satellite_busy", {"satellite": satellite})

    async def async_send(
        self, conversation_id: str, text: str, context: Context
    ) -> int:
        """Push ``text`` as the caller of ``context`` (its tools run as them).

        Raises as ``send``; the conversation's tools are prepared for the caller
        first (their user, the conversation's device and language).
        """
        if text.strip():
            await self._sessions.async_act_as(conversation_id, context)
        return self.send(conversation_id, text)

    def send(self, conversation_id: str, text: str) -> int:
        """Push ``text`` into a live conversation (interrupting it); the input seq.

        The tools run with the context of the conversation's current turn; the
        actions and the LLM API call ``async_send`` to run them as their caller.
        Raises ``EmptyInputError`` for blank text, ``UnknownConversationError`` when
        no live conversation has the id.
        """
        ticket = self._sessions.push(conversation_id, text)
        if (handle := self._sessions.duplex_handle(conversation_id)) is not None:
            if not handle.live:  # a live session speaks the answer itself
                ticket.outcome.add_done_callback(
                    partial(self._duplex_round_done, conversation_id, handle)
                )
            return ticket.seq
        ticket.outcome.add_done_callback(
            partial(
                self._sent_round_done, self._sessions.resolve(conversation_id), ticket
            )
        )
        return ticket.seq

    async def async_stop(self, conversation_id: str) -> int:
        """Close a live conversation with hand-off; the number of messages handed off.

        Raises ``UnknownConversationError`` when no live conversation has the id.
        """
        return await self._sessions.async_close(conversation_id)

    def list_conversations(self) -> list[dict[str, Any]]:
        """Live conversations: id, satellite, device, state and the kernel's counters."""
        return [
            {
                "id": conversation.id,
                "satellite": conversation.satellite,
                "device_id": conversation.device_id,
                "state": conversation.stats.state,
                "stats": {
                    key: value
                    for key, value in asdict(conversation.stats).items()
                    if key not in ("id", "state")
                },
            }
            for conversation in self._sessions.conversations()
        ]

    def transcript(
        self, conversation_id: str, offset: int, limit: int, fmt: str
    ) -> dict[str, Any]:
        """One transcript page: ``conversation_id``, ``offset``, ``total``, ``transcript``.

        ``transcript`` is the text rendering (one line per message) or, for ``raw``,
        the list of messages as JSON objects. Raises ``UnknownConversationError`` for
        an id that is neither live nor archived.
        """
        child_id = self._sessions.resolve(conversation_id)
        try:
            page = self._kernel.transcript_page_data(child_id, offset, limit)
        except KernelError as err:
            raise UnknownConversationError(str(err)) from err
        transcript: Any = (
            format_transcript(page.messages)
            if fmt == FORMAT_TEXT
            else page.as_dict()["messages"]
        )
        return {
            "conversation_id": conversation_id,
            "offset": offset,
            "total": page.total,
            "transcript": transcript,
        }

    def may_control(
        self, conversation_id: str, user_id: str | None, *, privileged: bool
    ) -> bool:
        """Whether a caller may send to / stop a live conversation.

        ``privileged`` is ``async_is_privileged`` of the caller. Others only control
        the conversations that belong to them.
        """
        return privileged or (
            user_id is not None and self._sessions.owner(conversation_id) == user_id
        )

    def is_on_device(self, conversation_id: str, device_id: str | None) -> bool:
        """Whether a live conversation runs on the satellite of ``device_id``."""
        satellite = self._sessions.satellite(conversation_id)
        info = self._satellites.info(satellite) if satellite is not None else None
        return (
            device_id is not None and info is not None and info.device_id == device_id
        )

    def question(self, conversation_id: str, question_id: str) -> str | None:
        """Return what a conversation asked its parent (None: not known here)."""
        return self._sessions.question(conversation_id, question_id)

    def known_ids(self) -> list[str]:
        """Ids of live and archived conversations."""
        return self._sessions.known_ids()

    def knows(self, conversation_id: str) -> bool:
        """Whether the id names a live conversation (any of its ids) or an archive."""
        return self._sessions.knows(conversation_id)

    async def async_shutdown(self) -> None:
        """Stop announcing; wait for announcements under way to end."""
        self._shut_down = True
        for task in self._announce_tasks:
            task.cancel()
        if self._announce_tasks:
            await asyncio.wait(self._announce_tasks)

    # ── speaking the answers of sent inputs ───────────────────────────────

    @callback
    def _sent_round_done(
        self, conversation_id: str, ticket: Ticket, future: asyncio.Future[Outcome]
    ) -> None:
        """Speak the answer of a control-plane input on its satellite."""
        if future.cancelled():  # pragma: no cover - nobody cancels the outcome
            return
        outcome = future.result()
        if outcome.status != "completed" or self._shut_down:
            return
        satellite = self._sessions.satellite(conversation_id)
        if (
            satellite is None
            or (info := self._satellites.info(satellite)) is None
            or FEATURE_ANNOUNCE not in info.features
            or not (speech := self._sessions.spoken(conversation_id, ticket, outcome))
        ):
            return
        task = self._entry.async_create_background_task(
            self._hass,
            self._async_announce(satellite, speech),
            f"{DOMAIN} announce {conversation_id}",
        )
        self._announce_tasks.add(task)
        task.add_done_callback(self._announce_tasks.discard)

    @callback
    def _duplex_round_done(
        self,
        conversation_id: str,
        handle: DuplexHandle,
        future: asyncio.Future[Outcome],
    ) -> None:
        """Speak the answer to an idle duplex conversation; the satellite listens then."""
        if future.cancelled():  # pragma: no cover - nobody cancels the outcome
            return
        outcome = future.result()
        if (
            outcome.status != "completed"
            or self._shut_down
            or not outcome.text.strip()
            or (satellite := self._sessions.satellite(conversation_id)) is None
            or not handle.continue_next_start()
        ):
            return
        task = self._entry.async_create_background_task(
            self._hass,
            self._async_satellite_call(
                satellite,
                "start_conversation",
                {"start_message": outcome.text, "preannounce": False},
            ),
            f"{DOMAIN} start_conversation {conversation_id}",
        )
        self._announce_tasks.add(task)
        task.add_done_callback(self._announce_tasks.discard)

    async def _async_announce(self, satellite: str, text: str) -> None:
        await self._async_satellite_call(satellite, "announce", {"message": text})

    async def _async_satellite_call(
        self, satellite: str, service: str, data: dict[str, Any]
    ) -> None:
        """Call an ``assist_satellite`` action on one satellite; log a failure once."""
        try:
            await self._hass.services.async_call(
                SATELLITE_DOMAIN,
                service,
                data,
                target={"entity_id": satellite},
                blocking=True,
            )
        except Exception as err:  # noqa: BLE001 - a satellite's failure is logged, never raised into the loop
            _LOGGER.warning(
                "%s on %s failed: %s", service, satellite, type(err).__name__
            )
