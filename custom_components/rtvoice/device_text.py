"""What a device says about itself, made fit to show and to key on.

A zeroconf announcement, an ESPHome device's ``friendly_name`` or a Wyoming
``info`` is written by whoever is on the network: thousands of characters of
markdown or HTML in the confirm dialog, control characters in a unique id. Every
such text passes through here before it reaches a dialog, a title or an id:

- ``device_text``: one line of printable text (control and format characters
  dropped, whitespace collapsed), at most ``limit`` characters (an ellipsis marks
  the cut); what titles and stored names hold;
- ``markdown_text``: the same with markdown's and HTML's characters escaped, for
  a description placeholder (the frontend renders those as markdown);
- ``id_text``: for a unique id: the cleaned text, and when it had to be cut, a
  short hash of the whole so two long names stay apart.

HA-free.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final
import unicodedata

DEFAULT_LIMIT: Final = 64
ELLIPSIS: Final = "…"
_WHITESPACE = re.compile(r"\s+")
# The characters that start inline markdown (CommonMark: emphasis, code, links,
# images, tables, strike-through), HTML and entities, or a heading, escaped with a
# backslash (which renders them literally), plus the backslash itself. A
# placeholder sits inside a sentence: "1." or "-" start no list there.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>#|~&])")
_SCAN_LIMIT: Final = 4096  # characters looked at: a longer text is cut first


def _clean(value: Any) -> str:
    text = str(value)[:_SCAN_LIMIT]
    text = "".join(
        " " if char.isspace() else char
        for char in text
        if char.isspace() or not unicodedata.category(char).startswith("C")
    )
    return _WHITESPACE.sub(" ", text).strip()


def device_text(value: Any, limit: int = DEFAULT_LIMIT) -> str | None:
    """Return ``value`` as one printable line of at most ``limit`` characters.

    None stays None (an absent field).
    """
    if value is None:
        return None
    text = _clean(value)
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + ELLIPSIS
    return text


def markdown_text(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """Return ``device_text(value)`` with markdown and HTML characters escaped."""
    return _MARKDOWN.sub(r"\\\1", device_text(value, limit) or "")


def id_text(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    """Return ``value`` fit for a unique id: cleaned, cut with a hash of the whole."""
    whole = str(value)
    text = _clean(whole)
    if len(text) <= limit and len(whole) <= _SCAN_LIMIT:
        return text
    digest = hashlib.sha256(whole.encode("utf-8", "replace")).hexdigest()[:12]
    return f"{text[: limit - 13]}~{digest}"
