"""The kernel's ``ToolRunner`` over a Home Assistant LLM API (Assist by default).

The kernel runs every tool call itself, each inside a critical section (DESIGN §5.3):
never through the chat log's own runner, which HA's cancellation could cut short.
Per conversation (kernel child) the runner keeps the ``llm.APIInstance`` built for
that conversation's current turn (user context, language, device), so a tool acts
with the rights and the area of the satellite that asked, and only on the entities
exposed to Assist: the LLM context names the ``conversation`` assistant, whose
exposure settings HA's Assist API enforces when it matches targets.

A turn's context carries the user whose input it is (the Assist user, the caller
of ``rtvoice.send``; none for a satellite's own turn): HA's permission checks apply
to the service calls the tools make. HA's intent tools run those calls in a task
whose ``Unauthorized`` they do not report (2025.4 answers "action_done"); the runner
checks the entities such a result names against the user's permissions and gives
the model the refusal instead (``_refusal``), so it does not claim a change that
Home Assistant refused.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import logging
from typing import TYPE_CHECKING, Any

import voluptuous as vol

from homeassistant.auth.permissions.const import POLICY_CONTROL
from homeassistant.core import HomeAssistant
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers import llm

from . import compat
from .const import DEFAULT_LLM_HASS_API, DOMAIN, PROMPT_OWNER_HASS
from .kernel import PromptRegistry, PromptSection, ToolCall, ToolSpec, current_child_id

if TYPE_CHECKING:
    from .turn import TurnContext

_LOGGER = logging.getLogger(__name__)

# HA's LLM API prompt names the device's area and what it can do, so it is one
# section per conversation, in that conversation's prompt scope.
API_PROMPT_SECTION_PREFIX = f"{PROMPT_OWNER_HASS}.llm_api."
API_PROMPT_ORDER = 100


def api_prompt_section(child_id: str) -> str:
    """Return the name of the LLM API prompt section of one conversation."""
    return f"{API_PROMPT_SECTION_PREFIX}{child_id}"


def error_text(error: BaseException | str) -> str:
    """Return a tool error as the JSON text the model reads.

    Same shape as Home Assistant's own chat log uses for failed tool calls.
    """
    if isinstance(error, str):
        return json.dumps({"error": error}, ensure_ascii=False)
    result = {"error": type(error).__name__}
    if text := str(error):
        result["error_text"] = text
    return json.dumps(result, ensure_ascii=False)


@dataclass
class _Prepared:
    """The API instance of one conversation's current turn and its tool specs."""

    instance: llm.APIInstance
    specs: list[ToolSpec]


@dataclass(frozen=True)
class _Converted:
    """A tool's parameter schema and description with the spec made from them."""

    parameters: Any
    description: str
    spec: ToolSpec


class HaToolRunner:
    """Runs the tools of one HA LLM API for every conversation of an entry.

    ``async_prepare`` (before each input) fetches the API instance for the turn;
    ``specs``/``call`` serve the child whose round is running
    (``kernel.current_child_id()``). Every HA error becomes a readable error result;
    nothing a tool does can crash a round.
    """

    def __init__(
        self,
        hass: HomeAssistant,
        prompts: PromptRegistry | None = None,
        api_id: str | list[str] = DEFAULT_LLM_HASS_API,
        *,
        platform: str = DOMAIN,
    ) -> None:
        """Create a runner for the LLM API ``api_id``.

        ``prompts``: where each conversation's API prompt is declared, in the
        conversation's prompt scope.
        ``platform``: the integration named in the LLM context.
        """
        self.hass = hass
        self.api_id = api_id
        self._prompts = prompts
        self._platform = platform
        self._prepared: dict[str, _Prepared] = {}
        # Converted tools by (language, tool name): each turn gets a new API
        # instance, but its schemas rarely change, so a tool is converted again only
        # when its schema or description differs from the cached one.
        self._converted: dict[tuple[str, str], _Converted] = {}

    async def async_prepare(self, child_id: str, turn: TurnContext) -> None:
        """Fetch the API instance for ``child_id``'s turn; refresh its API prompt.

        The prompt is declared in the turn's prompt scope only: it names the area of
        the turn's device, which no other conversation may read. When the API cannot
        be had (e.g. it was unregistered) the conversation runs without tools (and
        without the API prompt) until the next successful prepare.
        """
        context = compat.llm_context(self.hass, turn, self._platform)
        try:
            instance = await llm.async_get_api(self.hass, self.api_id, context)  # type: ignore[arg-type]
        except HomeAssistantError as err:
            _LOGGER.warning(
                "LLM API %s is not available, conversation %s has no tools: %s",
                self.api_id,
                child_id,
                err,
            )
            self.forget(child_id)
            return
        self._prepared[child_id] = _Prepared(instance, self._convert(instance))
        if self._prompts is not None:
            # Plain text handed to the kernel, which only concatenates sections: it
            # never goes through HA templating, so "{{" in an entity name or an
            # alias stays as it is.
            self._prompts.declare(
                PromptSection(
                    section=api_prompt_section(child_id),
                    owner=PROMPT_OWNER_HASS,
                    content=instance.api_prompt,
                    order=API_PROMPT_ORDER,
                    scope=turn.prompt_scope or child_id,
                )
            )

    def _convert(self, instance: llm.APIInstance) -> list[ToolSpec]:
        """Return the API's tools as kernel specs (names exactly as HA gives them).

        A tool whose schema and description equal the cached ones (same language)
        reuses its converted spec.
        """
        language = instance.llm_context.language or ""
        specs: list[ToolSpec] = []
        for tool in instance.tools:
            description = tool.description or ""
            key = (language, tool.name)
            cached = self._converted.get(key)
            if (
                cached is not None
                and cached.description == description
                and cached.parameters == tool.parameters
            ):
                specs.append(cached.spec)
                continue
            try:
                parameters = compat.convert_schema(
                    tool.parameters, instance.custom_serializer
                )
            except Exception:  # one odd schema must not hide the rest
                _LOGGER.warning(
                    "Tool %s of LLM API %s has a schema that cannot be converted;"
                    " it is not offered",
                    tool.name,
                    self.api_id,
                    exc_info=True,
                )
                continue
            spec = ToolSpec(tool.name, description, parameters)
            self._converted[key] = _Converted(tool.parameters, description, spec)
            specs.append(spec)
        return specs

    def specs(self) -> list[ToolSpec]:
        """Tools for the conversation whose round is running (none if unprepared)."""
        child_id = current_child_id()
        prepared = self._prepared.get(child_id) if child_id is not None else None
        return list(prepared.specs) if prepared is not None else []

    async def call(self, call: ToolCall) -> str:
        """Run one tool call; the result (or the error) as JSON text."""
        return await self._call(current_child_id(), call)

    async def _call(self, child_id: str | None, call: ToolCall) -> str:
        prepared = self._prepared.get(child_id) if child_id is not None else None
        if prepared is None:
            return error_text(
                f"tool {call.name!r} is not available: no Home Assistant tools"
                " are prepared for this conversation"
            )
        tool_input = llm.ToolInput(
            tool_name=call.name, tool_args=dict(call.arguments), id=call.id
        )
        try:
            result: Any = await prepared.instance.async_call_tool(tool_input)
        except (HomeAssistantError, vol.Invalid) as err:
            _LOGGER.debug("Tool %s failed: %s", call.name, type(err).__name__)
            return error_text(err)
        except Exception as err:  # a broken tool is an error result
            _LOGGER.warning(
                "Tool %s raised %s", call.name, type(err).__name__, exc_info=True
            )
            return error_text(err)
        text = compat.tool_result_to_text(result)
        return await self._refusal(prepared.instance, text) or text

    async def _refusal(self, instance: llm.APIInstance, text: str) -> str | None:
        """Return an error result when the turn's user may not control a target.

        Only for a user who is not an administrator, and only for results that
        name the entities they acted on (``data.success``, the intent shape).
        """
        context = instance.llm_context.context
        user_id = context.user_id if context is not None else None
        if not user_id:
            return None
        try:
            data = json.loads(text).get("data") or {}
            targets = [
                t["id"]
                for t in data.get("success") or ()
                if t.get("type") == "entity" and isinstance(t.get("id"), str)
            ]
        except (ValueError, AttributeError, TypeError, KeyError):
            return None
        if not targets:
            return None
        user = await self.hass.auth.async_get_user(user_id)
        if user is not None and user.is_admin:
            return None
        refused = [
            entity_id
            for entity_id in targets
            if user is None
            or not user.permissions.check_entity(entity_id, POLICY_CONTROL)
        ]
        if not refused:
            return None
        _LOGGER.debug("Tool result for a user without control of %s", refused)
        return json.dumps(
            {
                "error": "Unauthorized",
                "error_text": (
                    "Home Assistant refused this: the user may not control "
                    + ", ".join(refused)
                    + ". Nothing was changed there; tell the user."
                ),
            },
            ensure_ascii=False,
        )

    def forget(self, child_id: str) -> None:
        """Drop what was prepared for a conversation, and its API prompt."""
        self._prepared.pop(child_id, None)
        if self._prompts is not None:
            self._prompts.remove(api_prompt_section(child_id))
