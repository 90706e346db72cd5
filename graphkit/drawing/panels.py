"""The HTML panels of the notebook explorer: a node, a parameter group, the graph at a glance.

Plain functions returning HTML fragments (for ``ipywidgets.HTML``, or any notebook output), rendered from
the macros of ``graphkit/drawing/templates/panels.html.j2``; they need no ipywidgets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphkit.analysis.node_roles import describe_node, node_role
from graphkit.analysis.parameter_groups import FLAG_MEANINGS, ParamGroup
from graphkit.drawing.templating import environment
from graphkit.graph.autograd_graph import AutogradGraph

__all__ = [
    "error_html",
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
