"""What the ``graphkit`` commands print with: aligned tables on stdout, timed progress lines on stderr."""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["print_model_error", "print_table", "progress"]


def print_model_error(arguments: Any, raised: str, where: str, traceback_text: str) -> None:
    """One line on stderr saying that the spec's own model raised ``raised`` (``"ValueError: ..."``) at
    ``where`` (``"file.py:12 in forward"``); with ``--traceback``, the whole ``traceback_text`` after it."""
    spec = getattr(arguments, "spec", None) or "the default spec"
    print(
        f"graphkit {arguments.command}: error: the model of {spec} raised {raised} ({where})"
        + ("" if arguments.traceback else "; --traceback prints the whole traceback"),
        file=sys.stderr,
    )
    if arguments.traceback:
        print(traceback_text, file=sys.stderr, end="")


def print_table(
    rows: Sequence[Sequence[str]],
    out: Any = None,
    wrap_last: bool = False,
    wrap: dict[int, int] | None = None,
) -> None:
    """Print ``rows`` as left-aligned columns, the first row as the header underlined with dashes.

    Args:
        rows: the header, then one row per line; every row has as many cells as the header.
        out: a text stream (default ``sys.stdout``).
        wrap_last: on a terminal, wrap the last column's text to the terminal's width
            (``shutil.get_terminal_size``; at least 30 characters), continuation lines under the column. Output
            to a file or a pipe keeps one line per row, for grep.
        wrap: ``{column: width}``: wrap those columns' text at that many characters, on a terminal or not
            (lists of names that would otherwise make rows hundreds of characters long).
    """
    out = out or sys.stdout
    rows = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for column, width in (wrap or {}).items():
        widths[column] = min(widths[column], max(width, len(rows[0][column])))
    if wrap_last and getattr(out, "isatty", lambda: False)():
        before = sum(widths[:-1]) + 2 * (len(widths) - 1)
        widths[-1] = min(widths[-1], max(30, shutil.get_terminal_size().columns - 1 - before))
    for position, row in enumerate(rows):
        cells = [
            textwrap.wrap(cell, width) if len(cell) > width else [cell]
            for cell, width in zip(row, widths, strict=True)
        ]
        for line in range(max(len(parts) for parts in cells)):
            texts = [parts[line] if line < len(parts) else "" for parts in cells]
            print(
                "  ".join(text.ljust(width) for text, width in zip(texts, widths, strict=True)).rstrip(),
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
