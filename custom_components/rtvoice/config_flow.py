"""The config flow of Realtime Voice: the entry's brain, and what hangs off it.

The user first picks the "brain" that answers:

- an OpenAI-compatible chat endpoint (OpenAI, Ollama, llama.cpp, vLLM, LM Studio …),
  checked with a real request before the entry is created; or
- an existing Home Assistant conversation agent (for installations without an LLM or
  fully offline), which needs no network check.

What the flow checks about a brain (unique ids, the connection test) is in
``brain_check``; reauth and reconfigure change the brain of an entry. The rest of
an entry's configuration lives elsewhere, one concern each:

- its conversation settings: the options flow (``options_flow``);
- its satellites: one config subentry each, added, reconfigured and deleted on
  the entry's page (``satellites.esphome``, ``satellites.wyoming``);
- satellites found on the network: the zeroconf steps this flow inherits
  (``satellites.discovery``), which add the satellite as a subentry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import voluptuous as vol

from homeassistant.components import conversation
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigFlowResult,
    ConfigSubentryFlow,
    OptionsFlow,
)
from homeassistant.core import HomeAssistant, callback
from homeassistant.data_entry_flow import AbortFlow
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.selector import (
    BooleanSelector,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)

from .brain_check import (
    agent_errors,
    async_validate_openai,
    brain_of,
    distinct_title,
    format_errors,
    ha_agent_unique_id,
    normalize_base_url,
    openai_unique_id,
    with_api_key,
)
from .const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_CREATE_ASSISTANT,
    CONF_MODEL,
    CONF_NAME,
    DEFAULT_AGENT_ID,
    DEFAULT_BASE_URL,
    DEFAULT_MODEL,
    DEFAULT_NAME,
    DEFAULT_OPTIONS_HA_AGENT,
    DEFAULT_OPTIONS_OPENAI,
    DOMAIN,
    SUBENTRY_ESPHOME,
    SUBENTRY_WYOMING,
)
from .flow_fields import PASSWORD_SELECTOR
from .options_flow import RealtimeVoiceOptionsFlow
from .redact import redact_url
from .satellites.discovery import SatelliteDiscoveryFlow
from .satellites.esphome.flow import EsphomeSatelliteFlow
from .satellites.wyoming.flow import WyomingSatelliteFlow

if TYPE_CHECKING:
    from .runtime import RtVoiceConfigEntry

_NAME_SELECTOR = TextSelector()
_URL_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.URL))
_MODEL_SELECTOR = TextSelector()

STEP_OPENAI_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_NAME, default=DEFAULT_NAME): _NAME_SELECTOR,
        vol.Required(CONF_BASE_URL, default=DEFAULT_BASE_URL): _URL_SELECTOR,
        vol.Optional(CONF_API_KEY): PASSWORD_SELECTOR,
        vol.Required(CONF_MODEL, default=DEFAULT_MODEL): _MODEL_SELECTOR,
        vol.Required(CONF_CREATE_ASSISTANT, default=True): BooleanSelector(),
    }
)
STEP_REAUTH_SCHEMA = vol.Schema({vol.Required(CONF_API_KEY): PASSWORD_SELECTOR})
STEP_RECONFIGURE_OPENAI_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_BASE_URL): _URL_SELECTOR,
        vol.Optional(CONF_API_KEY): PASSWORD_SELECTOR,
        vol.Required(CONF_MODEL): _MODEL_SELECTOR,
    }
)


@callback
def _agent_selector(hass: HomeAssistant) -> SelectSelector:
    """Return a selector of the agents a Realtime Voice entry may delegate to.

    Not HA's conversation agent selector: it offers Realtime Voice's own agents
    too (which cannot work: an agent cannot delegate to itself), and the frontend
    shows no helper text under it. Typing another agent id stays possible.
    """
    registry = er.async_get(hass)
    options = [
        SelectOptionDict(value=state.entity_id, label=state.name)
        for state in sorted(
            hass.states.async_all(conversation.DOMAIN), key=lambda s: s.name
        )
        if (entity := registry.async_get(state.entity_id)) is None
        or entity.platform != DOMAIN
    ]
    return SelectSelector(
        SelectSelectorConfig(
            options=options, mode=SelectSelectorMode.DROPDOWN, custom_value=True
        )
    )


@callback
def _ha_agent_schema(hass: HomeAssistant) -> vol.Schema:
    return vol.Schema(
        {
            vol.Required(CONF_NAME, default=DEFAULT_NAME): _NAME_SELECTOR,
            vol.Required(CONF_AGENT_ID, default=DEFAULT_AGENT_ID): _agent_selector(
                hass
            ),
            vol.Required(CONF_CREATE_ASSISTANT, default=True): BooleanSelector(),
        }
    )


@callback
def _reconfigure_ha_agent_schema(hass: HomeAssistant) -> vol.Schema:
    return vol.Schema({vol.Required(CONF_AGENT_ID): _agent_selector(hass)})


def _assistant_offer(user_input: dict[str, Any]) -> dict[str, Any]:
    """Return the entry data that makes the first setup create an assistant."""
    return (
        {CONF_CREATE_ASSISTANT: True} if user_input.get(CONF_CREATE_ASSISTANT) else {}
    )


class RealtimeVoiceConfigFlow(SatelliteDiscoveryFlow, domain=DOMAIN):
    """Set up a Realtime Voice brain; offer discovered satellites to an entry."""

    VERSION = 1
    # 1.2: unique ids without the base URL's secrets; 1.3: satellites as subentries
    MINOR_VERSION = 3

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: RtVoiceConfigEntry) -> OptionsFlow:
        """Options of an entry (HA sets ``config_entry`` on the flow itself)."""
        return RealtimeVoiceOptionsFlow()

    @classmethod
    @callback
    def async_get_supported_subentry_types(
        cls, config_entry: ConfigEntry
    ) -> dict[str, type[ConfigSubentryFlow]]:
        """Return the kinds of satellite an entry owns (each has an add button)."""
        return {
            SUBENTRY_ESPHOME: EsphomeSatelliteFlow,
            SUBENTRY_WYOMING: WyomingSatelliteFlow,
        }

    # -- helpers -----------------------------------------------------------------------

    @callback
    def _abort_if_taken_by_other_entry(
        self, entry: RtVoiceConfigEntry, unique_id: str
    ) -> None:
        """Abort when another entry already owns ``unique_id`` (reconfigure)."""
        other = self.hass.config_entries.async_entry_for_domain_unique_id(
            DOMAIN, unique_id
        )
        if other is not None and other.entry_id != entry.entry_id:
            raise AbortFlow("already_configured")

    # -- user: pick a brain ------------------------------------------------------------

    async def async_step_user(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Let the user choose which brain answers."""
        return self.async_show_menu(
            step_id="user", menu_options=[BRAIN_OPENAI, BRAIN_HA_AGENT]
        )

    async def async_step_openai(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Connect an OpenAI-compatible chat endpoint."""
        errors: dict[str, str] = {}
        placeholders: dict[str, str] = {}
        if user_input is not None:
            base_url = normalize_base_url(user_input[CONF_BASE_URL])
            model = user_input[CONF_MODEL].strip()
            api_key = user_input.get(CONF_API_KEY, "").strip()
            errors = format_errors(base_url, model)
            if not errors:
                await self.async_set_unique_id(openai_unique_id(base_url, model))
                self._abort_if_unique_id_configured()
                errors, placeholders = await async_validate_openai(
                    self.hass, base_url, api_key, model
                )
            if not errors:
                return self.async_create_entry(
                    title=distinct_title(
                        self.hass, user_input[CONF_NAME].strip() or DEFAULT_NAME, model
                    ),
                    data=with_api_key(
                        {
                            CONF_BRAIN: BRAIN_OPENAI,
                            CONF_BASE_URL: base_url,
                            CONF_MODEL: model,
                        },
                        api_key,
                    )
                    | _assistant_offer(user_input),
                    options=dict(DEFAULT_OPTIONS_OPENAI),
                )
        return self.async_show_form(
            step_id=BRAIN_OPENAI,
            data_schema=self.add_suggested_values_to_schema(
                STEP_OPENAI_SCHEMA, user_input
            ),
            errors=errors,
            description_placeholders=placeholders,
        )

    async def async_step_ha_agent(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Delegate to an existing Home Assistant conversation agent (no LLM)."""
        errors: dict[str, str] = {}
        if user_input is not None:
            agent_id = user_input[CONF_AGENT_ID]
            await self.async_set_unique_id(ha_agent_unique_id(agent_id))
            self._abort_if_unique_id_configured()
            errors = agent_errors(self.hass, agent_id)
            if not errors:
                info = conversation.async_get_agent_info(self.hass, agent_id)
                return self.async_create_entry(
                    title=distinct_title(
                        self.hass,
                        user_input[CONF_NAME].strip() or DEFAULT_NAME,
                        info.name if info is not None else agent_id,
                    ),
                    data={CONF_BRAIN: BRAIN_HA_AGENT, CONF_AGENT_ID: agent_id}
                    | _assistant_offer(user_input),
                    options=dict(DEFAULT_OPTIONS_HA_AGENT),
                )
        return self.async_show_form(
            step_id=BRAIN_HA_AGENT,
            data_schema=self.add_suggested_values_to_schema(
                _ha_agent_schema(self.hass), user_input
            ),
            errors=errors,
        )

    # -- reauth (openai brain) ---------------------------------------------------------

    async def async_step_reauth(
        self, entry_data: Mapping[str, Any]
    ) -> ConfigFlowResult:
        """Handle an endpoint that rejected the stored API key."""
        if entry_data.get(CONF_BRAIN, BRAIN_OPENAI) != BRAIN_OPENAI:
            return self.async_abort(reason="reauth_not_supported")
        return await self.async_step_reauth_confirm()

    async def async_step_reauth_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Ask for a new API key and check it."""
        entry = self._get_reauth_entry()
        errors: dict[str, str] = {}
        placeholders: dict[str, str] = {}
        if user_input is not None:
            api_key = user_input[CONF_API_KEY].strip()
            errors, placeholders = await async_validate_openai(
                self.hass, entry.data[CONF_BASE_URL], api_key, entry.data[CONF_MODEL]
            )
            if not errors:
                return self.async_update_reload_and_abort(
                    entry, data=with_api_key(entry.data, api_key)
                )
        return self.async_show_form(
            step_id="reauth_confirm",
            data_schema=STEP_REAUTH_SCHEMA,
            errors=errors,
            description_placeholders={
                "name": entry.title,
                "base_url": redact_url(entry.data[CONF_BASE_URL]),
                "model": entry.data[CONF_MODEL],
                **placeholders,
            },
        )

    # -- reconfigure -------------------------------------------------------------------

    async def async_step_reconfigure(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the brain's connection (endpoint or agent)."""
        if brain_of(self._get_reconfigure_entry()) == BRAIN_HA_AGENT:
            return await self.async_step_reconfigure_ha_agent()
        return await self.async_step_reconfigure_openai()

    async def async_step_reconfigure_openai(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change base URL, API key or model of an endpoint entry.

        An empty key keeps the stored key while the base URL stays the same; a key is
        never carried over to a different server.
        """
        entry = self._get_reconfigure_entry()
        errors: dict[str, str] = {}
        placeholders: dict[str, str] = {}
        stored_url = entry.data[CONF_BASE_URL]
        if user_input is not None:
            base_url = normalize_base_url(user_input[CONF_BASE_URL])
            if base_url == redact_url(stored_url):
                base_url = stored_url  # the redacted URL, unchanged: keep the stored
            model = user_input[CONF_MODEL].strip()
            api_key = user_input.get(CONF_API_KEY, "").strip()
            if not api_key and base_url == stored_url:
                api_key = entry.data.get(CONF_API_KEY, "")
            unique_id = openai_unique_id(base_url, model)
            errors = format_errors(base_url, model)
            if not errors:
                self._abort_if_taken_by_other_entry(entry, unique_id)
                errors, placeholders = await async_validate_openai(
                    self.hass, base_url, api_key, model
                )
            if not errors:
                return self.async_update_reload_and_abort(
                    entry,
                    unique_id=unique_id,
                    data=with_api_key(
                        {**entry.data, CONF_BASE_URL: base_url, CONF_MODEL: model},
                        api_key,
                    ),
                )
        # The stored key and the stored URL's secrets are never sent to the frontend
        # (the URL goes out redacted; sent back unchanged, it keeps the stored one);
        # what the user just typed is.
        suggested: dict[str, Any] = {
            CONF_BASE_URL: redact_url(stored_url),
            CONF_MODEL: entry.data[CONF_MODEL],
            **(user_input or {}),
        }
        return self.async_show_form(
            step_id="reconfigure_openai",
            data_schema=self.add_suggested_values_to_schema(
                STEP_RECONFIGURE_OPENAI_SCHEMA, suggested
            ),
            errors=errors,
            description_placeholders={"name": entry.title, **placeholders},
        )

    async def async_step_reconfigure_ha_agent(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Change the conversation agent of an agent entry."""
        entry = self._get_reconfigure_entry()
        errors: dict[str, str] = {}
        if user_input is not None:
            agent_id = user_input[CONF_AGENT_ID]
            unique_id = ha_agent_unique_id(agent_id)
            self._abort_if_taken_by_other_entry(entry, unique_id)
            errors = agent_errors(self.hass, agent_id)
            if not errors:
                return self.async_update_reload_and_abort(
                    entry,
                    unique_id=unique_id,
                    data_updates={CONF_AGENT_ID: agent_id},
                )
        return self.async_show_form(
            step_id="reconfigure_ha_agent",
            data_schema=self.add_suggested_values_to_schema(
                _reconfigure_ha_agent_schema(self.hass),
                user_input or {CONF_AGENT_ID: entry.data[CONF_AGENT_ID]},
            ),
            errors=errors,
            description_placeholders={"name": entry.title},
        )
