"""``graphkit inspect``: from a model spec to a verified, drawn split backward in one call.

:func:`inspect` loads a model spec, captures its autograd graph with module paths, computes the parameter
groups, checks the split backward against a full backward, counts the FLOPs of each phase, draws the graph
and writes a report folder::

    DIR/index.html      one self-contained page: summary, group table, diagram, verification, FLOPs chart
    DIR/graph.svg       the diagram (needs the Graphviz ``dot`` program)
    DIR/graph.dot       the diagram's DOT source (always written)
    DIR/graph.graphml   the captured graph, for networkx, Gephi, yEd ...
    DIR/report.json     spec, summary, groups, unused_params, verify, files

One idea a module:

- :mod:`~graphkit.apps.report.inspection`: :func:`collect` runs the steps and returns an :class:`Inspection`;
- :mod:`~graphkit.apps.report.page`: :func:`report_html`, the page, from the Jinja2 template
  ``graphkit/drawing/templates/report.html.j2``;
- :mod:`~graphkit.apps.report.folder`: :func:`report_json`, :func:`write_report` and :func:`inspect`;
- :mod:`~graphkit.apps.report.terminal`: progress lines and the summary table (``rich`` when installed);
- :mod:`~graphkit.apps.report.formatting`: numbers as the page and the terminal print them.
"""

from __future__ import annotations

from graphkit.apps.report.folder import inspect, report_json, write_report
from graphkit.apps.report.inspection import DEFAULT_SPEC, FILES, MAX_NODES, Inspection, collect
from graphkit.apps.report.page import report_html

__all__ = [
    "DEFAULT_SPEC",
    "FILES",
    "MAX_NODES",
    "Inspection",
    "collect",
    "inspect",
    "report_html",
    "report_json",
    "write_report",
]
