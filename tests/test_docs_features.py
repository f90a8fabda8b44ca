"""No page calls a shipped feature planned (issue 17 item 5).

``docs/features.md`` lists what ships, with the words the pages use for each
feature. Every sentence of the README, the user guide and the firmware README that
says *planned* (or *being built*, *coming soon*, *in a future version*) must not
name one of them.
"""

from __future__ import annotations

from pathlib import Path
import re

ROOT = Path(__file__).parents[1]
FEATURES = ROOT / "docs" / "features.md"
PAGES = sorted(
    [ROOT / "README.md", ROOT / "firmware" / "README.md", *(ROOT / "docs").glob("*.md")]
)
PLANNED = re.compile(
    r"\bplanned\b|\bbeing built\b|\bcoming soon\b|\bin a future\b|\bwill come\b",
    re.IGNORECASE,
)


def shipped_terms() -> dict[str, list[str]]:
    """Feature name → the words pages use for it, from the table of features.md."""
    terms: dict[str, list[str]] = {}
    for line in FEATURES.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("**"):
            continue
        name = cells[0].split("**")[1]
        terms[name] = [t.strip().lower() for t in cells[2].split(",") if t.strip()]
    return terms


def sentences(text: str) -> list[str]:
    """Split a page into sentences (paragraphs joined, markdown kept)."""
    flat = re.sub(r"\s+", " ", text)
    return re.split(r"(?<=[.!?])\s+(?=[A-Z*(`\[])", flat)


def planned_shipped(page: Path, terms: dict[str, list[str]]) -> list[str]:
    """Return the sentences of ``page`` that call a shipped feature planned."""
    found = []
    for sentence in sentences(page.read_text()):
        if not PLANNED.search(sentence):
            continue
        lowered = sentence.lower().replace("-", " ")
        for name, words in terms.items():
            if any(w.replace("-", " ") in lowered for w in words):
                found.append(f"{page.name}: {name}: {sentence[:160]}")
    return found


def test_the_feature_list_is_read() -> None:
    """The table parses, each feature with words to look for."""
    terms = shipped_terms()
    assert len(terms) >= 8
    assert all(terms.values())


def test_no_page_calls_a_shipped_feature_planned() -> None:
    """Every page agrees with features.md."""
    terms = shipped_terms()
    assert [f for page in PAGES for f in planned_shipped(page, terms)] == []


def test_the_check_finds_a_planned_feature(tmp_path: Path) -> None:
    """The check itself: a sentence calling duplex mode planned is found."""
    page = tmp_path / "old.md"
    page.write_text(
        "Intro.\n\nDuplex mode and the satellite firmware\nare planned. Wake words work."
    )
    found = planned_shipped(page, shipped_terms())
    assert [f.split(": ")[1] for f in found] == [
        "Duplex mode for ESPHome satellites",
        "Satellite firmware",
    ]
