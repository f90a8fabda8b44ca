"""Pytest plugin: import the duplex links without Home Assistant (newest client libraries).

``scripts/test_esphome_latest`` runs the ESPHome and Wyoming link tests in a venv with
the aioesphomeapi and wyoming releases of current Home Assistant, which cannot share
a venv with the HA release the main suite runs (their protobuf and cryptography pins
conflict). The links import nothing from Home Assistant except through
``duplex_stream`` (the media-player fallback), whose HA half (the view, the registry
on ``hass.data``) these tests never use. This plugin registers
``custom_components.rtvoice`` as a bare package (``scripts.pytest_without_ha``) and,
only when Home Assistant is not installed, stands in for the three names
``duplex_stream`` imports: ``HomeAssistantView`` (a plain base class),
``HomeAssistant`` and ``callback`` (identity), ``get_url`` (never called here).
Load it with ``-p scripts.pytest_esphome_latest``.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

from scripts import pytest_without_ha  # noqa: F401 - registers the bare package


def _stub(name: str, **attributes: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


class _View:
    """Stands in for ``homeassistant.components.http.HomeAssistantView``."""


def _callback(func: Any) -> Any:
    return func


def _get_url(*args: Any, **kwargs: Any) -> str:
    raise RuntimeError("Home Assistant is not installed in this venv")


if importlib.util.find_spec("homeassistant") is None:
    _stub("homeassistant")
    _stub("homeassistant.components")
    _stub("homeassistant.components.http", HomeAssistantView=_View)
    _stub("homeassistant.core", HomeAssistant=object, callback=_callback)
    _stub("homeassistant.helpers")
    _stub("homeassistant.helpers.network", get_url=_get_url)
