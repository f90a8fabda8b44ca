"""Pytest plugin: import ``custom_components.rtvoice.kernel`` without Home Assistant.

The kernel imports nothing from Home Assistant, but its package's ``__init__`` does.
This plugin registers ``custom_components.rtvoice`` as a bare package (its
``__init__`` is not run), so the kernel, its provider and the loopback peers can be
tested in a venv without Home Assistant, e.g. against another ``openai`` release
(``scripts/test_openai_latest``). Load it with ``-p scripts.pytest_without_ha``.
"""

from __future__ import annotations

from pathlib import Path
import sys
import types

_ROOT = Path(__file__).resolve().parent.parent


def _bare_package(name: str, path: Path) -> None:
    if name in sys.modules:
        return
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    module.__file__ = None
    sys.modules[name] = module


_bare_package("custom_components", _ROOT / "custom_components")
_bare_package("custom_components.rtvoice", _ROOT / "custom_components" / "rtvoice")
