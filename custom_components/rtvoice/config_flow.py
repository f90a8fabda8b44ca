"""Config, reauth, reconfigure and options flows of Realtime Voice.

The user first picks the "brain" that answers:

- an OpenAI-compatible chat endpoint (OpenAI, Ollama, llama.cpp, vLLM, LM Studio …),
  checked with a real request before the entry is created; or
- an existing Home Assistant conversation agent (for installations without an LLM or
  fully offline), which needs no network check.

Unique ids: ``<base url without trailing slash, user info or query>|<model>`` for an
endpoint (the URL's secrets stay out of ids and forms: ``redact``),
``ha_agent:<agent id>`` for an agent, so the same brain cannot be added twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
import functools
import logging
import re
import socket
import traceback
from typing import TYPE_CHECKING, Any, Final

from aioesphomeapi import DeviceInfo
import httpx
import openai
import voluptuous as vol
from yarl import URL

from homeassistant.components import conversation
from homeassistant.config_entries import (
    ConfigEntry,
    ConfigEntryState,
    ConfigFlow,
    ConfigFlowResult,
    OptionsFlow,
)
from homeassistant.const import CONF_HOST, CONF_PORT
from homeassistant.core import HomeAssistant, callback
from homeassistant.data_entry_flow import AbortFlow
from homeassistant.helpers import entity_registry as er, llm
from homeassistant.helpers.device_registry import format_mac
from homeassistant.helpers.httpx_client import get_async_client
from homeassistant.helpers.selector import (
    BooleanSelector,
    NumberSelector,
    NumberSelectorConfig,
    NumberSelectorMode,
    SelectOptionDict,
    SelectSelector,
    SelectSelectorConfig,
    SelectSelectorMode,
    TemplateSelector,
    TextSelector,
    TextSelectorConfig,
    TextSelectorType,
)
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo

from .audio.wakeword import MODELS
from .brain import async_prime_openai
from .const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BARGE_IN,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_CARRY_OVER,
    CONF_CHUNK_TIMEOUT,
    CONF_CONTEXT_WINDOW,
    CONF_CREATE_ASSISTANT,
    CONF_DUPLEX_SATELLITES,
    CONF_ECHO_CANCELLATION,
    CONF_END_SILENCE,
    CONF_FIRST_TOKEN_TIMEOUT,
    CONF_IDLE_TIMEOUT,
    CONF_LLM_HASS_API,
    CONF_MAX_ANSWER_CHARS,
    CONF_MAX_TOOL_TURNS,
    CONF_MODEL,
    CONF_NAME,
    CONF_NOISE_PSK,
    CONF_PROMPT,
    CONF_TEMPERATURE,
    CONF_TURN_EAGERNESS,
    CONF_WAKE_WORD,
    CONF_WYOMING_SATELLITES,
    DEFAULT_AGENT_ID,
    DEFAULT_BARGE_IN,
    DEFAULT_BASE_URL,
    DEFAULT_CARRY_OVER,
    DEFAULT_CHUNK_TIMEOUT,
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_ECHO_CANCELLATION,
    DEFAULT_END_SILENCE,
    DEFAULT_ESPHOME_PORT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_LLM_HASS_API,
    DEFAULT_MAX_ANSWER_CHARS,
    DEFAULT_MAX_TOOL_TURNS,
    DEFAULT_MODEL,
    DEFAULT_NAME,
    DEFAULT_OPTIONS_HA_AGENT,
    DEFAULT_OPTIONS_OPENAI,
    DEFAULT_PROMPT,
    DEFAULT_TEMPERATURE,
    DEFAULT_TURN_EAGERNESS,
    DEFAULT_WYOMING_PORT,
    DOMAIN,
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
    VALIDATION_TIMEOUT,
)
from .control_api import API_ID_PREFIX as CONTROL_API_ID_PREFIX
from .device_text import device_text, id_text, markdown_text
from .duplex import BargeIn, echo as duplex_echo
from .duplex_ha import ProbeError, async_probe_satellite, satellite_key
from .duplex_owner import (
    esphome_entry_for,
    esphome_voice_entries,
    owner_of,
    rtvoice_entries,
    satellite_conf,
    with_satellite,
)
from .kernel.openai_provider import (
    OpenAIChatProvider,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderModelNotFoundError,
)
from .redact import endpoint_unique_id, mask_secret, redact_url, safe_url
from .wyoming_ha import (
    DEFAULT_WAKE_WORD,
    WAKE_WORD_SATELLITE,
    WyomingProbeError,
    async_probe_gate,
    async_probe_wyoming,
    wyoming_key,
)

if TYPE_CHECKING:
    from .runtime import RtVoiceConfigEntry

_LOGGER = logging.getLogger(__name__)

ESPHOME_ZEROCONF_TYPE: Final = "_esphomelib._tcp.local."
CONF_ENTRY_ID: Final = "entry_id"  # the Realtime Voice entry a satellite joins
CONF_SATELLITE: Final = "satellite"  # the satellite whose settings are edited
# Probe reasons whose config-flow error key differs from the options flow's
# (the config flow's cannot_connect is about the model endpoint).
_DISCOVERY_ERRORS: Final = {"cannot_connect": "satellite_cannot_connect"}
_MAC: Final = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")  # format_mac's output
MIN_END_SILENCE: Final = 1  # seconds of silence after an answer before the session ends
MAX_END_SILENCE: Final = 120

_NAME_SELECTOR = TextSelector()
_URL_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.URL))
_KEY_SELECTOR = TextSelector(TextSelectorConfig(type=TextSelectorType.PASSWORD))
_MODEL_SELECTOR = TextSelector()

STEP_OPENAI_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_NAME, default=DEFAULT_NAME): _NAME_SELECTOR,
        vol.Required(CONF_BASE_URL, default=DEFAULT_BASE_URL): _URL_SELECTOR,
        vol.Optional(CONF_API_KEY): _KEY_SELECTOR,
        vol.Required(CONF_MODEL, default=DEFAULT_MODEL): _MODEL_SELECTOR,
        vol.Required(CONF_CREATE_ASSISTANT, default=True): BooleanSelector(),
    }
)
STEP_REAUTH_SCHEMA = vol.Schema({vol.Required(CONF_API_KEY): _KEY_SELECTOR})
STEP_RECONFIGURE_OPENAI_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_BASE_URL): _URL_SELECTOR,
        vol.Optional(CONF_API_KEY): _KEY_SELECTOR,
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


@callback
def distinct_title(hass: HomeAssistant, wanted: str, detail: str) -> str:
    """Return ``wanted`` as an entry title, made distinct from the other entries'.

    A second entry with the default name is told apart by ``detail`` (the model or
    the agent's name), and by a number if that is taken too.
    """
    titles = {entry.title for entry in hass.config_entries.async_entries(DOMAIN)}
    if wanted not in titles:
        return wanted
    title = base = f"{wanted} ({detail})"
    number = 2
    while title in titles:
        title = f"{base} {number}"
        number += 1
    return title


def normalize_base_url(base_url: str) -> str:
    """Return the base URL as stored: no surrounding blanks, no trailing slash."""
    return base_url.strip().rstrip("/")


def openai_unique_id(base_url: str, model: str) -> str:
    """Return the unique id of an entry that talks to ``model`` at ``base_url``.

    Without the URL's secrets (``redact.endpoint_unique_id``).
    """
    return endpoint_unique_id(normalize_base_url(base_url), model)


def ha_agent_unique_id(agent_id: str) -> str:
    """Return the unique id of an entry delegating to the agent ``agent_id``."""
    return f"{BRAIN_HA_AGENT}:{agent_id}"


def _brain(entry: RtVoiceConfigEntry) -> str:
    """Return the brain of an entry (without the key: openai, the first brain)."""
    return str(entry.data.get(CONF_BRAIN, BRAIN_OPENAI))


def _with_api_key(data: Mapping[str, Any], api_key: str) -> dict[str, Any]:
    """Copy of ``data`` holding ``api_key``, or no key at all when it is empty."""
    updated = {key: value for key, value in data.items() if key != CONF_API_KEY}
    if api_key:
        updated[CONF_API_KEY] = api_key
    return updated


def _format_errors(base_url: str, model: str) -> dict[str, str]:
    """Errors in the endpoint fields that need no network to find."""
    errors: dict[str, str] = {}
    url = URL(base_url)
    if url.scheme not in ("http", "https") or not url.host:
        errors[CONF_BASE_URL] = "invalid_url"
    if not model:
        errors[CONF_MODEL] = "model_required"
    return errors


def connection_cause(err: BaseException) -> str:
    """Say in a few words why a connection check failed (for the form and the log).

    Looks down the exception chain (SDK → httpx → socket) for the root cause: the
    provider's own message names only the exception type.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    chain: list[BaseException] = []
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = current.__cause__ or current.__context__
    for cause in chain:
        if isinstance(cause, socket.gaierror):
            return "the host name cannot be resolved"
        if isinstance(cause, ConnectionRefusedError):
            return "the connection was refused: nothing listens on that port"
        if isinstance(
            cause, (TimeoutError, httpx.TimeoutException, openai.APITimeoutError)
        ):
            return f"no answer within {VALIDATION_TIMEOUT:g} s"
        if isinstance(cause, openai.APIStatusError) and cause.status_code >= 500:
            return f"the server failed with HTTP {cause.status_code}"
    for cause in chain:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return str(err)


async def async_validate_openai(
    hass: HomeAssistant, base_url: str, api_key: str, model: str
) -> tuple[dict[str, str], dict[str, str]]:
    """Check that the endpoint answers, accepts the key and knows the model.

    Returns the form errors (empty when everything is fine) and the placeholders
    of their messages (``error``: the cause of a failed connection, also when
    the whole check did not end within ``VALIDATION_TIMEOUT``). Failures are
    logged at debug level with their cause; the API key is never logged.
    """
    await async_prime_openai(hass)
    provider = OpenAIChatProvider(
        base_url=base_url,
        api_key=api_key or None,
        model=model,
        http_client=get_async_client(hass),
        timeout=VALIDATION_TIMEOUT,
    )
    try:
        # One deadline for the whole check: the client's timeout is per read, and
        # an endpoint trickling a byte a second never trips it.
        async with asyncio.timeout(VALIDATION_TIMEOUT):
            await provider.validate()
    except TimeoutError:
        cause = f"no answer within {VALIDATION_TIMEOUT:g} s"
        _LOGGER.debug("Cannot connect to %s: %s", safe_url(base_url), cause)
        return {"base": "cannot_connect"}, {"error": cause}
    except ProviderAuthError as err:
        _LOGGER.debug("%s rejected the API key: %s", safe_url(base_url), err)
        return {"base": "invalid_auth"}, {}
    except ProviderModelNotFoundError as err:
        _LOGGER.debug("%s does not know model %s: %s", safe_url(base_url), model, err)
        return {"base": "model_not_found"}, {}
    except ProviderConnectionError as err:
        cause = mask_secret(connection_cause(err), api_key)
        _LOGGER.debug("Cannot connect to %s: %s (%s)", safe_url(base_url), cause, err)
        return {"base": "cannot_connect"}, {"error": cause}
    except Exception as err:  # noqa: BLE001 - logged below, with the key masked
        # Not LOGGER.exception: the chained SDK error may quote the server's answer,
        # and servers echo keys back. Log the same traceback with the key masked.
        details = mask_secret("".join(traceback.format_exception(err)), api_key)
        _LOGGER.error(
            "Unexpected error while checking model %s at %s\n%s",
            model,
            safe_url(base_url),
            details,
        )
        return {"base": "unknown"}, {}
    return {}, {}


@callback
def _agent_errors(hass: HomeAssistant, agent_id: str) -> dict[str, str]:
    """Errors for a conversation agent chosen as the brain."""
    entity = er.async_get(hass).async_get(agent_id)
    if entity is not None and entity.platform == DOMAIN:
        # Delegating to one of our own agents would loop forever.
        return {CONF_AGENT_ID: "agent_is_self"}
    if conversation.async_get_agent_info(hass, agent_id) is None:
        return {CONF_AGENT_ID: "agent_not_found"}
    return {}


@dataclass
class _Discovered:
    """An ESPHome device found by zeroconf, until the user confirms it."""

    mac: str
    name: str
    host: str
    port: int
    key: str | None = None  # encryption key (HA's esphome entry's, or the user's)
    info: DeviceInfo | None = None  # set once the probe passed
    error: str | None = None  # why the probe did not pass (form error)


class RealtimeVoiceConfigFlow(ConfigFlow, domain=DOMAIN):
    """Set up a Realtime Voice brain; offer discovered satellites to an entry."""

    VERSION = 1
    MINOR_VERSION = 2  # 1.2: unique ids without the base URL's secrets

    _esphome: _Discovered | None = None

    @staticmethod
    @callback
    def async_get_options_flow(config_entry: RtVoiceConfigEntry) -> OptionsFlow:
        """Options of an entry (HA sets ``config_entry`` on the flow itself)."""
        return RealtimeVoiceOptionsFlow()

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
            errors = _format_errors(base_url, model)
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
                    data=_with_api_key(
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
            errors = _agent_errors(self.hass, agent_id)
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

    # -- zeroconf: ESPHome and Wyoming voice satellites ---------------------------------------------

    async def async_step_zeroconf(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Dispatch a zeroconf discovery on its service type."""
        if discovery_info.type == ESPHOME_ZEROCONF_TYPE:
            return await self._async_discovered_esphome(discovery_info)
        if discovery_info.type == WYOMING_ZEROCONF_TYPE:
            return await self._async_discovered_wyoming(discovery_info)
        return self.async_abort(reason="not_supported")

    async def _async_discovered_esphome(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Offer an ESPHome device to a Realtime Voice entry, if it is a voice satellite.

        Every ESPHome device announces itself; only voice satellites reach the
        user. A plaintext device (or one whose key HA's ``esphome`` entry holds) is
        probed now; for an encrypted device without a known key the confirm form
        asks for it and the probe runs then. The flow's unique id is the MAC, so
        "Ignore" sticks to the device.
        """
        properties = discovery_info.properties
        raw_mac = str(properties.get("mac") or "")[:32]
        mac = format_mac(raw_mac)
        if not _MAC.fullmatch(mac):
            return self.async_abort(reason="mdns_missing_mac")
        await self.async_set_unique_id(mac)
        self._abort_if_unique_id_configured()  # the user ignored this device
        if not rtvoice_entries(self.hass):
            return self.async_abort(reason="no_realtime_voice_entry")
        if owner_of(self.hass, mac) is not None:
            return self.async_abort(reason="already_owned")
        name = device_text(
            properties.get("friendly_name")
            or str(discovery_info.hostname).removesuffix(".local.")
        ) or str(mac)
        self.context["title_placeholders"] = {"name": name}
        found = self._esphome = _Discovered(
            mac=mac,
            name=name,
            host=discovery_info.host,
            port=discovery_info.port or DEFAULT_ESPHOME_PORT,
        )
        if properties.get("api_encryption"):
            esphome = esphome_entry_for(self.hass, mac)
            found.key = (esphome.data.get(CONF_NOISE_PSK) or None) if esphome else None
            if found.key is None:
                return await self.async_step_esphome_confirm()  # asks for the key
        try:
            found.info = await async_probe_satellite(
                self.hass, found.host, found.port, found.key
            )
        except ProbeError as err:
            if err.reason in ("not_voice_satellite", "cannot_connect"):
                return self.async_abort(reason=err.reason)
            # The key (HA's, or none) does not fit: the user enters it.
            found.key, found.error = None, err.reason
        return await self.async_step_esphome_confirm()

    async def async_step_esphome_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Confirm a discovered satellite (its key, which entry when several)."""
        found = self._esphome
        assert found is not None
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        errors: dict[str, str] = {}
        if found.error is not None and user_input is None:
            errors["base"] = _DISCOVERY_ERRORS.get(found.error, found.error)
        if user_input is not None:
            if owner_of(self.hass, found.mac) is not None:
                return self.async_abort(reason="already_owned")  # added meanwhile
            chosen = user_input.get(CONF_ENTRY_ID, entries[0].entry_id)
            entry = next((e for e in entries if e.entry_id == chosen), None)
            if entry is None:
                errors[CONF_ENTRY_ID] = "entry_not_found"
            elif found.info is None:
                key = str(user_input.get(CONF_NOISE_PSK) or "").strip() or None
                try:
                    found.info = await async_probe_satellite(
                        self.hass, found.host, found.port, key
                    )
                except ProbeError as err:
                    if err.reason == "not_voice_satellite":
                        return self.async_abort(reason=err.reason)
                    errors["base"] = _DISCOVERY_ERRORS.get(err.reason, err.reason)
                else:
                    found.key = key
            if entry is not None and found.info is not None and not errors:
                satellite = satellite_conf(
                    found.host, found.port, found.key, found.info
                )
                options = dict(entry.options)
                options[CONF_DUPLEX_SATELLITES] = with_satellite(
                    options.get(CONF_DUPLEX_SATELLITES, []), satellite
                )
                return self._async_add_satellite(
                    entry,
                    options,
                    "duplex_added",
                    {"name": markdown_text(satellite[CONF_NAME]), "entry": entry.title},
                )
        schema = _entry_choice(entries)
        if found.info is None:
            schema[vol.Optional(CONF_NOISE_PSK)] = _KEY_SELECTOR
        if not schema:
            self._set_confirm_only()
        return self.async_show_form(
            step_id="esphome_confirm",
            data_schema=vol.Schema(schema),
            errors=errors,
            description_placeholders={
                "name": markdown_text(found.name),
                "host": markdown_text(found.host),
            },
        )

    @callback
    def _async_add_satellite(
        self,
        entry: ConfigEntry,
        options: dict[str, Any],
        reason: str,
        placeholders: dict[str, str],
    ) -> ConfigFlowResult:
        """Store ``options`` (with the new satellite) in ``entry``, reload it, end the flow.

        HA's ``async_update_reload_and_abort`` pattern, without its second reload:
        a loaded entry's update listener reloads it already (a changed satellite
        list needs a reload, as in the options flow); an entry that is not loaded
        (a failed setup) gets a reload scheduled here.
        """
        self.hass.config_entries.async_update_entry(entry, options=options)
        if entry.state is not ConfigEntryState.LOADED:
            self.hass.config_entries.async_schedule_reload(entry.entry_id)
        return self.async_abort(reason=reason, description_placeholders=placeholders)

    # -- zeroconf: Wyoming satellites --------------------------------------------------

    async def _async_discovered_wyoming(
        self, discovery_info: ZeroconfServiceInfo
    ) -> ConfigFlowResult:
        """Offer a discovered ``_wyoming._tcp`` service when it is a satellite.

        STT, TTS and wake word servers advertise the same type: they are left to
        HA's wyoming integration. The unique id (zeroconf name + satellite name,
        as HA's wyoming integration builds it) makes Ignore stick.
        """
        host, port = str(discovery_info.host), int(discovery_info.port or 0)
        try:
            info = await async_probe_gate(self.hass).probe(
                (f"{host}:{port}", f"name:{id_text(discovery_info.name, 255)}"),
                functools.partial(async_probe_wyoming, host, port),
            )
        except WyomingProbeError as err:
            return self.async_abort(reason=err.reason)
        assert info.satellite is not None
        name = info.satellite.name  # cleaned and cut (wyoming_proto)
        await self.async_set_unique_id(
            f"wyoming:{id_text(discovery_info.name)}_{id_text(name)}"
        )
        self._abort_if_unique_id_configured()
        satellite = {CONF_HOST: host, CONF_PORT: port}
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        for entry in entries:
            for stored in entry.options.get(CONF_WYOMING_SATELLITES, []):
                if wyoming_key(stored) == wyoming_key(satellite):
                    return self.async_abort(reason="already_configured")
        self._wyoming_discovered = {**satellite, CONF_NAME: name}
        self.context["title_placeholders"] = {"name": name}
        return await self.async_step_wyoming_confirm()

    async def async_step_wyoming_confirm(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Confirm a discovered satellite: add it to an entry, which reloads."""
        satellite = self._wyoming_discovered
        entries = rtvoice_entries(self.hass)
        if not entries:
            return self.async_abort(reason="no_realtime_voice_entry")
        if user_input is not None:
            entry_id = user_input.get(CONF_ENTRY_ID, entries[0].entry_id)
            entry = next((e for e in entries if e.entry_id == entry_id), entries[0])
            stored = {**satellite, CONF_WAKE_WORD: user_input[CONF_WAKE_WORD]}
            return self._async_add_satellite(
                entry,
                _with_wyoming(entry.options, stored),
                "wyoming_added",
                {"title": entry.title},
            )
        schema = _entry_choice(entries)
        schema[vol.Required(CONF_WAKE_WORD, default=DEFAULT_WAKE_WORD)] = (
            _wake_word_selector()
        )
        return self.async_show_form(
            step_id="wyoming_confirm",
            data_schema=vol.Schema(schema),
            description_placeholders={
                "name": markdown_text(satellite[CONF_NAME]),
                "address": markdown_text(wyoming_key(satellite)),
            },
        )

    _wyoming_discovered: dict[str, Any]

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
                    entry, data=_with_api_key(entry.data, api_key)
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
        if _brain(self._get_reconfigure_entry()) == BRAIN_HA_AGENT:
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
            errors = _format_errors(base_url, model)
            if not errors:
                self._abort_if_taken_by_other_entry(entry, unique_id)
                errors, placeholders = await async_validate_openai(
                    self.hass, base_url, api_key, model
                )
            if not errors:
                return self.async_update_reload_and_abort(
                    entry,
                    unique_id=unique_id,
                    data=_with_api_key(
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
            errors = _agent_errors(self.hass, agent_id)
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


class RealtimeVoiceOptionsFlow(OptionsFlow):
    """Settings of an entry, and the duplex satellites it owns (a menu).

    Settings: prompt, tools and conversation behaviour. The ha_agent brain shows
    no tool, temperature, context window or tool-turn options: the delegated agent
    handles those itself. Duplex satellites (preview): add one by host, port and
    key after a connection test, take one over from HA's esphome entry, change a
    satellite's settings, or remove one.
    """

    _configuring: str | None = None  # key of the satellite being configured

    async def async_step_init(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Offer the settings and the duplex satellites."""
        menu = ["settings", "add_duplex"]
        if self._esphome_candidates():
            menu.append("take_over_duplex")
        if self._duplex():
            menu.extend(["configure_duplex", "remove_duplex"])
        menu.append("add_wyoming")
        if self._wyoming():
            menu.extend(["configure_wyoming", "remove_wyoming"])
        return self.async_show_menu(step_id="init", menu_options=menu)

    async def async_step_settings(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Show and store the settings (the duplex satellites are kept)."""
        brain = _brain(self.config_entry)
        if user_input is not None:
            return self._store(_options_from_input(brain, user_input))
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
            step_id="settings",
            data_schema=self.add_suggested_values_to_schema(schema, current),
        )

    async def async_step_add_duplex(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Add an ESPHome satellite in duplex mode, once a connection test passed."""
        errors: dict[str, str] = {}
        if user_input is not None:
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            key = str(user_input.get(CONF_NOISE_PSK) or "").strip() or None
            try:
                info = await async_probe_satellite(self.hass, host, port, key)
            except ProbeError as err:
                errors["base"] = err.reason
            else:
                return self._store(
                    {**self.config_entry.options},
                    duplex=with_satellite(
                        self._duplex(), satellite_conf(host, port, key, info)
                    ),
                )
        return self.async_show_form(
            step_id="add_duplex",
            data_schema=self.add_suggested_values_to_schema(
                _DUPLEX_SCHEMA, user_input or {}
            ),
            errors=errors,
        )

    async def async_step_take_over_duplex(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Take a satellite over from HA's ``esphome`` entry (host, port and key).

        The chosen entry's connection is copied and tested as if typed in; HA's
        esphome entry stays (its other entities keep working), and the repair
        issue offers to disable its satellite entity.
        """
        candidates = self._esphome_candidates()
        errors: dict[str, str] = {}
        if user_input is not None:
            esphome = next(
                (e for e in candidates if e.entry_id == user_input[CONF_ENTRY_ID]),
                None,
            )
            if esphome is None:
                errors["base"] = "esphome_entry_not_found"
            else:
                host = str(esphome.data[CONF_HOST])
                port = int(esphome.data.get(CONF_PORT, DEFAULT_ESPHOME_PORT))
                key = esphome.data.get(CONF_NOISE_PSK) or None
                try:
                    info = await async_probe_satellite(self.hass, host, port, key)
                except ProbeError as err:
                    errors["base"] = err.reason
                else:
                    return self._store(
                        {**self.config_entry.options},
                        duplex=with_satellite(
                            self._duplex(), satellite_conf(host, port, key, info)
                        ),
                    )
        if not candidates:
            return self.async_abort(reason="no_esphome_satellites")
        choices = [
            SelectOptionDict(value=e.entry_id, label=f"{e.title} ({e.data[CONF_HOST]})")
            for e in candidates
        ]
        return self.async_show_form(
            step_id="take_over_duplex",
            data_schema=vol.Schema(
                {
                    vol.Required(CONF_ENTRY_ID): SelectSelector(
                        SelectSelectorConfig(
                            options=choices, mode=SelectSelectorMode.LIST
                        )
                    )
                }
            ),
            errors=errors,
        )

    async def async_step_configure_duplex(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Pick the satellite whose settings to change (none to pick: only one)."""
        satellites = self._duplex()
        return await self._async_pick_satellite(
            "configure_duplex",
            user_input,
            [satellite_key(s) for s in satellites],
            _satellite_selector(satellites),
            self.async_step_duplex_settings,
        )

    async def _async_pick_satellite(
        self,
        step_id: str,
        user_input: dict[str, Any] | None,
        keys: list[str],
        selector: SelectSelector,
        settings_step: Callable[[], Awaitable[ConfigFlowResult]],
    ) -> ConfigFlowResult:
        """Ask which satellite to configure (skipped with one), then its settings."""
        if len(keys) == 1:
            self._configuring = keys[0]
            return await settings_step()
        if user_input is not None:
            self._configuring = user_input[CONF_SATELLITE]
            return await settings_step()
        return self.async_show_form(
            step_id=step_id,
            data_schema=vol.Schema({vol.Required(CONF_SATELLITE): selector}),
        )

    async def async_step_duplex_settings(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Barge-in mode, server echo cancellation and end silence of one satellite."""
        satellites = self._duplex()
        return self._satellite_settings(
            "duplex_settings",
            satellites,
            satellite_key,
            user_input,
            lambda: self._store({**self.config_entry.options}, duplex=satellites),
        )

    def _satellite_settings(
        self,
        step_id: str,
        satellites: list[dict[str, Any]],
        key_of: Callable[[Mapping[str, Any]], str],
        user_input: dict[str, Any] | None,
        store: Callable[[], ConfigFlowResult],
        *,
        wake_word: bool = False,
    ) -> ConfigFlowResult:
        """Show or save the settings of the satellite being configured (any kind).

        Saved into ``satellites`` (then ``store``). Echo cancellation cannot be
        switched on where its package cannot run (the description says why);
        ``vad`` without it is allowed (a board with its own echo cancellation needs
        none) and the description warns. ``wake_word``: the form also chooses the
        wake word (Wyoming: a bundled model on the server, or the satellite's own).
        """
        index = next(
            (i for i, s in enumerate(satellites) if key_of(s) == self._configuring),
            None,
        )
        if index is None:
            return self.async_abort(reason="satellite_not_found")
        satellite = satellites[index]
        aec_reason = duplex_echo.unavailable_reason()
        errors: dict[str, str] = {}
        if user_input is not None:
            echo = bool(user_input[CONF_ECHO_CANCELLATION])
            if echo and aec_reason is not None:
                errors[CONF_ECHO_CANCELLATION] = "echo_cancellation_unavailable"
            else:
                changed = {
                    CONF_BARGE_IN: str(user_input[CONF_BARGE_IN]),
                    CONF_ECHO_CANCELLATION: echo,
                    CONF_END_SILENCE: int(user_input[CONF_END_SILENCE]),
                    CONF_TURN_EAGERNESS: str(
                        user_input.get(CONF_TURN_EAGERNESS, DEFAULT_TURN_EAGERNESS)
                    ),
                }
                if wake_word:
                    changed[CONF_WAKE_WORD] = str(user_input[CONF_WAKE_WORD])
                satellites[index] = {**satellite, **changed}
                return store()
        current = {
            CONF_BARGE_IN: satellite.get(CONF_BARGE_IN, DEFAULT_BARGE_IN),
            CONF_ECHO_CANCELLATION: satellite.get(
                CONF_ECHO_CANCELLATION, DEFAULT_ECHO_CANCELLATION
            ),
            CONF_END_SILENCE: satellite.get(CONF_END_SILENCE, DEFAULT_END_SILENCE),
            CONF_TURN_EAGERNESS: satellite.get(
                CONF_TURN_EAGERNESS, DEFAULT_TURN_EAGERNESS
            ),
        }
        if wake_word:
            current[CONF_WAKE_WORD] = satellite.get(CONF_WAKE_WORD, DEFAULT_WAKE_WORD)
        return self.async_show_form(
            step_id=step_id,
            data_schema=self.add_suggested_values_to_schema(
                _duplex_settings_schema(wake_word=wake_word),
                {**current, **(user_input or {})},
            ),
            errors=errors,
            description_placeholders={
                "name": _satellite_label(satellite),
                "echo_cancellation": (
                    "available"
                    if aec_reason is None
                    else f"not available here: {aec_reason}"
                ),
            },
        )

    async def async_step_remove_duplex(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Remove duplex satellites (their entities go with the entry's reload)."""
        satellites = self._duplex()
        if user_input is not None:
            gone = set(user_input[CONF_DUPLEX_SATELLITES])
            return self._store(
                {**self.config_entry.options},
                duplex=[s for s in satellites if satellite_key(s) not in gone],
            )
        return self.async_show_form(
            step_id="remove_duplex",
            data_schema=vol.Schema(
                {
                    vol.Required(CONF_DUPLEX_SATELLITES): _satellite_selector(
                        satellites, multiple=True
                    )
                }
            ),
        )

    async def async_step_add_wyoming(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Add a Wyoming satellite, once ``describe`` showed it is one."""
        errors: dict[str, str] = {}
        if user_input is not None:
            host = str(user_input[CONF_HOST]).strip()
            port = int(user_input[CONF_PORT])
            try:
                info = await async_probe_wyoming(host, port)
            except WyomingProbeError as err:
                errors["base"] = err.reason
            else:
                assert info.satellite is not None
                satellite = {
                    CONF_HOST: host,
                    CONF_PORT: port,
                    CONF_NAME: info.satellite.name,
                    CONF_WAKE_WORD: user_input[CONF_WAKE_WORD],
                }
                return self._store(
                    {**self.config_entry.options},
                    wyoming=_with_wyoming(self.config_entry.options, satellite)[
                        CONF_WYOMING_SATELLITES
                    ],
                )
        return self.async_show_form(
            step_id="add_wyoming",
            data_schema=self.add_suggested_values_to_schema(
                _wyoming_schema(), user_input or {}
            ),
            errors=errors,
        )

    async def async_step_configure_wyoming(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Pick the Wyoming satellite whose settings to change (only one: that one)."""
        satellites = self._wyoming()
        return await self._async_pick_satellite(
            "configure_wyoming",
            user_input,
            [wyoming_key(s) for s in satellites],
            _wyoming_selector(satellites),
            self.async_step_wyoming_settings,
        )

    async def async_step_wyoming_settings(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Barge-in, echo cancellation, end silence and wake word of one satellite."""
        satellites = [dict(s) for s in self._wyoming()]
        return self._satellite_settings(
            "wyoming_settings",
            satellites,
            wyoming_key,
            user_input,
            lambda: self._store({**self.config_entry.options}, wyoming=satellites),
            wake_word=True,
        )

    async def async_step_remove_wyoming(
        self, user_input: dict[str, Any] | None = None
    ) -> ConfigFlowResult:
        """Remove Wyoming satellites (their entities go with the entry's reload)."""
        satellites = self._wyoming()
        if user_input is not None:
            gone = set(user_input[CONF_WYOMING_SATELLITES])
            return self._store(
                {**self.config_entry.options},
                wyoming=[s for s in satellites if wyoming_key(s) not in gone],
            )
        return self.async_show_form(
            step_id="remove_wyoming",
            data_schema=vol.Schema(
                {
                    vol.Required(CONF_WYOMING_SATELLITES): _wyoming_selector(
                        satellites, multiple=True
                    )
                }
            ),
        )

    def _duplex(self) -> list[dict[str, Any]]:
        return [
            dict(s) for s in self.config_entry.options.get(CONF_DUPLEX_SATELLITES, [])
        ]

    def _esphome_candidates(self) -> list[ConfigEntry]:
        """HA's esphome voice satellites no Realtime Voice entry owns yet."""
        return [
            e
            for e in esphome_voice_entries(self.hass)
            if e.unique_id is not None and owner_of(self.hass, e.unique_id) is None
        ]

    def _wyoming(self) -> list[dict[str, Any]]:
        return list(self.config_entry.options.get(CONF_WYOMING_SATELLITES, []))

    def _store(
        self,
        options: dict[str, Any],
        duplex: list[dict[str, Any]] | None = None,
        wyoming: list[dict[str, Any]] | None = None,
    ) -> ConfigFlowResult:
        """Store ``options`` with the duplex and Wyoming satellites (kept unless given)."""
        satellites = self._duplex() if duplex is None else duplex
        options.pop(CONF_DUPLEX_SATELLITES, None)
        if satellites:
            options[CONF_DUPLEX_SATELLITES] = satellites
        wyoming_satellites = self._wyoming() if wyoming is None else wyoming
        options.pop(CONF_WYOMING_SATELLITES, None)
        if wyoming_satellites:
            options[CONF_WYOMING_SATELLITES] = wyoming_satellites
        return self.async_create_entry(data=options)


def _satellite_label(satellite: Mapping[str, Any]) -> str:
    return (
        f"{satellite.get(CONF_NAME) or satellite[CONF_HOST]} ({satellite[CONF_HOST]})"
    )


def _satellite_selector(
    satellites: list[dict[str, Any]], *, multiple: bool = False
) -> SelectSelector:
    """Return a choice of stored satellites (values: their keys)."""
    return SelectSelector(
        SelectSelectorConfig(
            options=[
                SelectOptionDict(value=satellite_key(s), label=_satellite_label(s))
                for s in satellites
            ],
            multiple=multiple,
        )
    )


def _wyoming_selector(
    satellites: list[dict[str, Any]], *, multiple: bool = False
) -> SelectSelector:
    """Return a choice of stored Wyoming satellites (values: their keys)."""
    return SelectSelector(
        SelectSelectorConfig(
            options=[
                SelectOptionDict(
                    value=wyoming_key(s),
                    label=f"{s.get(CONF_NAME) or s[CONF_HOST]} ({wyoming_key(s)})",
                )
                for s in satellites
            ],
            multiple=multiple,
        )
    )


def _duplex_settings_schema(*, wake_word: bool = False) -> vol.Schema:
    """Return the per-satellite settings form (with the wake word: Wyoming)."""
    wake: dict[vol.Marker, Any] = (
        {vol.Required(CONF_WAKE_WORD, default=DEFAULT_WAKE_WORD): _wake_word_selector()}
        if wake_word
        else {}
    )
    return vol.Schema(
        {
            **wake,
            vol.Required(CONF_BARGE_IN, default=DEFAULT_BARGE_IN): SelectSelector(
                SelectSelectorConfig(
                    options=[mode.value for mode in BargeIn],
                    translation_key=CONF_BARGE_IN,
                    mode=SelectSelectorMode.LIST,
                )
            ),
            vol.Required(
                CONF_ECHO_CANCELLATION, default=DEFAULT_ECHO_CANCELLATION
            ): BooleanSelector(),
            vol.Required(CONF_END_SILENCE, default=DEFAULT_END_SILENCE): _number(
                MIN_END_SILENCE, MAX_END_SILENCE, unit="s"
            ),
            vol.Required(
                CONF_TURN_EAGERNESS, default=DEFAULT_TURN_EAGERNESS
            ): SelectSelector(
                SelectSelectorConfig(
                    options=TURN_EAGERNESS_OPTIONS,
                    translation_key=CONF_TURN_EAGERNESS,
                    mode=SelectSelectorMode.DROPDOWN,
                )
            ),
        }
    )


TURN_EAGERNESS_OPTIONS = ["auto", "low", "medium", "high", "off"]


_DUPLEX_SCHEMA = vol.Schema(
    {
        vol.Required(CONF_HOST): TextSelector(),
        vol.Required(CONF_PORT, default=DEFAULT_ESPHOME_PORT): vol.All(
            vol.Coerce(int), vol.Range(min=1, max=65535)
        ),
        vol.Optional(CONF_NOISE_PSK): TextSelector(
            TextSelectorConfig(type=TextSelectorType.PASSWORD)
        ),
    }
)


WYOMING_ZEROCONF_TYPE = "_wyoming._tcp.local."


def _wake_word_selector() -> SelectSelector:
    """Return a choice of the satellite's own wake word or a bundled model."""
    return SelectSelector(
        SelectSelectorConfig(
            options=[
                SelectOptionDict(value=WAKE_WORD_SATELLITE, label="On the satellite"),
                *(SelectOptionDict(value=m.id, label=m.name) for m in MODELS),
            ],
            mode=SelectSelectorMode.DROPDOWN,
        )
    )


def _wyoming_schema() -> vol.Schema:
    return vol.Schema(
        {
            vol.Required(CONF_HOST): TextSelector(),
            vol.Required(CONF_PORT, default=DEFAULT_WYOMING_PORT): vol.All(
                vol.Coerce(int), vol.Range(min=1, max=65535)
            ),
            vol.Required(
                CONF_WAKE_WORD, default=DEFAULT_WAKE_WORD
            ): _wake_word_selector(),
        }
    )


def _entry_choice(entries: list[ConfigEntry]) -> dict[vol.Marker, Any]:
    """Return the field choosing which Realtime Voice entry gets a discovered satellite.

    Empty with a single entry: that one gets it.
    """
    if len(entries) < 2:
        return {}
    choices = [SelectOptionDict(value=e.entry_id, label=e.title) for e in entries]
    return {
        vol.Required(CONF_ENTRY_ID, default=entries[0].entry_id): SelectSelector(
            SelectSelectorConfig(options=choices, mode=SelectSelectorMode.DROPDOWN)
        )
    }


def _with_wyoming(
    options: Mapping[str, Any], satellite: dict[str, Any]
) -> dict[str, Any]:
    """Copy of ``options`` with ``satellite`` stored (replacing the same address)."""
    others = [
        s
        for s in options.get(CONF_WYOMING_SATELLITES, [])
        if wyoming_key(s) != wyoming_key(satellite)
    ]
    return {**options, CONF_WYOMING_SATELLITES: [*others, satellite]}


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


def _number(
    minimum: float,
    maximum: float,
    *,
    step: float = 1,
    mode: NumberSelectorMode = NumberSelectorMode.BOX,
    unit: str | None = None,
) -> NumberSelector:
    """Return a number selector for an option."""
    config = NumberSelectorConfig(min=minimum, max=maximum, step=step, mode=mode)
    if unit is not None:
        config["unit_of_measurement"] = unit
    return NumberSelector(config)


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
            _number(MIN_CONTEXT_WINDOW, MAX_CONTEXT_WINDOW, unit="tokens")
        )
        schema[vol.Required(CONF_MAX_TOOL_TURNS, default=DEFAULT_MAX_TOOL_TURNS)] = (
            _number(MIN_MAX_TOOL_TURNS, MAX_MAX_TOOL_TURNS)
        )
        schema[
            vol.Required(CONF_MAX_ANSWER_CHARS, default=DEFAULT_MAX_ANSWER_CHARS)
        ] = _number(MIN_MAX_ANSWER_CHARS, MAX_MAX_ANSWER_CHARS, unit="characters")
        schema[vol.Required(CONF_TEMPERATURE, default=DEFAULT_TEMPERATURE)] = _number(
            MIN_TEMPERATURE, MAX_TEMPERATURE, step=0.05, mode=NumberSelectorMode.SLIDER
        )
        schema[
            vol.Required(CONF_FIRST_TOKEN_TIMEOUT, default=DEFAULT_FIRST_TOKEN_TIMEOUT)
        ] = _number(MIN_FIRST_TOKEN_TIMEOUT, MAX_FIRST_TOKEN_TIMEOUT, unit="s")
        schema[vol.Required(CONF_CHUNK_TIMEOUT, default=DEFAULT_CHUNK_TIMEOUT)] = (
            _number(MIN_CHUNK_TIMEOUT, MAX_CHUNK_TIMEOUT, unit="s")
        )
    schema[vol.Required(CONF_IDLE_TIMEOUT, default=DEFAULT_IDLE_TIMEOUT)] = _number(
        MIN_IDLE_TIMEOUT, MAX_IDLE_TIMEOUT, unit="s"
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
