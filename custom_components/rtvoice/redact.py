"""What may be shown of a secret-bearing value: in logs, diagnostics and errors."""

from __future__ import annotations

from typing import Final

from yarl import URL

from homeassistant.components.diagnostics import REDACTED

MASK: Final = "***"


def safe_url(url: str) -> str:
    """Return a base URL without user info, query and fragment (they may hold keys)."""
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        return REDACTED
    if not parsed.absolute:
        return REDACTED
    return str(parsed.with_user(None).with_query(None).with_fragment(None))


def mask_secret(text: str, secret: str | None) -> str:
    """Return ``text`` with every occurrence of ``secret`` masked."""
    return text.replace(secret, MASK) if secret else text
