"""The brains of Realtime Voice: a kernel chat provider and tool runner each.

* ``openai``: an OpenAI-compatible chat endpoint (``OpenAIChatProvider`` on Home
  Assistant's shared httpx client, wrapped in ``EndpointProvider`` for the stream
  timeouts and options that change without a reload) with the tools of an HA LLM
  API (``HaToolRunner``).
* ``ha_agent``: every round is delegated to an existing HA conversation agent
  through ``conversation.async_converse``. The built-in agent acts on devices and
  answers fast, so its call is made as one tool call (``ha_assist``) and thereby is
  one kernel critical section: an interruption meanwhile is suppressed and the
  newest words run right after it. Any other agent (an LLM agent) is called
  directly inside the provider's stream, so the round stays interruptible; its own
  tools then run inside that agent where the kernel cannot protect them — tool
  protection needs Realtime Voice's own endpoint (the ``openai`` brain). It lives
  in ``agent_brain``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
import dataclasses
import logging
from typing import Any

import openai

from homeassistant.config_entries import ConfigEntry
from homeassistant.core import Context, HomeAssistant
from homeassistant.exceptions import (
    ConfigEntryAuthFailed,
    ConfigEntryError,
    ConfigEntryNotReady,
)
from homeassistant.helpers import intent, issue_registry as ir
from homeassistant.helpers.httpx_client import get_async_client

from .agent_brain import create_ha_agent_parts
from .const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_CHUNK_TIMEOUT,
    CONF_FIRST_TOKEN_TIMEOUT,
    CONF_LLM_HASS_API,
    CONF_MODEL,
    CONF_TEMPERATURE,
    DEFAULT_BASE_URL,
    DEFAULT_CHUNK_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_LLM_HASS_API,
    DEFAULT_MODEL,
    DEFAULT_TEMPERATURE,
    DOMAIN,
    LLM_API_NONE,
)
from .kernel import ChatProvider, Delta, Message, PromptRegistry, ToolRunner, ToolSpec
from .kernel.openai_provider import (
    PLACEHOLDER_API_KEY,
    OpenAIChatProvider,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderError,
    ProviderModelNotFoundError,
)
from .redact import safe_url
from .tools import HaToolRunner
from .turn import TurnContext, Turns

_LOGGER = logging.getLogger(__name__)

ISSUE_MODEL_NOT_FOUND = "model_not_found"


class EndpointProvider:
    """The kernel's chat provider for an endpoint: timeouts, live options.

    Wraps the kernel's ``OpenAIChatProvider``:

    - **First-token timeout**: how long a request may take until its first piece
      (text or tool calls) arrives. Covers connecting and a local server loading
      the model on first use, so it is the larger one.
    - **Chunk timeout**: how long a stream may pause between two pieces once it
      answers. A stream that stops mid-answer fails the round after it (the kernel
      apologises) instead of stalling for the HTTP read timeout.

    The SDK's own per-read timeout is set to the first-token timeout, so it never
    fires before ours. ``configure`` applies changed options to the next request;
    a request already streaming keeps the provider it started with.
    """

    def __init__(self, hass: HomeAssistant, data: Mapping[str, Any]) -> None:
        """Create the provider for an entry's endpoint (``data``); call ``configure``."""
        self._hass = hass
        self._data = data
        self._inner: OpenAIChatProvider | None = None
        self._settings: tuple[float, float, float] | None = None
        self.first_token_timeout = float(DEFAULT_FIRST_TOKEN_TIMEOUT)
        self.chunk_timeout = float(DEFAULT_CHUNK_TIMEOUT)

    @property
    def endpoint(self) -> OpenAIChatProvider:
        """The kernel provider requests go to (created by ``configure``)."""
        assert self._inner is not None, "configure() first"
        return self._inner

    def configure(self, options: Mapping[str, Any]) -> None:
        """Apply the entry's options to the next request."""
        temperature = float(options.get(CONF_TEMPERATURE, DEFAULT_TEMPERATURE))
        self.first_token_timeout = float(
            options.get(CONF_FIRST_TOKEN_TIMEOUT, DEFAULT_FIRST_TOKEN_TIMEOUT)
        )
        self.chunk_timeout = float(
            options.get(CONF_CHUNK_TIMEOUT, DEFAULT_CHUNK_TIMEOUT)
        )
        settings = (temperature, self.first_token_timeout, self.chunk_timeout)
        if settings == self._settings:
            return
        self._settings = settings
        self._inner = OpenAIChatProvider(
            base_url=self._data.get(CONF_BASE_URL, DEFAULT_BASE_URL),
            api_key=self._data.get(CONF_API_KEY),
            model=self._data.get(CONF_MODEL, DEFAULT_MODEL),
            http_client=get_async_client(self._hass),
            temperature=temperature,
            timeout=max(self.first_token_timeout, self.chunk_timeout),
        )

    async def validate(self) -> None:
        """Check the endpoint, key and model (see ``OpenAIChatProvider.validate``)."""
        await self.endpoint.validate()

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncGenerator[Delta]:
        """Stream the endpoint's answer; fail when it is silent for too long."""
        inner = self.endpoint.stream(messages, tools)
        limit = self.first_token_timeout
        what = "first answer"
        try:
            while True:
                timer = asyncio.timeout(limit)
                try:
                    async with timer:
                        delta = await anext(inner)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not timer.expired():
                        raise
                    raise ProviderConnectionError(
                        f"the model server sent no {what} within {limit:g} s"
                    ) from None
                limit = self.chunk_timeout
                what = "further answer"
                yield delta
        finally:
            # Closing releases the HTTP response at once (also on cancellation).
            await inner.aclose()


class Brain:
    """A chat provider and a tool runner for the kernel, plus per-turn context."""

    def __init__(
        self,
        kind: str,
        provider: ChatProvider,
        tools: ToolRunner | None,
        turns: Turns,
    ) -> None:
        """Bundle the parts of a brain (use ``async_create_brain``)."""
        self.kind = kind
        self.provider = provider
        self.tools = tools
        self._turns = turns

    def configure(self, options: Mapping[str, Any]) -> None:
        """Apply changed options to the next request (no reload, nothing is cut).

        The model's temperature and stream timeouts, and which LLM API the tools
        come from (prepared again at every turn). Whether there are tools at all
        is decided when the entry loads.
        """
        if isinstance(self.provider, EndpointProvider):
            self.provider.configure(options)
        if isinstance(self.tools, HaToolRunner):
            api_id = options.get(CONF_LLM_HASS_API, DEFAULT_LLM_HASS_API)
            if api_id and api_id != LLM_API_NONE:
                self.tools.api_id = api_id

    def agent_reply(self, child_id: str) -> intent.IntentResponse | None:
        """Return the delegated agent's answer in the child's current turn, if any."""
        return self._turns.replies.get(child_id)

    def set_turn(self, child_id: str, turn: TurnContext) -> None:
        """Remember what HA told us about the child's current turn."""
        self._turns.set(child_id, turn)

    async def async_prepare(self, child_id: str) -> None:
        """Before each push: fetch the LLM API instance for the child's turn."""
        if isinstance(self.tools, HaToolRunner):
            await self.tools.async_prepare(child_id, self._turns.get(child_id))

    async def async_prepare_as(self, child_id: str, context: Context) -> None:
        """Prepare the child's next input for another caller (same device, language).

        The control plane's inputs run their tools as whoever sent them.
        """
        self._turns.set(
            child_id, dataclasses.replace(self._turns.get(child_id), context=context)
        )
        await self.async_prepare(child_id)

    def forget(self, child_id: str) -> None:
        """Drop the turn and prepared tools of a closed session."""
        self._turns.pop(child_id)
        if isinstance(self.tools, HaToolRunner):
            self.tools.forget(child_id)


async def async_create_brain(
    hass: HomeAssistant, entry: ConfigEntry, prompts: PromptRegistry
) -> Brain:
    """Create the brain an entry is configured for.

    Raises ConfigEntryAuthFailed when the endpoint rejects the key,
    ConfigEntryNotReady when it (or the agent) cannot be reached now.
    """
    kind = entry.data.get(CONF_BRAIN, BRAIN_OPENAI)
    if kind == BRAIN_OPENAI:
        return await _async_create_openai_brain(hass, entry, prompts)
    if kind == BRAIN_HA_AGENT:
        provider, agent_tools, turns = create_ha_agent_parts(hass, entry)
        return Brain(BRAIN_HA_AGENT, provider, agent_tools, turns)
    raise ConfigEntryError(
        translation_domain=DOMAIN,
        translation_key="unknown_brain",
        translation_placeholders={"brain": str(kind)},
    )


def _model_issue_id(entry: ConfigEntry) -> str:
    return f"{ISSUE_MODEL_NOT_FOUND}_{entry.entry_id}"


async def async_prime_openai(hass: HomeAssistant) -> None:
    """Build the openai SDK's platform headers in the executor.

    The SDK builds them on a client's first request (it runs ``uname`` and reads
    ``/etc/os-release``) and caches them for the process. Done here first, the
    first request never blocks the event loop; HA's own ``openai_conversation``
    primes its client the same way.
    """
    client = openai.AsyncOpenAI(
        api_key=PLACEHOLDER_API_KEY, http_client=get_async_client(hass)
    )
    await hass.async_add_executor_job(client.platform_headers)


async def _async_create_openai_brain(
    hass: HomeAssistant, entry: ConfigEntry, prompts: PromptRegistry
) -> Brain:
    model = entry.data.get(CONF_MODEL, DEFAULT_MODEL)
    await async_prime_openai(hass)
    provider = EndpointProvider(hass, entry.data)
    provider.configure(entry.options)
    # Provider error messages are short and never contain the API key.
    try:
        await provider.validate()
    except ProviderAuthError as err:
        # One sentence for HA's "could not authenticate: …" line; the server's own
        # words go to the debug log.
        _LOGGER.debug("The model server rejected the API key: %s", err)
        status = getattr(err.__cause__, "status_code", None)
        raise ConfigEntryAuthFailed(
            translation_domain=DOMAIN,
            translation_key="auth_failed",
            translation_placeholders={
                "base_url": safe_url(entry.data.get(CONF_BASE_URL, DEFAULT_BASE_URL)),
                "status": f"HTTP {status}" if status else "refused",
            },
        ) from err
    except ProviderModelNotFoundError as err:
        ir.async_create_issue(
            hass,
            DOMAIN,
            _model_issue_id(entry),
            is_fixable=False,
            is_persistent=False,
            severity=ir.IssueSeverity.ERROR,
            translation_key=ISSUE_MODEL_NOT_FOUND,
            translation_placeholders={"model": model, "name": entry.title},
        )
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="model_not_found",
            translation_placeholders={"model": str(model), "error": str(err)},
        ) from err
    except ProviderError as err:  # connection errors, 5xx, rate limits …
        raise ConfigEntryNotReady(
            translation_domain=DOMAIN,
            translation_key="cannot_connect",
            translation_placeholders={"error": str(err)},
        ) from err
    ir.async_delete_issue(hass, DOMAIN, _model_issue_id(entry))

    api_id = entry.options.get(CONF_LLM_HASS_API, DEFAULT_LLM_HASS_API)
    tools = (
        HaToolRunner(hass, prompts, api_id)
        if api_id and api_id != LLM_API_NONE
        else None
    )
    return Brain(BRAIN_OPENAI, provider, tools, Turns(hass))
