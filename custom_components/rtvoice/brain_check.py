"""What the config flow checks and stores about a brain, before an entry has it.

- unique ids: ``<base url without trailing slash, user info or query>|<model>``
  for an endpoint (the URL's secrets stay out of ids and forms: ``redact``),
  ``ha_agent:<agent id>`` for an agent, so the same brain cannot be added twice;
- ``async_validate_openai``: a real request to the endpoint (it answers, accepts
  the key, knows the model) within one deadline, with a short cause for the form
  when it fails; the key is never logged;
- ``agent_errors``: a Home Assistant conversation agent chosen as the brain
  exists and is not one of ours.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
import logging
import socket
import traceback
from typing import Any

import httpx
import openai
from yarl import URL

from homeassistant.components import conversation
from homeassistant.config_entries import ConfigEntry
from homeassistant.core import HomeAssistant, callback
from homeassistant.helpers import entity_registry as er
from homeassistant.helpers.httpx_client import get_async_client

from .brain import async_prime_openai
from .const import (
    BRAIN_HA_AGENT,
    BRAIN_OPENAI,
    CONF_AGENT_ID,
    CONF_API_KEY,
    CONF_BASE_URL,
    CONF_BRAIN,
    CONF_MODEL,
    DOMAIN,
    VALIDATION_TIMEOUT,
)
from .kernel.openai_provider import (
    OpenAIChatProvider,
    ProviderAuthError,
    ProviderConnectionError,
    ProviderModelNotFoundError,
)
from .redact import endpoint_unique_id, mask_secret, safe_url

_LOGGER = logging.getLogger(__name__)


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


def brain_of(entry: ConfigEntry) -> str:
    """Return the brain of an entry (without the key: openai, the first brain)."""
    return str(entry.data.get(CONF_BRAIN, BRAIN_OPENAI))


def with_api_key(data: Mapping[str, Any], api_key: str) -> dict[str, Any]:
    """Copy of ``data`` holding ``api_key``, or no key at all when it is empty."""
    updated = {key: value for key, value in data.items() if key != CONF_API_KEY}
    if api_key:
        updated[CONF_API_KEY] = api_key
    return updated


def format_errors(base_url: str, model: str) -> dict[str, str]:
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
def agent_errors(hass: HomeAssistant, agent_id: str) -> dict[str, str]:
    """Errors for a conversation agent chosen as the brain."""
    entity = er.async_get(hass).async_get(agent_id)
    if entity is not None and entity.platform == DOMAIN:
        # Delegating to one of our own agents would loop forever.
        return {CONF_AGENT_ID: "agent_is_self"}
    if conversation.async_get_agent_info(hass, agent_id) is None:
        return {CONF_AGENT_ID: "agent_not_found"}
    return {}
