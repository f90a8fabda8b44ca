"""The duplex package imports nothing from Home Assistant, and livekit only lazily."""

from __future__ import annotations

import subprocess
import sys


def test_duplex_imports_no_home_assistant_and_no_livekit() -> None:
    """Importing the package in a fresh interpreter loads neither homeassistant nor livekit."""
    code = (
        "import sys, custom_components.rtvoice.duplex as d;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('homeassistant', 'livekit', 'pymicro_vad')];"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
