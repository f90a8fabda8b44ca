"""Links a user opens: the manifest's URLs and the README as HACS renders it.

Issue 12 items 18 and 19. The project's home is one base URL; the manifest's
documentation link opens the docs as shipped there, and every link in the README
is absolute (HACS renders the README outside the repository, where relative links
break) and names a file that exists in this tree.
"""

from __future__ import annotations

import json
from pathlib import Path
import re

ROOT = Path(__file__).parents[2]
BASE = "https://github.com/rtvoice/rtvoice"
IN_TREE = f"{BASE}/blob/main/"
MANIFEST = json.loads((ROOT / "custom_components/rtvoice/manifest.json").read_text())
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_manifest_urls_open_the_docs_and_the_tracker() -> None:
    """Documentation opens docs/index.md as shipped; issues go to the tracker."""
    assert MANIFEST["documentation"] == f"{IN_TREE}docs/index.md"
    assert MANIFEST["issue_tracker"] == f"{BASE}/issues"
    assert (ROOT / "docs/index.md").is_file()
    # The README states the base URL a user can open.
    assert f"Project home: **{BASE}**" in README


def test_readme_links_work_where_hacs_renders_it() -> None:
    """Absolute links only; those into this repository name files that exist."""
    links = LINK.findall(README)
    assert links
    for link in links:
        assert link.startswith("https://"), link
        if link.startswith(IN_TREE):
            path = link.removeprefix(IN_TREE).split("#", 1)[0]
            assert (ROOT / path).exists(), link


def test_readme_leads_with_what_a_hacs_user_needs() -> None:
    """What it is, installation through HACS and first use come before development."""
    headings = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert headings.index("Installation through HACS") == 0
    assert headings.index("First use") == 1
    assert headings.index("Development") > headings.index("First use")
    assert "RTVOICE_DEV_HOST=0.0.0.0" in README
    assert "apt-get" in README


def test_brand_images_note_matches_the_docs() -> None:
    """The README's link to the brand note lands on an existing heading."""
    installation = (ROOT / "docs/installation.md").read_text()
    assert "## Icon and logo" in installation
    assert "2026.3" in installation
    assert "installation.md#icon-and-logo" in README
