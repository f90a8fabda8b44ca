"""The options flow of an entry: how its conversations behave.

One form: the prompt, the LLM API for tools and the model's limits (an endpoint
brain), and the conversation settings every brain has. The ha_agent brain shows
no tool, temperature, context window or tool-turn options: the delegated agent
handles those itself. Satellites are not options: each is a config subentry of
the entry (``satellites``), added, reconfigured and deleted on the entry's page.
"""

from __future__ import annotations

from typing import Any

import voluptuous as vol

from homeassistant.config_entries import ConfigFlowResult, OptionsFlow
from homeassistant.core import HomeAssistant
from homeassistant.helpers import llm
from homeassistant.helpers.selector import (
    BooleanSelector,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
)

from .brain_check import brain_of
from .const import (
    BRAIN_OPENAI,
    CONF_CARRY_OVER,
    CONF_CHUNK_TIMEOUT,
    CONF_CONTEXT_WINDOW,
    CONF_FIRST_TOKEN_TIMEOUT,
    CONF_IDLE_TIMEOUT,
    CONF_LLM_HASS_API,
    CONF_MAX_ANSWER_CHARS,
    CONF_MAX_TOOL_TURNS,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    DEFAULT_CARRY_OVER,
    DEFAULT_CHUNK_TIMEOUT,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LLM_HASS_API,
    DEFAULT_MAX_ANSWER_CHARS,
    DEFAULT_MAX_TOOL_TURNS,
    DEFAULT_OPTIONS_HA_AGENT,
    DEFAULT_OPTIONS_OPENAI,
    DEFAULT_PROMPT,
    DEFAULT_TEMPERATURE,
    LLM_API_NONE,
    MAX_CHUNK_TIMEOUT,
    MAX_CONTEXT_WINDOW,
    MAX_FIRST_TOKEN_TIMEOUT,
    MAX_IDLE_TIMEOUT,
    MAX_MAX_ANSWER_CHARS,
    MAX_MAX_TOOL_TURNS,
    MAX_TEMPERATURE,
    MIN_CHUNK_TIMEOUT,
    MIN_CONTEXT_WINDOW,
    MIN_FIRST_TOKEN_TIMEOUT,
    MIN_IDLE_TIMEOUT,
    MIN_MAX_ANSWER_CHARS,
    MIN_MAX_TOOL_TURNS,
    MIN_TEMPERATURE,
)
from .control_api import API_ID_PREFIX as CONTROL_API_ID_PREFIX
from .flow_fields import number_selector


class RealtimeVoiceOptionsFlow(OptionsFlow):
    """The conversation settings of an entry (HA sets ``config_entry`` itself)."""

    async def async_step_init(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Show and store the settings."""
        brain = brain_of(self.config_entry)
        if user_input is not None:
            return self.async_create_entry(data=_options_from_input(brain, user_input))
        if brain == BRAIN_OPENAI:
            current = {**DEFAULT_OPTIONS_OPENAI, **self.config_entry.options}
            apis = _llm_api_choices(self.hass)
            if current[CONF_LLM_HASS_API] not in {api["value"] for api in apis}:
                # The stored API is gone (its integration was removed): offer Assist.
                current[CONF_LLM_HASS_API] = DEFAULT_LLM_HASS_API
            schema = _options_schema(apis)
        else:
            current = {**DEFAULT_OPTIONS_HA_AGENT, **self.config_entry.options}
            schema = _options_schema(None)
        return self.async_show_form(
            step_id="init",
            data_schema=self.add_suggested_values_to_schema(schema, current),
        )


def _llm_api_choices(hass: HomeAssistant) -> list[SelectOptionDict]:
    """Return the HA LLM APIs the model may use for tools, plus "none".

    Realtime Voice's own control APIs are left out: they control realtime
    conversations from the main assistant, and a realtime conversation that
    controls realtime conversations (itself among them) cannot work.
    """
    return [
        SelectOptionDict(value=LLM_API_NONE, label="No tools"),
        *(
            SelectOptionDict(value=api.id, label=api.name)
            for api in llm.async_get_apis(hass)
            if not api.id.startswith(CONTROL_API_ID_PREFIX)
        ),
    ]


def _options_schema(apis: list[SelectOptionDict] | None) -> vol.Schema:
    """Options schema; the model options only when ``apis`` (openai brain) is given."""
    schema: dict[vol.Marker, Any] = {vol.Optional(CONF_PROMPT): TemplateSelector()}
    if apis is not None:
        schema[vol.Required(CONF_LLM_HASS_API, default=DEFAULT_LLM_HASS_API)] = (
            SelectSelector(
                SelectSelectorConfig(options=apis, mode=SelectSelectorMode.DROPDOWN)
            )
        )
        schema[vol.Required(CONF_CONTEXT_WINDOW, default=DEFAULT_CONTEXT_WINDOW)] = (
            number_selector(MIN_CONTEXT_WINDOW, MAX_CONTEXT_WINDOW, unit="tokens")
        )
        schema[vol.Required(CONF_MAX_TOOL_TURNS, default=DEFAULT_MAX_TOOL_TURNS)] = (
            number_selector(MIN_MAX_TOOL_TURNS, MAX_MAX_TOOL_TURNS)
        )
        schema[
            vol.Required(CONF_MAX_ANSWER_CHARS, default=DEFAULT_MAX_ANSWER_CHARS)
        ] = number_selector(
            MIN_MAX_ANSWER_CHARS, MAX_MAX_ANSWER_CHARS, unit="characters"
        )
        schema[vol.Required(CONF_TEMPERATURE, default=DEFAULT_TEMPERATURE)] = (
            number_selector(
                MIN_TEMPERATURE,
                MAX_TEMPERATURE,
                step=0.05,
                mode=NumberSelectorMode.SLIDER,
            )
        )
        schema[
            vol.Required(CONF_FIRST_TOKEN_TIMEOUT, default=DEFAULT_FIRST_TOKEN_TIMEOUT)
        ] = number_selector(MIN_FIRST_TOKEN_TIMEOUT, MAX_FIRST_TOKEN_TIMEOUT, unit="s")
        schema[vol.Required(CONF_CHUNK_TIMEOUT, default=DEFAULT_CHUNK_TIMEOUT)] = (
            number_selector(MIN_CHUNK_TIMEOUT, MAX_CHUNK_TIMEOUT, unit="s")
        )
    schema[vol.Required(CONF_IDLE_TIMEOUT, default=DEFAULT_IDLE_TIMEOUT)] = (
        number_selector(MIN_IDLE_TIMEOUT, MAX_IDLE_TIMEOUT, unit="s")
    )
    schema[vol.Required(CONF_CARRY_OVER, default=DEFAULT_CARRY_OVER)] = (
        BooleanSelector()
    )
    return vol.Schema(schema)


def _options_from_input(brain: str, user_input: dict[str, Any]) -> dict[str, Any]:
    """Typed options from the submitted form (number selectors return floats)."""
    options: dict[str, Any] = {
        CONF_PROMPT: user_input.get(CONF_PROMPT, DEFAULT_PROMPT).strip(),
        CONF_IDLE_TIMEOUT: int(user_input[CONF_IDLE_TIMEOUT]),
        CONF_CARRY_OVER: bool(user_input[CONF_CARRY_OVER]),
    }
    if brain == BRAIN_OPENAI:
        options.update(
            {
                CONF_LLM_HASS_API: user_input[CONF_LLM_HASS_API],
                CONF_CONTEXT_WINDOW: int(user_input[CONF_CONTEXT_WINDOW]),
                CONF_MAX_TOOL_TURNS: int(user_input[CONF_MAX_TOOL_TURNS]),
                CONF_MAX_ANSWER_CHARS: int(
                    user_input.get(CONF_MAX_ANSWER_CHARS, DEFAULT_MAX_ANSWER_CHARS)
                ),
                CONF_TEMPERATURE: float(user_input[CONF_TEMPERATURE]),
                CONF_FIRST_TOKEN_TIMEOUT: int(user_input[CONF_FIRST_TOKEN_TIMEOUT]),
                CONF_CHUNK_TIMEOUT: int(user_input[CONF_CHUNK_TIMEOUT]),
            }
        )
    return options
