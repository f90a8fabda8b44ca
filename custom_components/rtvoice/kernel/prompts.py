"""Prompt sections: owners declare short texts that are rendered into system prompts.

Sections are re-rendered every round, so an update applies at the next round.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PromptSection:
    """One declared piece of system prompt.

    ``section`` is ``"<owner>.<name>"``; ``scope`` None applies to every child, else
    only to children whose prompt scope equals it (e.g. one satellite).
    """

    section: str
    owner: str
    content: str
    order: int = 0
    volatile: bool = False
    scope: str | None = None


class PromptRegistry:
    """Sections by name; declaring again overwrites, empty content removes."""

    def __init__(self) -> None:
        """Create an empty registry."""
        self._sections: dict[str, PromptSection] = {}
        self._sorted: list[PromptSection] | None = []

    def declare(self, s: PromptSection) -> None:
        """Declare or overwrite a section; empty content removes it."""
        prefix = f"{s.owner}."
        if (
            not s.owner
            or not s.section.startswith(prefix)
            or len(s.section) == len(prefix)
        ):
            raise ValueError(
                f"section name {s.section!r} must be {prefix!r} followed by a name"
            )
        if not s.content.strip():
            self.remove(s.section)
            return
        self._sections[s.section] = s
        self._sorted = None

    def remove(self, section: str) -> None:
        """Remove one section (no error when unknown)."""
        if self._sections.pop(section, None) is not None:
            self._sorted = None

    def remove_owner(self, owner: str) -> None:
        """Remove every section of ``owner``."""
        for name in [n for n, s in self._sections.items() if s.owner == owner]:
            del self._sections[name]
        self._sorted = None

    def snapshot(self) -> list[PromptSection]:
        """Every section sorted by (order, section)."""
        if self._sorted is None:
            self._sorted = sorted(
                self._sections.values(), key=lambda s: (s.order, s.section)
            )
        return list(self._sorted)

    def render(self, scope: str | None = None) -> str:
        """Global sections plus those of ``scope``, joined by a blank line."""
        if self._sorted is None:
            self.snapshot()
        assert self._sorted is not None
        return "\n\n".join(
            s.content for s in self._sorted if s.scope is None or s.scope == scope
        )
