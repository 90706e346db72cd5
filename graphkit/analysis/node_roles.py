"""Where a node stands in the split backward: a parameter leaf, weight-only node or intermediate of a
parameter group, a stage input, the input path, or outside every group - and why.

:func:`node_role` answers from the input closure and the parameter groups alone (see
:mod:`graphkit.analysis.closures`); the notebook explorer and the diagrams' tooltips show its answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from graphkit.analysis.closures import input_closure
from graphkit.analysis.parameter_groups import ParamGroup
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["ROLES", "NodeRole", "describe_node", "group_entries", "node_role"]

ROLES: tuple[str, ...] = (
    "parameter leaf",
    "weight-only",
    "intermediate",
    "stage input",
    "input path",
    "outside every group",
)
"""What a node can be, as :func:`node_role` reports it."""


# --- what a node is ----------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class NodeRole:
    """Where a node stands in the split backward.

    Attributes:
        role: one of :data:`ROLES`.
        group: index of the parameter group the node belongs to, or None.
        reason: one or two sentences saying why, in terms of the input and parameter closures.
    """

    role: str
    group: int | None
    reason: str


def _group_of(groups: Sequence[ParamGroup], node: str) -> tuple[ParamGroup | None, str | None]:
    for group in groups:
        if node in group.param_nodes:
            return group, "parameter leaf"
        if node in group.intermediates:
            return group, "intermediate"
        if node in group.weight_only_nodes:
            return group, "weight-only"
    return None, None


def node_role(
    graph: AutogradGraph,
    groups: Sequence[ParamGroup],
    node: str,
    closure_of_inputs: set[str] | None = None,
) -> NodeRole:
    """Say which group ``node`` belongs to and why.

    Args:
        graph: the captured graph.
        groups: its parameter groups (:func:`graphkit.param_groups`).
        node: a node id of ``graph``.
        closure_of_inputs: :func:`graphkit.input_closure` of ``graph``, if already computed.

    Returns:
        A :class:`NodeRole`: a parameter leaf, weight-only node or intermediate of a group; a stage input;
        a node on the input path (its backward runs in the B phase only); or outside every group.

    Raises:
        KeyError: ``node`` is not a node of ``graph``.
    """
    data = graph.nodes[node]
    group, role = _group_of(groups, node)
    if group is not None and role == "parameter leaf":
        names = ", ".join(data.get("param_names") or []) or "an unnamed leaf"
        return NodeRole(
            role,
            group.index,
            f"AccumulateGrad of {names}: the W phase of group {group.index} adds this gradient to .grad. "
            f"The group's gradient leaves the input path at {group_entries(graph, group)}.",
        )
    if group is not None and role == "weight-only":
        return NodeRole(
            role,
            group.index,
            f"depends on parameters of group {group.index} and on no stage input (parameter closure minus "
            "input closure): its backward runs in the W phase only.",
        )
    if group is not None and role == "intermediate":
        edges = group.weight_side_edges.get(node, ())
        listed = ", ".join(
            f"next_functions[{edge.input_nr}] \u2192 {describe_node(graph, edge.target)}" for edge in edges
        )
        return NodeRole(
            role,
            group.index,
            "depends on a stage input, and its gradient also feeds weights of group "
            f"{group.index} through {listed}. The B phase captures the gradient it receives; the W phase "
            "pushes it along these weight-side edges only.",
        )
    if str(data["kind"]) == NodeKind.STAGE_INPUT.value:
        names = ", ".join(data.get("input_names") or []) or node
        return NodeRole(
            "stage input",
            None,
            f"stands for the stage input {names}: the B phase computes its gradient first, so the "
            "previous stage can go on.",
        )
    closure_of_inputs = input_closure(graph) if closure_of_inputs is None else closure_of_inputs
    if node in closure_of_inputs:
        return NodeRole(
            "input path",
            None,
            "depends on a stage input and feeds no weight directly: its backward runs in the B phase only.",
        )
    return NodeRole(
        "outside every group",
        None,
        "depends on no stage input and belongs to no parameter group (a leaf whose gradient reaches no "
        "parameter group, or a graph without groups).",
    )


def describe_node(graph: AutogradGraph, node: str) -> str:
    """``"blocks.0.attn.qkv.weight (n12)"``: a node's first parameter name, else its op, then its id."""
    data = graph.nodes[node]
    names = data.get("param_names") or []
    what = names[0] if names else data.get("op") or data.get("name") or node
    return f"{what} ({node})"


def group_entries(graph: AutogradGraph, group: ParamGroup) -> str:
    """Where ``group``'s gradient leaves the input path: its intermediates and parameter-only outputs."""
    entries = [describe_node(graph, node) for node in group.intermediates]
    entries += [f"stage output {entry.name}" for entry in group.output_entries]
    return ", ".join(entries) or "no entry"
