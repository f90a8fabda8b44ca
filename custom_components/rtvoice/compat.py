"""Every Home Assistant version difference of DESIGN §8, in one place.

Home Assistant 2025.4 is what runs (and is tested) here; 2026.x cannot be installed
on these machines but must work too. Each difference is guarded by *feature
detection* (``getattr``/``hasattr``/a signature check/a try-import), never by
comparing version numbers, so an intermediate release that has one change but not
another still takes the right branch for each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
import dataclasses
from datetime import date, datetime, time
from decimal import Decimal
import enum
import functools
import inspect
import json
import logging
from typing import Any

from homeassistant.components import conversation
from homeassistant.core import Context, HomeAssistant
from homeassistant.helpers import llm

from .const import DOMAIN

_LOGGER = logging.getLogger(__name__)

# The exposure settings the Assist API filters by belong to the "conversation"
# assistant; an LLM context naming it only reaches exposed entities.
ASSISTANT = conversation.DOMAIN


# ── ConversationInput.satellite_id (2026.x only) ──────────────────────────────


def satellite_id(user_input: Any) -> str | None:
    """Return the satellite entity id of a conversation input, if HA provides it.

    ``ConversationInput.satellite_id`` exists from 2026.x on; 2025.4 has no such
    field, so this returns None there.
    """
    value = getattr(user_input, "satellite_id", None)
    return value if isinstance(value, str) and value else None


# ── llm.LLMContext (fields changed: user_prompt gone, agent_id added) ─────────


def llm_context(
    hass: HomeAssistant | None, source: Any, platform: str = DOMAIN
) -> llm.LLMContext:
    """Build the ``llm.LLMContext`` for a conversation input or a turn context.

    ``source`` is a ``ConversationInput`` or anything with the same attribute names
    (``context``, ``language``, ``device_id``, optionally ``text``, ``agent_id``,
    ``satellite_id``), e.g. ``brain.TurnContext``. An input that knows how to build
    its own context (``as_llm_context``, newer HA) is asked to; otherwise the context
    is built from the fields ``llm.LLMContext`` has in this HA version. Fields this
    function does not know and that have no default are set to None.
    """
    as_llm_context = getattr(source, "as_llm_context", None)
    if callable(as_llm_context):
        result: llm.LLMContext = as_llm_context(platform)
        return result

    language = getattr(source, "language", None)
    if not language and hass is not None:
        language = hass.config.language
    known: dict[str, Any] = {
        "platform": platform,
        "context": getattr(source, "context", None),
        "user_prompt": getattr(source, "text", None),
        "language": language,
        "assistant": ASSISTANT,
        "device_id": getattr(source, "device_id", None),
        "agent_id": getattr(source, "agent_id", None),
        "satellite_id": satellite_id(source),
    }
    context_cls = llm.LLMContext  # looked up now: tests swap in other HA shapes
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(context_cls):
        if not field.init:
            continue
        if field.name in known:
            kwargs[field.name] = known[field.name]
        elif (
            field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        ):
            kwargs[field.name] = None
    return context_cls(**kwargs)


# ── tool results: a dict (2025.4) or an llm.ToolResult-like object (2026.x) ───


def _jsonable(value: Any) -> Any:
    """Serialise what ``json`` cannot: HA objects, enums, dates and sets."""
    as_dict = getattr(value, "as_dict", None)
    if callable(as_dict):
        return as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def tool_result_to_text(result: Any) -> str:
    """Return a tool result as the JSON text the model reads.

    Accepts a plain dict (HA 2025.4 returns ``JsonObjectType``, sometimes a dict
    subclass), an object that can describe itself (``as_dict()``, a dataclass — the
    shape of ``llm.ToolResult`` in newer HA), a string (passed through) or any
    other JSON-able value.
    """
    if isinstance(result, str):
        return result
    payload: Any
    if isinstance(result, Mapping):
        payload = dict(result)
    elif result is None or isinstance(result, (list, int, float, bool)):
        payload = result
    else:
        payload = _jsonable(result)
    return json.dumps(payload, ensure_ascii=False, default=_jsonable)


# ── schema conversion: voluptuous_openapi.convert -> probatio.to_openapi ──────


@functools.cache
def schema_converter() -> Callable[..., dict[str, Any]]:
    """Return the schema converter of this HA version (looked up once).

    Newer HA validates with ``probatio`` and converts with ``probatio.to_openapi``;
    2025.4 uses ``voluptuous_openapi.convert``. A failing import searches the disk,
    so it is tried once per process, not per tool.
    """
    try:
        from probatio import to_openapi  # noqa: PLC0415
    except ImportError:
        from voluptuous_openapi import convert  # noqa: PLC0415

        return convert  # type: ignore[no-any-return]
    return to_openapi  # type: ignore[no-any-return]


def convert_schema(
    schema: Any, custom_serializer: Callable[[Any], Any] | None = None
) -> dict[str, Any]:
    """Convert a tool's parameter schema to a JSON schema (OpenAPI flavour)."""
    convert = schema_converter()
    if custom_serializer is None:
        return convert(schema)
    return convert(schema, custom_serializer=custom_serializer)


# ── conversation.async_converse (satellite_id keyword in 2026.x only) ─────────


def _accepted_keywords(func: Callable[..., Any]) -> frozenset[str] | None:
    """Return the keyword names ``func`` accepts; None when it takes ``**kwargs``.

    Not cached: the callable may be unhashable, and it is one check per round.
    """
    parameters = inspect.signature(func).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(
        p.name
        for p in parameters
        if p.kind
        in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


async def async_converse(
    hass: HomeAssistant,
    *,
    text: str,
    conversation_id: str | None,
    context: Any,
    language: str | None = None,
    agent_id: str | None = None,
    device_id: str | None = None,
    satellite_id: str | None = None,
    extra_system_prompt: str | None = None,
) -> conversation.ConversationResult:
    """Call ``conversation.async_converse`` with keywords only.

    Keywords this HA version's ``async_converse`` does not have (``satellite_id``
    on 2025.4, where ``ConversationInput`` rejects it) are left out.
    """
    func = conversation.async_converse  # looked up now: wrapped in tests
    kwargs: dict[str, Any] = {
        "text": text,
        "conversation_id": conversation_id,
        "context": context,
        "language": language,
        "agent_id": agent_id,
        "device_id": device_id,
        "satellite_id": satellite_id,
        "extra_system_prompt": extra_system_prompt,
    }
    accepted = _accepted_keywords(func)
    if accepted is not None:
        for name in [name for name in kwargs if name not in accepted]:
            if kwargs.pop(name) is not None:
                _LOGGER.debug("async_converse has no %s parameter; not passed", name)
    result: conversation.ConversationResult = await func(hass, **kwargs)
    return result


# ── streaming TTS of the chat log (2026.x) ────────────────────────────────────


@functools.cache
def tts_streams_answers() -> bool:
    """Whether the pipeline's TTS speaks an answer while it streams.

    HA 2026.x feeds the chat log's deltas into TTS (``ResultStream`` grew
    ``async_set_message_stream``); 2025.4 speaks only the finished answer.
    """
    from homeassistant.components import tts  # noqa: PLC0415 - only when asked

    result_stream = getattr(tts, "ResultStream", None)
    return hasattr(result_stream, "async_set_message_stream")


# ── one sentence through a TTS engine (duplex mode) ──────────────────────────────


async def tts_synthesise(
    hass: HomeAssistant,
    engine: str,
    language: str | None,
    options: dict[str, Any],
    text: str,
) -> tuple[str, bytes]:
    """Return ``(extension, audio)`` of ``text`` spoken by ``engine``.

    HA 2025.4 and 2026.x both offer ``tts.async_create_stream`` (a ``ResultStream``
    with ``async_set_message``), which the pipeline uses; a release without it gets
    the media source path (``generate_media_source_id`` +
    ``async_get_media_source_audio``).
    """
    from homeassistant.components import tts  # noqa: PLC0415 - only when asked

    create_stream = getattr(tts, "async_create_stream", None)
    if create_stream is not None:
        stream = create_stream(hass, engine, language, options)
        if hasattr(stream, "async_set_message"):
            stream.async_set_message(text)
            audio = b"".join([chunk async for chunk in stream.async_stream_result()])
            return str(stream.extension), audio
    media_id = tts.generate_media_source_id(
        hass, text, engine=engine, language=language, options=options
    )
    extension, audio = await tts.async_get_media_source_audio(hass, media_id)
    return str(extension), bytes(audio)


# ── recognising a command without running it (the default agent's matcher) ────


_RECOGNISING = f"{DOMAIN}_intent_recognition_running"


def intent_recogniser(
    hass: HomeAssistant, language: Callable[[], str | None]
) -> Callable[[str], Awaitable[bool]]:
    """Return ``recognise(text)``: whether HA's own intent matching knows the command.

    Asks the default agent's ``async_recognize_intent`` (2025.4; 2026.x keeps it)
    with ``strict_intents_only`` where it exists (exposed entities, no fuzzy
    match), never ``async_handle_intents``: nothing is executed. A missing agent
    or method, or any error, is "not recognised" (the words alone then decide).
    ``ConversationInput`` is built from the fields this version has (2026.x
    requires ``satellite_id``; 2025.4 rejects it).

    One recognition at a time in this Home Assistant: the matcher runs in an
    executor thread and costs CPU (0.5 s for a short command on a test machine);
    while one runs, another satellite's pause is "not recognised" at once rather
    than queueing a second (its hangover ends that turn, as without the matcher).
    """

    async def recognise(text: str) -> bool:
        if hass.data.get(_RECOGNISING):
            _LOGGER.debug("Intent recognition busy: the words alone decide")
            return False
        hass.data[_RECOGNISING] = True
        try:
            return await _recognise(text)
        finally:
            hass.data[_RECOGNISING] = False

    async def _recognise(text: str) -> bool:
        try:
            agent = conversation.async_get_agent(hass)
        except (KeyError, AttributeError):  # conversation not set up (yet)
            return False
        method = getattr(agent, "async_recognize_intent", None)
        if method is None:
            return False
        values: dict[str, Any] = {
            "text": text,
            "context": Context(),
            "conversation_id": None,
            "device_id": None,
            "satellite_id": None,
            "language": language() or hass.config.language,
            "agent_id": conversation.HOME_ASSISTANT_AGENT,
            "extra_system_prompt": None,
        }
        names = {f.name for f in dataclasses.fields(conversation.ConversationInput)}
        user_input = conversation.ConversationInput(
            **{k: v for k, v in values.items() if k in names}
        )
        kwargs: dict[str, Any] = {}
        accepted = _accepted_keywords(method)
        if accepted is None or "strict_intents_only" in accepted:
            kwargs["strict_intents_only"] = True
        result = await method(user_input, **kwargs)
        return result is not None and getattr(result, "intent", None) is not None

    return recognise
