"""Audio logic of Realtime Voice: pure Python, no Home Assistant imports.

Like the kernel, everything here is importable and testable without Home Assistant;
the HA-facing modules (``wake_word.py`` …) adapt it to Home Assistant's APIs.
"""

from __future__ import annotations
