"""What the ``graphkit`` commands print with: aligned tables on stdout, timed progress lines on stderr."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["print_table", "progress"]


def print_table(rows: Sequence[Sequence[str]], out: Any = None, wrap_last: bool = False) -> None:
    """Print ``rows`` as left-aligned columns, the first row as the header underlined with dashes.

    Args:
        rows: the header, then one row per line; every row has as many cells as the header.
        out: a text stream (default ``sys.stdout``).
        wrap_last: on a terminal, wrap the last column's text to the terminal's width
            (``shutil.get_terminal_size``; at least 30 characters), continuation lines under the column. Output
            to a file or a pipe keeps one line per row, for grep.
    """
    out = out or sys.stdout
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    if wrap_last and getattr(out, "isatty", lambda: False)():
        before = sum(widths[:-1]) + 2 * (len(widths) - 1)
        widths[-1] = min(widths[-1], max(30, shutil.get_terminal_size().columns - 1 - before))
    for position, row in enumerate(rows):
        last = textwrap.wrap(row[-1], widths[-1]) if len(row[-1]) > widths[-1] else [row[-1]]
        for line, text in enumerate(last):
            cells = [*(row[:-1] if line == 0 else [""] * (len(row) - 1)), text]
            print(
                "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip(),
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
