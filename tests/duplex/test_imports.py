"""The duplex package imports nothing from Home Assistant, and its native wheels lazily."""

from __future__ import annotations

import ast
from pathlib import Path

from custom_components.rtvoice import duplex

PACKAGE = Path(duplex.__file__).parent
LAZY = {"livekit", "pymicro_vad"}  # optional native wheels: imported inside functions


def imports(tree: ast.AST, *, top_level_only: bool) -> set[str]:
    """Return the top-level module names imported in ``tree``."""
    nodes = tree.body if top_level_only else list(ast.walk(tree))  # type: ignore[attr-defined]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_home_assistant_and_lazy_native_wheels() -> None:
    """No module imports homeassistant at all; livekit and pymicro_vad only in functions."""
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        assert "homeassistant" not in imports(tree, top_level_only=False), path.name
        assert not LAZY & imports(tree, top_level_only=True), path.name
