"""Numbers and names as the report prints them, on the page and in the terminal alike."""

from __future__ import annotations

from graphkit.drawing.labels import format_bytes

__all__ = ["bytes_or_unknown", "error_text", "flop_text", "shape_text", "si_text", "tolerance_text"]


def si_text(value: float) -> str:
    """``1769472`` -> ``"1.77 M"``."""
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f}"


def flop_text(value: float) -> str:
    """``1769472`` -> ``"1.77 MFLOP"``, ``0`` -> ``"0 FLOP"``."""
    text = si_text(value)
    return f"{text}FLOP" if text[-1].isalpha() else f"{text} FLOP"


def tolerance_text(value: float) -> str:
    """``1e-4`` -> ``"1e-4"`` (not ``"0.0001"``)."""
    mantissa, _, exponent = f"{value:.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def bytes_or_unknown(count: int | None) -> str:
    """``count`` bytes for people (``95.4 KiB``), or why it is unknown."""
    return "unknown (the graph was freed)" if count is None else format_bytes(count)


def shape_text(shape: list[int] | None) -> str:
    """``[2, 3]`` -> ``"(2, 3)"``; None -> ``"?"``."""
    return "?" if shape is None else "(" + ", ".join(str(size) for size in shape) + ")"


def error_text(value: float | None) -> str:
    """A gradient error in scientific notation, ``-`` when there is none."""
    return "-" if value is None else f"{value:.2e}"
