"""The presentation layer: graphviz diagrams and pipeline timelines, nothing that runs a model.

- :mod:`graphkit.drawing.diagram`: :func:`draw` (a ``graphviz.Digraph`` of a graph and its parameter
  groups), :func:`groups_diagram`; :mod:`graphkit.drawing.rendering`: :func:`render` (``dot`` to
  SVG / PNG / PDF with a time budget);
- :mod:`graphkit.drawing.plan`, :mod:`~graphkit.drawing.collapsing`, :mod:`~graphkit.drawing.folding`:
  what a diagram shows before any DOT is written; :mod:`~graphkit.drawing.labels`,
  :mod:`~graphkit.drawing.legend`, :mod:`~graphkit.drawing.palette`: how it looks;
- :mod:`graphkit.drawing.templating`: the Jinja2 templates (``templates/``) of every HTML page;
- :mod:`graphkit.drawing.timeline`: recorded or predicted pipeline schedule steps, one row per rank
  (SVG, PNG, HTML).

The applications that orchestrate every layer (the ``inspect`` report, the notebook explorer) live in
:mod:`graphkit.apps`. Drawing reads the layers below it; none of them imports drawing at module level.
"""

from __future__ import annotations

from graphkit.drawing.diagram import draw, groups_diagram
from graphkit.drawing.rendering import GraphvizNotFoundError, RenderTimeoutError, render

__all__ = ["GraphvizNotFoundError", "RenderTimeoutError", "draw", "groups_diagram", "render"]
