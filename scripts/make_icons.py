"""Draw the brand icons of the integration (custom_components/rtvoice/brand).

A white speech bubble holding sound-wave bars on a round blue gradient, with a
transparent background. Run with the project venv (Pillow comes with Home
Assistant):

    .venv/bin/python scripts/make_icons.py

It writes icon.png (256x256) and icon@2x.png (512x512), and the landscape logo
(the icon followed by the name) as logo.png (256 px high) and logo@2x.png (512 px
high) with dark lettering for light backgrounds, plus dark_logo.png and
dark_logo@2x.png with white lettering for dark themes. The lettering uses the font
that ships inside Pillow (Aileron, public domain), so every machine draws the same
logo.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

BRAND_DIR = Path(__file__).resolve().parent.parent / "custom_components/rtvoice/brand"
SIZES = {"icon.png": 256, "icon@2x.png": 512}
# Logo height by file, and the colour of its lettering.
LOGO_NAME = "Realtime Voice"
TEXT_COLOR = (33, 33, 33, 255)  # near black, for light backgrounds
DARK_TEXT_COLOR = (255, 255, 255, 255)  # for dark themes
LOGOS = {
    "logo.png": (256, TEXT_COLOR),
    "logo@2x.png": (512, TEXT_COLOR),
    "dark_logo.png": (256, DARK_TEXT_COLOR),
    "dark_logo@2x.png": (512, DARK_TEXT_COLOR),
}
# Draw big, then scale down: smooth edges without per-shape antialiasing.
CANVAS = 2048

TOP_COLOR = (3, 169, 244)  # Home Assistant blue
BOTTOM_COLOR = (40, 53, 147)  # indigo
BAR_COLOR = (2, 119, 189)
WHITE = (255, 255, 255, 255)
# Relative heights of the sound-wave bars, left to right.
BAR_HEIGHTS = (0.30, 0.62, 1.0, 0.78, 0.45)


def _gradient_disc(size: int) -> Image.Image:
    """Return a disc filled with a vertical gradient on transparency."""
    gradient = Image.new("RGBA", (size, size))
    draw = ImageDraw.Draw(gradient)
    for y in range(size):
        t = y / (size - 1)
        color = tuple(
            round(top + (bottom - top) * t)
            for top, bottom in zip(TOP_COLOR, BOTTOM_COLOR, strict=True)
        )
        draw.line([(0, y), (size, y)], fill=(*color, 255))
    mask = Image.new("L", (size, size), 0)
    margin = size * 0.02
    ImageDraw.Draw(mask).ellipse(
        [margin, margin, size - margin, size - margin], fill=255
    )
    disc = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    disc.paste(gradient, (0, 0), mask)
    return disc


def _draw_bubble(image: Image.Image) -> None:
    """Draw the speech bubble and its sound-wave bars onto the image."""
    size = image.width
    draw = ImageDraw.Draw(image)
    left, right = size * 0.20, size * 0.80
    top, bottom = size * 0.24, size * 0.68
    draw.rounded_rectangle([left, top, right, bottom], radius=size * 0.11, fill=WHITE)
    # The tail, bottom left, pointing down-left.
    draw.polygon(
        [
            (size * 0.30, bottom - size * 0.02),
            (size * 0.46, bottom - size * 0.02),
            (size * 0.27, size * 0.82),
        ],
        fill=WHITE,
    )
    bar_width = size * 0.055
    gap = size * 0.035
    total = len(BAR_HEIGHTS) * bar_width + (len(BAR_HEIGHTS) - 1) * gap
    x = (left + right - total) / 2
    middle = (top + bottom) / 2
    max_height = (bottom - top) * 0.66
    for rel in BAR_HEIGHTS:
        half = max_height * rel / 2
        draw.rounded_rectangle(
            [x, middle - half, x + bar_width, middle + half],
            radius=bar_width / 2,
            fill=(*BAR_COLOR, 255),
        )
        x += bar_width + gap


def render(size: int) -> Image.Image:
    """Return the icon at size x size pixels."""
    image = _gradient_disc(CANVAS)
    _draw_bubble(image)
    return image.resize((size, size), Image.Resampling.LANCZOS)


def render_logo(height: int, text_color: tuple[int, int, int, int]) -> Image.Image:
    """Return the logo: the icon, then the name, ``height`` pixels high, trimmed."""
    scale = 4  # draw big, then scale down
    big = height * scale
    icon = render(big)
    font = ImageFont.load_default(size=round(big * 0.42))
    left, top, right, bottom = font.getbbox(LOGO_NAME)
    gap = round(big * 0.14)
    image = Image.new("RGBA", (big + gap + right - left, big), (0, 0, 0, 0))
    image.paste(icon, (0, 0), icon)
    # Centre the letters' ink (not the font's line box) on the icon's middle.
    y = (big - (bottom - top)) // 2 - top
    ImageDraw.Draw(image).text(
        (big + gap - left, y), LOGO_NAME, font=font, fill=text_color
    )
    image = image.crop(image.getbbox())
    width = round(image.width * height / image.height)
    return image.resize((width, height), Image.Resampling.LANCZOS)


def main() -> None:
    """Write every icon and logo into the brand folder."""
    BRAND_DIR.mkdir(parents=True, exist_ok=True)
    for name, size in SIZES.items():
        path = BRAND_DIR / name
        render(size).save(path, optimize=True)
        print(f"wrote {path} ({size}x{size})")
    for name, (height, color) in LOGOS.items():
        path = BRAND_DIR / name
        logo = render_logo(height, color)
        logo.save(path, optimize=True)
        print(f"wrote {path} ({logo.width}x{logo.height})")


if __name__ == "__main__":
    main()
