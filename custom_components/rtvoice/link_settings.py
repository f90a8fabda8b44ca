"""A satellite's stored link settings, as the links read them (one place, pydantic).

Each satellite an entry owns is stored as a plain mapping, the data of its
config subentry (``satellites.stored``). Before a link starts, its mapping passes
through one of these models: the address is checked (a host, a port in 1–65535),
and the ESPHome noise key becomes a ``SecretStr``, so no repr, log line or
traceback of the settings shows it (``str(settings)`` prints ``**********``); only
``link_config()`` hands the key to aioesphomeapi. A mapping that does not fit
raises ``LinkSettingsError`` naming the fields, never their values. HA-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

from .const import DEFAULT_ESPHOME_PORT, DEFAULT_WYOMING_PORT
from .esphome_link import LinkConfig


class LinkSettingsError(ValueError):
    """Stored link settings that no link can use (the fields, no values)."""


class _Address(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)

    @field_validator("host", mode="before")
    @classmethod
    def _strip(cls, value: Any) -> Any:
        return value.strip() if isinstance(value, str) else value


class EsphomeLinkSettings(_Address):
    """An ESPHome satellite: address and noise key."""

    port: int = Field(default=DEFAULT_ESPHOME_PORT, ge=1, le=65535)
    noise_psk: SecretStr | None = None

    @field_validator("noise_psk", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
        return value or None

    def link_config(self) -> LinkConfig:
        """Return the link's configuration (the only place the key is read)."""
        key = self.noise_psk.get_secret_value() if self.noise_psk else None
        return LinkConfig(host=self.host, port=self.port, noise_psk=key)


class WyomingLinkSettings(_Address):
    """A Wyoming satellite: address."""

    port: int = Field(default=DEFAULT_WYOMING_PORT, ge=1, le=65535)


def _load[T: BaseModel](model: type[T], conf: Mapping[str, Any]) -> T:
    try:
        return model.model_validate(dict(conf))
    except ValidationError as err:
        fields = sorted({".".join(map(str, e["loc"])) or "?" for e in err.errors()})
        raise LinkSettingsError(", ".join(fields)) from None


def esphome_settings(conf: Mapping[str, Any]) -> EsphomeLinkSettings:
    """Return the checked settings of a stored ESPHome satellite."""
    return _load(EsphomeLinkSettings, conf)


def wyoming_settings(conf: Mapping[str, Any]) -> WyomingLinkSettings:
    """Return the checked settings of a stored Wyoming satellite."""
    return _load(WyomingLinkSettings, conf)
