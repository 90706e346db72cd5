"""What the ``graphkit`` commands print with: aligned tables on stdout, timed progress lines on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["print_table", "progress"]


def print_table(rows: Sequence[Sequence[str]], out: Any = None) -> None:
    """Print ``rows`` as left-aligned columns, the first row as the header underlined with dashes.

    Args:
        rows: the header, then one row per line; every row has as many cells as the header.
        out: a text stream (default ``sys.stdout``).
    """
    out = out or sys.stdout
    widths = [max(len(str(row[column])) for row in rows) for column in range(len(rows[0]))]
    for position, row in enumerate(rows):
        print(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )
        if position == 0:
            print("  ".join("-" * width for width in widths), file=out)


def progress(command: str) -> Callable[[str], None]:
    """A function that prints one progress line (with the seconds since the command started) to stderr."""
    start = time.perf_counter()

    def say(text: str) -> None:
        print(
            f"graphkit {command}: [{time.perf_counter() - start:6.2f} s] {text}", file=sys.stderr, flush=True
        )

    return say
