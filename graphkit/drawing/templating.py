"""The Jinja2 environment of graphkit's HTML: the report page and the notebook explorer's panels.

Templates live in ``graphkit/drawing/templates/`` (``*.html.j2``, with the stylesheets and scripts they
inline). Autoescaping is on, so every value is HTML-escaped unless a template marks it ``|safe`` (only
SVG that Graphviz wrote); an undefined name is an error, not an empty string.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jinja2

from graphkit.drawing.labels import format_bytes

__all__ = ["TEMPLATES", "environment"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
"""The folder of graphkit's templates, stylesheets and scripts."""


def _bytes_exact(count: int | None) -> str:
    """``512 B``, or ``2.2 KiB (2,304 B)``; ``-`` when unknown."""
    if count is None:
        return "-"
    return f"{count:,} B" if count < 1024 else f"{format_bytes(count)} ({count:,} B)"


@cache
def environment() -> jinja2.Environment:
    """The shared environment: autoescaping, strict undefined names, graphkit's filters.

    Filters: ``shape`` (``(2, 3)``), ``thousands`` (``1,024``), ``bytes_exact`` (``2.2 KiB (2,304 B)``)
    and ``format_bytes`` (``2.2 KiB``); the report page adds its own (see
    :mod:`graphkit.apps.report.page`).
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        shape=lambda shape: "?" if shape is None else "(" + ", ".join(str(size) for size in shape) + ")",
        thousands="{:,}".format,
        bytes_exact=_bytes_exact,
        format_bytes=format_bytes,
    )
    return env
