"""Colours of the diagrams: Paul Tol's *muted* palette, border patterns, and the style of each parameter group.

Group ``i`` takes ``PALETTE[i % 18]`` and, once the palette cycles, a border pattern from :data:`PATTERNS`;
``group_style(i, faded=True)`` gives the grey shades of groups that are not highlighted. The neutral
colours of the input path, endpoints and collapsed modules live here too, so every picture (diagram,
explorer, report) paints a group the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ENDPOINT_FILL",
    "FADED",
    "FADED_FILL",
    "FADED_TEXT",
    "FADED_TINT",
    "FONT",
    "GroupStyle",
    "MODULE_FILL",
    "NEUTRAL_BORDER",
    "NEUTRAL_EDGE",
    "PALETTE",
    "PATTERNS",
    "SECONDARY_TEXT",
    "cell_border",
    "group_style",
    "luminance",
    "mix",
    "style_words",
]


PALETTE: tuple[str, ...] = (
    "#CC6677",  # rose
    "#332288",  # indigo
    "#DDCC77",  # sand
    "#117733",  # green
    "#88CCEE",  # cyan
    "#882255",  # wine
    "#44AA99",  # teal
    "#999933",  # olive
    "#AA4499",  # purple
    # past nine groups: hues of Paul Tol's *vibrant* and *light* schemes that differ from the nine above,
    # so that up to 18 groups differ by colour before any differs only by its border pattern
    "#EE7733",  # orange
    "#0077BB",  # blue
    "#EE3377",  # magenta
    "#BBCC33",  # pear
    "#667788",  # slate
    "#CC3311",  # red
    "#995522",  # brown
    "#FFAABB",  # pink
    "#225555",  # dark teal
)
"""Paul Tol's *muted* qualitative colour scheme (its nine colours first: distinct for the common forms of
colour blindness), then nine more hues from his *vibrant* and *light* schemes for larger models."""


PATTERNS: tuple[str, ...] = ("solid", "dashed", "bold", "dotted", "bold,dashed", "bold,dotted")
"""Border patterns that tell groups apart once :data:`PALETTE` cycles (group ``i`` uses
``PATTERNS[i // len(PALETTE) % len(PATTERNS)]``)."""


FONT = "Helvetica"


NEUTRAL_BORDER = "#8C8C8C"


NEUTRAL_EDGE = "#6E6E6E"


SECONDARY_TEXT = "#5A5A5A"


ENDPOINT_FILL = "#3B3B3B"


MODULE_FILL = "#F2F2F2"


FADED = "#C8C8C8"


FADED_TEXT = "#9A9A9A"


FADED_FILL = "#F1F1F1"


FADED_TINT = "#F8F8F8"


@dataclass(slots=True, frozen=True)
class GroupStyle:
    """How one parameter group is painted.

    Attributes:
        index: the group's index.
        colour: border and edge colour (``#RRGGBB``).
        text: a darker shade of ``colour`` for text on white or on ``tint``.
        fill: fill of the group's parameter leaves (``colour`` mixed with white).
        tint: background of the group's cluster (a paler mix).
        pattern: border pattern (one of :data:`PATTERNS`).
    """

    index: int
    colour: str
    text: str
    fill: str
    tint: str
    pattern: str


def mix(colour: str, other: str, amount: float) -> str:
    """``colour`` moved ``amount`` (0..1) of the way towards ``other``; both ``#RRGGBB``."""
    first = [int(colour[position : position + 2], 16) for position in (1, 3, 5)]
    second = [int(other[position : position + 2], 16) for position in (1, 3, 5)]
    mixed = [round(a + (b - a) * amount) for a, b in zip(first, second, strict=True)]
    return "#" + "".join(f"{channel:02X}" for channel in mixed)


def luminance(colour: str) -> float:
    """Relative luminance (0 black .. 1 white) of ``#RRGGBB``, sRGB weights without gamma."""
    red, green, blue = (int(colour[position : position + 2], 16) / 255 for position in (1, 3, 5))
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def cell_border(style: GroupStyle, *, thin: bool = False) -> str:
    """HTML table cell attributes drawing a border in the group's colour and pattern."""
    width = (2 if thin else 3) if "bold" in style.pattern else (1 if thin else 2)
    attributes = f'color="{style.colour}" border="{width}"'
    for pattern in ("dashed", "dotted"):
        if pattern in style.pattern:
            attributes += f' style="{pattern}"'
    return attributes


def group_style(index: int, *, faded: bool = False) -> GroupStyle:
    """The colours and border pattern of group ``index`` (grey shades when ``faded``).

    Raises:
        ValueError: ``index`` is negative.
    """
    if index < 0:
        raise ValueError(f"group index must be >= 0, got {index}")
    pattern = PATTERNS[index // len(PALETTE) % len(PATTERNS)]
    if faded:
        return GroupStyle(index, FADED, FADED_TEXT, FADED_FILL, FADED_TINT, pattern)
    base = PALETTE[index % len(PALETTE)]
    # Light members of the palette (sand, cyan) get a darker line so thin borders and edges stay visible.
    colour = base if luminance(base) < 0.6 else mix(base, "#000000", 0.22)
    return GroupStyle(
        index=index,
        colour=colour,
        text=mix(base, "#000000", 0.4),
        fill=mix(base, "#FFFFFF", 0.55),
        tint=mix(base, "#FFFFFF", 0.86),
        pattern=pattern,
    )


def style_words(*words: str) -> str:
    """Join graphviz style words, dropping ``solid`` and empty words."""
    kept: list[str] = []
    for word in words:
        for part in word.split(","):
            if part and part != "solid" and part not in kept:
                kept.append(part)
    return ",".join(kept) or "solid"
