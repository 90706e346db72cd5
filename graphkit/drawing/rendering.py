"""Laying out a diagram with the Graphviz ``dot`` program: SVG, PNG, PDF or DOT files, with a time budget."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from graphkit.drawing.diagram import draw
from graphkit.graph.autograd_graph import AutogradGraph

__all__ = ["FORMATS", "GraphvizNotFoundError", "RenderTimeoutError", "render", "run_dot"]


FORMATS: tuple[str, ...] = ("svg", "png", "pdf", "dot")
"""Output formats :func:`render` writes, chosen by the file suffix."""


class GraphvizNotFoundError(RuntimeError):
    """The Graphviz ``dot`` program is not installed (or not on ``PATH``)."""


class RenderTimeoutError(RuntimeError):
    """``dot`` did not finish laying out the graph within the time limit."""


# --- rendering ----------------------------------------------------------------------------------------------
_INSTALL_HELP = (
    "the Graphviz 'dot' program is not installed (or not on PATH), so graphkit cannot lay out {what}. "
    "Install Graphviz: 'apt-get install graphviz' (Debian, Ubuntu), 'brew install graphviz' (macOS), "
    "'conda install -c conda-forge graphviz', or see https://graphviz.org/download/. "
    "Writing a .dot file works without it."
)


def run_dot(source: str, output_format: str, timeout_s: float, nodes: int) -> bytes:
    """Lay out DOT ``source`` with the ``dot`` program and return the ``output_format`` bytes.

    Raises:
        GraphvizNotFoundError: ``dot`` is not on PATH.
        RenderTimeoutError: ``dot`` ran longer than ``timeout_s`` seconds (it is killed).
        RuntimeError: ``dot`` failed (its error output is in the message).
    """
    program = shutil.which("dot")
    if program is None:
        raise GraphvizNotFoundError(_INSTALL_HELP.format(what=f"a .{output_format} file"))
    try:
        completed = subprocess.run(
            [program, f"-T{output_format}"],
            input=source.encode("utf-8"),
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RenderTimeoutError(
            f"Graphviz 'dot' did not finish laying out {nodes} nodes within {timeout_s:g} s and was stopped. "
            "Draw less: collapse modules to a depth (collapse_depth=, or --collapse DEPTH on the command "
            "line), lower the node budget (max_nodes=, --max-nodes N), or write .dot and lay it out "
            "yourself"
        ) from None
    if completed.returncode != 0:
        message = completed.stderr.decode("utf-8", "replace").strip()
        raise RuntimeError(f"Graphviz 'dot' failed (exit status {completed.returncode}): {message}")
    return completed.stdout


def render(
    graph: AutogradGraph,
    path: str | Path,
    groups: Any = None,
    *,
    timeout_s: float = 120.0,
    **options: Any,
) -> Path:
    """Draw ``graph`` (see :func:`~graphkit.drawing.diagram.draw`, which takes ``options``) and write it to ``path``.

    The format comes from the suffix: ``.svg``, ``.png``, ``.pdf`` (laid out by the Graphviz ``dot``
    program, stopped after ``timeout_s`` seconds) or ``.dot`` (the DOT source; needs no Graphviz).

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ValueError: unknown suffix, or a bad option (see :func:`~graphkit.drawing.diagram.draw`).
        GraphvizNotFoundError: ``dot`` is not installed and the format needs it.
        RenderTimeoutError: layout took longer than ``timeout_s``.
        RuntimeError: ``dot`` failed.
    """
    path = Path(path)
    output_format = path.suffix.lower().removeprefix(".")
    if output_format not in FORMATS:
        known = ", ".join(f".{name}" for name in FORMATS)
        raise ValueError(f"cannot tell the format of {str(path)!r}: the file name must end in one of {known}")
    if output_format != "dot" and shutil.which("dot") is None:
        raise GraphvizNotFoundError(_INSTALL_HELP.format(what=path.name))
    digraph = draw(graph, groups, **options)
    if output_format == "dot":
        path.write_text(digraph.source, encoding="utf-8")
        return path
    nodes = sum(1 for line in digraph.body if " [" in line and " -> " not in line)
    path.write_bytes(run_dot(digraph.source, output_format, timeout_s, nodes))
    return path
