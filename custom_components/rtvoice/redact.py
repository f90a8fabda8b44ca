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


def redact_url(url: str) -> str:
    """Return ``url`` with its secrets masked, its shape kept (what a form shows).

    User and password become ``***``, every query value ``***`` (its names stay:
    the user sees which parameters the stored URL has), the fragment ``***``. A
    URL without any of those comes back unchanged, so a form that shows it and
    gets it back can tell "unchanged" (``url == redact_url(stored)``) from an edit.
    """
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        return REDACTED
    if not parsed.absolute:
        return url
    if parsed.user is None and not parsed.query_string and not parsed.fragment:
        return url
    redacted = parsed
    if parsed.user is not None:
        redacted = redacted.with_user(MASK)
        if parsed.password is not None:
            redacted = redacted.with_password(MASK)
    if parsed.query_string:
        redacted = redacted.with_query([(name, MASK) for name in parsed.query])
    if parsed.fragment:
        redacted = redacted.with_fragment(MASK)
    return str(redacted)


def endpoint_unique_id(base_url: str, model: str) -> str:
    """Return the unique id of an endpoint entry: URL without its secrets, model.

    Unique ids are shown and stored in the clear: the base URL's user info,
    query and fragment (they may hold credentials) are left out (``safe_url``).
    """
    return f"{safe_url(base_url.strip().rstrip('/'))}|{model.strip()}"


def mask_secret(text: str, secret: str | None) -> str:
    """Return ``text`` with every occurrence of ``secret`` masked."""
    return text.replace(secret, MASK) if secret else text
