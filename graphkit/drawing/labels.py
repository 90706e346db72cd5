"""Text in the diagrams: HTML-like graphviz labels, shapes, byte counts."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from graphkit.drawing.palette import SECONDARY_TEXT

__all__ = [
    "escape",
    "format_bytes",
    "format_shape",
    "html_label",
    "saved_line",
    "shape_lines",
    "with_uses_note",
]


# --- labels -------------------------------------------------------------------------------------------------
def escape(value: Any) -> str:
    return html.escape(str(value), quote=True)


def format_shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(size) for size in shape) + ")"


def format_bytes(count: int) -> str:
    """``count`` bytes for people: ``512 B``, ``95.4 KiB``, ``1.2 GiB``."""
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def html_label(title: str, lines: Sequence[tuple[str, str]] = (), *, title_colour: str | None = None) -> str:
    """An HTML-like graphviz label: a bold title, then small lines given as ``(text, colour)``."""
    head = f"<b>{escape(title)}</b>"
    if title_colour:
        head = f'<font color="{title_colour}">{head}</font>'
    parts = [head]
    for line, colour in lines:
        parts.append(f'<font point-size="9" color="{colour}">{escape(line)}</font>')
    return "<" + "<br/>".join(parts) + ">"


def shape_lines(data: dict[str, Any], show_shapes: bool) -> list[str]:
    shapes = data.get("shapes") or []
    if not show_shapes or not shapes:
        return []
    if len(shapes) == 1:
        return [format_shape(shapes[0])]
    lines = [f"{position}: {format_shape(shape)}" for position, shape in enumerate(shapes[:4])]
    if len(shapes) > 4:
        lines.append(f"... {len(shapes)} outputs")
    return lines


def saved_line(data: dict[str, Any]) -> str | None:
    if data.get("saved_reason"):
        return "saved: freed"
    saved = data.get("saved_bytes")
    if not saved:
        return None
    return f"saved {format_bytes(saved)}"


def with_uses_note(label: str, uses: int) -> str:
    """Add 'used N times: one copy per use' under an HTML label."""
    note = f'<font point-size="9" color="{SECONDARY_TEXT}">used {uses} times: one copy per use</font>'
    inner = label[1:-1]
    if inner.startswith("<table"):
        return (
            '<<table border="0" cellborder="0" cellspacing="0" cellpadding="0">'
            f"<tr><td>{inner}</td></tr><tr><td>{note}</td></tr></table>>"
        )
    return f"<{inner}<br/>{note}>"
