"""The brand images meet Home Assistant's brand image rules (home-assistant/brands).

Icons: square PNG, 256x256 and 512x512 for hDPI. Logos: landscape PNG whose shortest
side is 128 to 256 pixels (256 to 512 for hDPI), trimmed. All with transparency.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image
import pytest

BRAND = Path(__file__).resolve().parent.parent / "custom_components/rtvoice/brand"


@pytest.mark.parametrize(("name", "size"), [("icon.png", 256), ("icon@2x.png", 512)])
def test_icons(name: str, size: int) -> None:
    """Icons are square, at the exact size, with a transparent background."""
    with Image.open(BRAND / name) as image:
        assert image.format == "PNG"
        assert image.mode == "RGBA"
        assert image.size == (size, size)
        assert image.getpixel((0, 0))[3] == 0  # a corner outside the disc


@pytest.mark.parametrize(
    ("name", "low", "high"),
    [
        ("logo.png", 128, 256),
        ("logo@2x.png", 256, 512),
        ("dark_logo.png", 128, 256),
        ("dark_logo@2x.png", 256, 512),
    ],
)
def test_logos(name: str, low: int, high: int) -> None:
    """Logos are landscape, their shortest side in range, trimmed, transparent."""
    with Image.open(BRAND / name) as image:
        assert image.format == "PNG"
        assert image.mode == "RGBA"
        width, height = image.size
        assert width > height
        assert low <= height <= high
        assert image.getbbox() == (0, 0, width, height)  # no empty border
        assert image.getpixel((width - 1, 0))[3] == 0  # transparent background


def test_logo_variants_match() -> None:
    """The hDPI and dark logos are the same drawing as logo.png."""
    with (
        Image.open(BRAND / "logo.png") as logo,
        Image.open(BRAND / "logo@2x.png") as logo_2x,
        Image.open(BRAND / "dark_logo.png") as dark,
    ):
        assert logo_2x.height == 2 * logo.height
        assert logo_2x.width / logo_2x.height == pytest.approx(
            logo.width / logo.height, rel=0.01
        )
        assert dark.size == logo.size
