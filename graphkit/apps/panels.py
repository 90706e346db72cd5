"""The HTML panels of the notebook explorer: a node, a parameter group, the graph at a glance.

Plain functions returning HTML fragments (for ``ipywidgets.HTML``, or any notebook output), rendered from
the macros of ``graphkit/drawing/templates/panels.html.j2``; they need no ipywidgets.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from graphkit.analysis.node_roles import describe_node, node_role
from graphkit.analysis.parameter_groups import FLAG_MEANINGS, ParamGroup
from graphkit.drawing.palette import group_style
from graphkit.drawing.templating import TEMPLATES, environment
from graphkit.graph.autograd_graph import AutogradGraph

__all__ = [
    "diagram_html",
    "error_html",
    "legend_html",
    "group_html",
    "node_html",
    "overview_html",
    "selection_style_html",
    "status_html",
    "verify_html",
]


def _macros() -> Any:
    environment().globals.setdefault("zip", zip)
    return environment().get_template("panels.html.j2").module


def node_html(
    graph: AutogradGraph,
    groups: Sequence[ParamGroup],
    node: str,
    closure_of_inputs: set[str] | None = None,
) -> str:
    """An HTML panel describing ``node``: what it computes, what it saved, and its group and why.

    Args:
        graph: the captured graph.
        groups: its parameter groups.
        node: a node id of ``graph``.
        closure_of_inputs: :func:`graphkit.input_closure` of ``graph``, if already computed.

    Raises:
        KeyError: ``node`` is not a node of ``graph``.
    """
    data = graph.nodes[node]
    role = node_role(graph, groups, node, closure_of_inputs)
    return str(_macros().node_panel(node, data, role))


def group_html(graph: AutogradGraph, group: ParamGroup) -> str:
    """An HTML panel describing one parameter group: parameters, intermediates, weight-only ops and flags."""
    ops: dict[str, int] = {}
    for node in group.weight_only_nodes:
        op = graph.nodes[node].get("op") or node
        ops[op] = ops.get(op, 0) + 1
    return str(
        _macros().group_panel(
            group,
            [describe_node(graph, node) for node in group.intermediates],
            list(ops.items()),
            [(str(flag), FLAG_MEANINGS.get(str(flag), "")) for flag in group.flags],
        )
    )


def overview_html(graph: AutogradGraph, groups: Sequence[ParamGroup], unused: Sequence[str]) -> str:
    """The graph at a glance: node, edge, parameter and group counts, stage inputs and outputs, saved bytes."""
    flagged = sum(1 for group in groups if group.flags)
    return str(_macros().overview_panel(graph.summary(), len(groups), flagged, list(unused)))


def verify_html(report_html: str, flops_ratio: float) -> str:
    """A verification report's HTML table (trusted: made by graphkit) and the (B + W) / full FLOPs ratio."""
    return str(_macros().verify_panel(report_html, flops_ratio))


def error_html(what: str, error: BaseException) -> str:
    """A red one-line message: ``what``, the exception's class and its text."""
    return str(_macros().error_message(what, error))


def status_html(drawn: int, highlight: int | None) -> str:
    """The line under the diagram: how many nodes are drawn, which group is highlighted."""
    return str(_macros().status_line(drawn, highlight))


def selection_style_html() -> str:
    """The ``<style>`` that outlines the selected node of the diagram in black."""
    return str(_macros().selection_style())


_ATTACH = (
    "(function(img){var view=img.parentNode;"
    "function run(kind){if(kind==='library'?window.svgPanZoom:window.graphkitAttach)return;"
    "var code=view.querySelector('.graphkit-'+kind);if(!code)return;"
    "var script=document.createElement('script');script.textContent=code.textContent;"
    "document.head.appendChild(script);}"
    "run('library');run('glue');if(window.graphkitAttach)window.graphkitAttach(view);})(this)"
)


def _script_text(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8").replace("</script", "<\\/script")


def diagram_html(svg: str, *, focus: str | None = None, height_px: int = 640) -> str:
    """The explorer's diagram: ``svg`` in a zoom-and-pan view, with the selection style.

    Zoom and pan come from svg-pan-zoom (BSD-2-Clause, vendored as ``templates/svg-pan-zoom.min.js``;
    nothing is fetched at run time) and ``templates/explorer.js`` sends clicks on nodes and group boxes
    to the kernel. An ipywidgets ``HTML`` widget does not run ``<script>`` elements, so both files travel
    as text in ``<script type="text/plain">`` elements and the ``onerror`` handler of an empty image
    runs them, once per page. ``focus``: the id of an SVG element (``graphkit-group-3``) to bring into
    view; None shows the whole diagram.
    """
    focus_attribute = f' data-focus="{html.escape(focus)}"' if focus else ""
    return (
        "<div class='graphkit-diagram-view'>"
        + selection_style_html()
        + f"<div class='graphkit-zoom-host'{focus_attribute} style='height:{height_px}px;width:100%;"
        "overflow:hidden;cursor:grab'>"
        + svg
        + "</div>"
        + "<script type='text/plain' class='graphkit-library'>"
        + _script_text("svg-pan-zoom.min.js")
        + "</script><script type='text/plain' class='graphkit-glue'>"
        + _script_text("explorer.js")
        + "</script>"
        + f'<img alt="" src="data:," style="display:none" onerror="{html.escape(_ATTACH)}"></div>'
    )


def legend_html(groups: Sequence[ParamGroup], *, open_: bool = False) -> str:
    """The diagram's legend as a folded ``<details>``: one colour swatch and the parameters per group.

    The explorer draws its diagram without the legend (which takes a third of a collapsed picture) and
    shows this beside it instead, closed until clicked (``open_=True``: open).
    """
    rows = []
    for group in groups:
        style = group_style(group.index)
        names = ", ".join(group.params[:4]) + (
            f" (+{len(group.params) - 4})" if len(group.params) > 4 else ""
        )
        flags = (
            f" <i style='color:#5A5A5A'>{html.escape(', '.join(map(str, group.flags)))}</i>"
            if group.flags
            else ""
        )
        rows.append(
            f"<tr><td style='padding:1px 6px 1px 0'><span style='display:inline-block;min-width:2.2em;"
            f"background:{style.fill};border:2px solid {style.colour};color:{style.text};text-align:center'>"
            f"{group.index}</span></td><td style='padding:1px 0'>{html.escape(names)}{flags}</td></tr>"
        )
    key = (
        "<p style='margin:4px 0'>White: input path (B phase). Coloured box: a group's parameters and "
        "weight-only ops (W phase). Thick outline: an intermediate, where the group's gradient leaves the "
        "input path. Dark houses: stage inputs and outputs. 3-D boxes: collapsed modules or folded repeats "
        "(\u00d7N), with the groups inside as chips. Scroll to zoom, drag to pan, click a node or a group "
        "box to select it.</p>"
    )
    state = " open" if open_ else ""
    return (
        f"<details class='graphkit-legend'{state} style='font-size:12px'><summary><b>legend</b> "
        f"({len(groups)} groups)</summary>{key}<table style='border-collapse:collapse;font-size:12px'>"
        + "".join(rows)
        + "</table></details>"
    )
