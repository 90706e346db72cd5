"""The presentation layer: graphviz diagrams, the notebook explorer and the ``inspect`` report.

- :mod:`graphkit.drawing.diagram`: :func:`draw` (a ``graphviz.Digraph`` of a graph and its parameter
  groups), :func:`groups_diagram`, :func:`render` (``dot`` to SVG / PNG / PDF with a time budget);
- :mod:`graphkit.drawing.explorer`: :func:`~graphkit.drawing.explorer.explore`, the ipywidgets explorer
  (extra ``notebook``);
- :mod:`graphkit.drawing.report`: :func:`~graphkit.drawing.report.inspect`, the one-page HTML report;
- :mod:`graphkit.drawing.timeline`: recorded pipeline schedule steps, one row per rank (SVG, PNG, HTML).

Drawing reads the graph, analysis and split layers; none of them imports drawing at module level.
"""

from __future__ import annotations

from graphkit.drawing.diagram import draw, groups_diagram
from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError, render

__all__ = ["GraphvizNotFoundError", "RenderTimeoutError", "draw", "groups_diagram", "render"]
