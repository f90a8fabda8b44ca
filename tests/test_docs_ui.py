"""The pages name what the entry's page shows for a satellite.

Found walking README's first use in a browser on Home Assistant 2025.4.4: a
satellite listed under the Realtime Voice entry has a *Configure* button on its row
(a cog on newer versions) and *Delete* in its ⋮ menu, but README and the guides
sent the user to a "Reconfigure" in that menu. (The entry's own ⋮ menu does have
*Reconfigure*: it changes the brain.)
"""

from __future__ import annotations

from pathlib import Path

from tests.test_docs_features import sentences

ROOT = Path(__file__).parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def satellite_menu_reconfigure(page: Path) -> list[str]:
    """Return the sentences of ``page`` that put Reconfigure in a satellite's ⋮ menu."""
    return [
        f"{page.name}: {sentence[:160]}"
        for sentence in sentences(page.read_text())
        if "⋮" in sentence
        and "Reconfigure" in sentence
        and "satellite" in sentence.lower()
    ]


def test_no_page_puts_reconfigure_in_a_satellites_menu() -> None:
    """A satellite is changed with Configure on its row, not ⋮ → Reconfigure."""
    assert [s for page in PAGES for s in satellite_menu_reconfigure(page)] == []


def test_the_check_finds_a_satellites_reconfigure(tmp_path: Path) -> None:
    """The wording the walk found is caught, the entry's own Reconfigure is not."""
    page = tmp_path / "page.md"
    page.write_text(
        "On the entry, choose ⋮ → *Reconfigure*: change the brain.\n\n"
        "- each satellite's ⋮ menu has **Reconfigure** (its address) and"
        " **Delete**.\n"
    )
    (found,) = satellite_menu_reconfigure(page)
    assert "each satellite's ⋮ menu has **Reconfigure**" in found
