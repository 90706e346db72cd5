"""Laying out a diagram with the Graphviz ``dot`` program: SVG, PNG, PDF or DOT files, with a time budget."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphkit.drawing.collapsing import drawn_node_count
from graphkit.drawing.diagram import draw
from graphkit.drawing.folding import folded_node_count
from graphkit.graph.autograd_graph import AutogradGraph

__all__ = ["FORMATS", "GraphvizNotFoundError", "RenderTimeoutError", "drawn_nodes", "render", "run_dot"]


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


def run_dot(
    source: str, output_format: str, timeout_s: float, nodes: int, warn: Callable[[str], Any] | None = None
) -> bytes:
    """Lay out DOT ``source`` with the ``dot`` program and return the ``output_format`` bytes.

    ``warn`` is called with each warning ``dot`` prints (a bitmap shrunk to Cairo's 32767-pixel limit:
    write ``.svg`` for full size).

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
            "Draw less: fold repeated structure (fold=True, --fold), collapse modules to a depth "
            "(collapse_depth=, --collapse DEPTH), lower the node budget (max_nodes=, --max-nodes N), or "
            "write .dot and lay it out yourself"
        ) from None
    message = completed.stderr.decode("utf-8", "replace").strip()
    if completed.returncode != 0:
        raise RuntimeError(f"Graphviz 'dot' failed (exit status {completed.returncode}): {message}")
    if warn is not None:
        for line in message.splitlines():
            if "Scaling" in line or "too large" in line:
                warn(
                    f"Graphviz shrank the picture to fit its size limit ({line.strip()}); write .svg for full size"
                )
    return completed.stdout


def render(
    graph: AutogradGraph,
    path: str | Path,
    groups: Any = None,
    *,
    timeout_s: float = 60.0,
    fallback: bool = True,
    progress: Callable[[str], Any] | None = None,
    **options: Any,
) -> Path:
    """Draw ``graph`` (see :func:`~graphkit.drawing.diagram.draw`, which takes ``options``) and write it to ``path``.

    The format comes from the suffix: ``.svg``, ``.png``, ``.pdf`` (laid out by the Graphviz ``dot``
    program within a time budget of ``timeout_s`` seconds) or ``.dot`` (the DOT source; needs no
    Graphviz). The folder of ``path`` is created when missing.

    When ``dot`` runs past the budget and ``fallback`` is true, the graph is drawn smaller and laid out
    again (with a second budget): folded repeated structure (``fold=True``) when that draws fewer nodes,
    else modules collapsed at depth 1; the diagram's notes say what happened, and so does ``progress``.

    Args:
        progress: called with one line of text before each layout and on a fallback (None: silent).

    Returns:
        ``path`` as a :class:`pathlib.Path`.

    Raises:
        ValueError: unknown suffix, or a bad option (see :func:`~graphkit.drawing.diagram.draw`).
        GraphvizNotFoundError: ``dot`` is not installed and the format needs it.
        RenderTimeoutError: layout took longer than ``timeout_s`` (also after the fallback, if any).
        RuntimeError: ``dot`` failed.
    """
    path = Path(path)
    output_format = path.suffix.lower().removeprefix(".")
    if output_format not in FORMATS:
        known = ", ".join(f".{name}" for name in FORMATS)
        raise ValueError(f"cannot tell the format of {str(path)!r}: the file name must end in one of {known}")
    if output_format != "dot" and shutil.which("dot") is None:
        raise GraphvizNotFoundError(_INSTALL_HELP.format(what=path.name))
    say = progress or (lambda _text: None)
    digraph = draw(graph, groups, **options)
    path.parent.mkdir(parents=True, exist_ok=True)
    if output_format == "dot":
        path.write_text(digraph.source, encoding="utf-8")
        return path
    nodes = drawn_nodes(digraph)
    say(f"laying out {nodes} nodes with Graphviz dot (budget {timeout_s:g} s)")
    try:
        path.write_bytes(run_dot(digraph.source, output_format, timeout_s, nodes, say))
        return path
    except RenderTimeoutError as error:
        smaller = _smaller_options(graph, options, nodes) if fallback else None
        if smaller is None:
            raise
        what, smaller_options = smaller
        note = f"Graphviz dot did not lay out {nodes} nodes within {timeout_s:g} s: drawn {what} instead"
        say(note)
        notes = [*smaller_options.pop("notes", ()), note]
        digraph = draw(graph, groups, notes=notes, **smaller_options)
        retry_nodes = drawn_nodes(digraph)
        try:
            path.write_bytes(run_dot(digraph.source, output_format, timeout_s, retry_nodes, say))
        except RenderTimeoutError:
            raise error from None
    return path


def drawn_nodes(digraph: Any) -> int:
    """Nodes in a ``graphviz.Digraph``'s body (proxy copies included, the legend not)."""
    count = 0
    for line in digraph.body:
        text = line.strip()
        if " [" in text and " -> " not in text and not text.startswith(("graph ", "node ", "edge ")):
            count += 1
    return count


def _smaller_options(
    graph: AutogradGraph, options: dict[str, Any], nodes: int
) -> tuple[str, dict[str, Any]] | None:
    """A smaller drawing of ``graph`` after a layout timeout: folded, or collapsed at depth 1; None if none."""
    if not options.get("fold") and folded_node_count(graph) < 0.8 * nodes:
        return "with repeated structure folded", {**options, "fold": True}
    if options.get("collapse_depth") != 1 and drawn_node_count(graph, 1) < 0.8 * nodes:
        return "with modules collapsed at depth 1", {**options, "collapse_depth": 1, "fold": False}
    return None
