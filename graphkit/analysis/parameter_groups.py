"""Parameter groups: which weights a zero-bubble W phase serves from which intermediates.

A **parameter group** is a connected component of the relation "weight leaf *p* reaches entry *e*
through weight-only nodes", where an *entry* is an intermediate (see :mod:`graphkit.analysis.closures`) or a stage
output that lies in the weight-only subgraph (a parameter-only output such as ``logit_scale.exp()``).
The relation is made transitive with a union-find over the edges of the weight-only subgraph and the
weight-side edges, so the partition does not depend on parameter order (a shared parameter registered
after the per-layer ones merges their groups exactly as one registered first would). One pass,
O(nodes + edges); no closure walk per parameter.

Parameters that require grad but have no path to any output are reported in
``ParamGroups.unused_params`` and belong to no group.

Flags a user can act on (:class:`GroupFlag`):

- ``shared-parameter``: a parameter reaches two or more entries (tied weights, a block reused across
  layers, a recurrence): its gradient sums several contributions.
- ``multi-output-intermediate``: an intermediate produces several forward outputs (custom Function,
  RNN kernel, ``chunk``): each captured gradient must go back to its own output.
- ``parameter-only-output``: a stage output depends on parameters alone; its gradient enters W directly.
- ``custom-function``: an intermediate is a Python ``torch.autograd.Function``, whose backward runs in both
  phases; graphkit sets the Node's ``ctx.needs_input_grad`` to the arguments each phase needs (the input
  path in B, the weight side in W), so a backward that honours it does no extra work.
- ``opaque-node``: an intermediate whose work the split cannot divide between B and W (activation
  checkpointing, a compiled region, a custom Function, ``linalg.solve`` with a learned matrix; see
  :mod:`graphkit.analysis.opaque`): ``ParamGroup.opaque_nodes`` names them, and
  ``ParamGroups.opaque_nodes`` lists every opaque Node of the graph, in a group or not (a reentrant
  checkpoint's parameters are in no group: its nested backward gives them ``.grad`` in B).
"""

from __future__ import annotations

import dataclasses
import enum
import html
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from graphkit.analysis.closures import (
    Intermediate,
    WeightSideEdge,
    input_closure,
    intermediates,
    weight_only_nodes,
)
from graphkit.analysis.opaque import OpaqueKind, OpaqueNode, opaque_nodes
from graphkit.graph._autograd import is_accumulate_grad, sequence_number
from graphkit.graph.autograd_graph import AutogradGraph, GraphEndpoint, NodeKind

__all__ = [
    "FLAG_MEANINGS",
    "GroupFlag",
    "ParamGroup",
    "ParamGroups",
    "forward_ranks",
    "natural_key",
    "param_groups",
    "tensor_names",
]


class GroupFlag(enum.StrEnum):
    """Properties of a parameter group a user may need to act on (see module docstring)."""

    SHARED_PARAMETER = "shared-parameter"
    MULTI_OUTPUT_INTERMEDIATE = "multi-output-intermediate"
    PARAMETER_ONLY_OUTPUT = "parameter-only-output"
    CUSTOM_FUNCTION = "custom-function"
    OPAQUE_NODE = "opaque-node"


FLAG_MEANINGS: dict[str, str] = {
    GroupFlag.SHARED_PARAMETER.value: (
        "a parameter reaches several intermediates or outputs (tied weights, a reused block, a recurrence): "
        "its gradient sums several contributions"
    ),
    GroupFlag.MULTI_OUTPUT_INTERMEDIATE.value: (
        "an intermediate has several forward outputs (a custom Function, an RNN kernel, chunk/split): each "
        "captured gradient goes back to its own output"
    ),
    GroupFlag.PARAMETER_ONLY_OUTPUT.value: (
        "a stage output depends on parameters alone: its gradient goes straight into the W phase"
    ),
    GroupFlag.CUSTOM_FUNCTION.value: (
        "an intermediate is a Python torch.autograd.Function: graphkit sets its ctx.needs_input_grad per "
        "phase, so a backward that computes only what needs_input_grad asks for does no extra work"
    ),
    GroupFlag.OPAQUE_NODE.value: (
        "an intermediate's work cannot be split between B and W (activation checkpointing, a compiled "
        "region, a custom Function, linalg.solve with a learned matrix): B + W may repeat part of it; "
        "verify_split names the Node and the FLOPs it repeats"
    ),
}
"""One sentence per :class:`GroupFlag`: what it means for the user (reports and widgets show it)."""


@dataclass(slots=True, frozen=True)
class ParamGroup:
    """One parameter group.

    Attributes:
        index: position in the group list (forward order, see :func:`param_groups`).
        params: parameter names, in natural order (a shared parameter lists every name; an unnamed leaf is
            ``"<leaf nK>"``).
        param_nodes: ids of the weight leaves (AccumulateGrad nodes).
        intermediates: ids of the intermediates where the group's gradient leaves the input path.
        weight_side_edges: for each intermediate, its edges into the weight-only subgraph.
        weight_only_nodes: ids of the group's weight-only op nodes (leaves excluded).
        output_entries: stage outputs in the weight-only subgraph that feed this group.
        flags: :class:`GroupFlag` values that apply.
        shared_params: names of the parameters that reach two or more entries.
        opaque_nodes: the group's opaque intermediates (:mod:`graphkit.analysis.opaque`).
    """

    index: int
    params: tuple[str, ...]
    param_nodes: tuple[str, ...]
    intermediates: tuple[str, ...]
    weight_side_edges: dict[str, tuple[WeightSideEdge, ...]] = field(hash=False, compare=False)
    weight_only_nodes: tuple[str, ...]
    output_entries: tuple[GraphEndpoint, ...]
    flags: tuple[GroupFlag, ...]
    shared_params: tuple[str, ...] = ()
    opaque_nodes: tuple[OpaqueNode, ...] = field(default=(), hash=False, compare=False)

    def nodes(self) -> set[str]:
        """Every node the group colours: leaves, weight-only nodes and intermediates."""
        return {*self.param_nodes, *self.weight_only_nodes, *self.intermediates}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form: ``params``, ``intermediates``, ``flags`` and the details."""
        return {
            "index": self.index,
            "params": list(self.params),
            "intermediates": list(self.intermediates),
            "flags": [str(flag) for flag in self.flags],
            "param_nodes": list(self.param_nodes),
            "weight_only_nodes": list(self.weight_only_nodes),
            "weight_side_edges": {
                node: [
                    {"input_nr": e.input_nr, "target": e.target, "target_output_nr": e.target_output_nr}
                    for e in edges
                ]
                for node, edges in self.weight_side_edges.items()
            },
            "output_entries": [entry.name for entry in self.output_entries],
            "shared_params": list(self.shared_params),
            "opaque_nodes": [opaque.to_dict() for opaque in self.opaque_nodes],
        }


class ParamGroups(list):
    """The list of :class:`ParamGroup` (forward order) of a graph, plus what belongs to no group.

    Attributes:
        unused_params: parameter names that require grad but reach no output.
        intermediates: every intermediate of the graph, keyed by node id.
        node_group: group index of every node a group colours.
        graph: the graph the groups were computed from (None for a list built by hand).
        opaque_nodes: every opaque Node of the graph by node id, in a group or not
            (:mod:`graphkit.analysis.opaque`).

    In Jupyter the list shows as a table followed by the diagram of its graph (``graphkit.draw``).
    """

    def __init__(
        self,
        groups: list[ParamGroup],
        unused_params: list[str],
        all_intermediates: dict[str, Intermediate],
        graph: AutogradGraph | None = None,
        opaque: dict[str, OpaqueNode] | None = None,
    ) -> None:
        super().__init__(groups)
        self.opaque_nodes = dict(opaque or {})
        self.unused_params = list(unused_params)
        self.intermediates = all_intermediates
        self.node_group = {node: group.index for group in groups for node in group.nodes()}
        self.graph = graph

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        if self.graph is None:
            return bundle
        # The display hook is the one place analysis reaches for drawing, lazily: nothing else does.
        from graphkit.drawing.diagram import groups_diagram

        try:
            svg = groups_diagram(self, self.graph).pipe(format="svg", encoding="utf-8")
        except Exception as error:  # no dot binary, or a layout failure: the table still shows
            bundle["text/html"] += f"<p><i>diagram unavailable: {html.escape(str(error))}</i></p>"
            return bundle
        bundle["image/svg+xml"] = svg
        bundle["text/html"] += svg[svg.find("<svg") :]
        return bundle

    def to_dict(self) -> dict[str, Any]:
        """``{"groups": [...], "unused_params": [...], "opaque_nodes": [...]}``."""
        return {
            "groups": [group.to_dict() for group in self],
            "unused_params": self.unused_params,
            "opaque_nodes": [opaque.to_dict() for opaque in self.opaque_nodes.values()],
        }

    def opaque_lines(self) -> list[str]:
        """A heading, one line per opaque Node and one per kind saying what it costs (none without any)."""
        return _opaque_lines(self.opaque_nodes)

    def _rows(self) -> list[tuple[str, str, str, str]]:
        return [
            (
                str(group.index),
                ", ".join(group.params),
                ", ".join(group.intermediates) or "-",
                ", ".join(str(flag) for flag in group.flags) or "-",
            )
            for group in self
        ]

    def __repr__(self) -> str:
        header = ("group", "parameters", "intermediates", "flags")
        rows = [header, *self._rows()]
        widths = [min(60, max(len(row[column]) for row in rows)) for column in range(4)]
        lines = [
            "  ".join(cell[:60].ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows
        ]
        lines.insert(1, "  ".join("-" * width for width in widths))
        if self.unused_params:
            lines.append(f"unused parameters: {', '.join(self.unused_params)}")
        lines.extend(self.opaque_lines())
        return "\n".join(line.rstrip() for line in lines)

    def _repr_html_(self) -> str:
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in self._rows()
        )
        unused = (
            f"<p>Unused parameters: {html.escape(', '.join(self.unused_params))}</p>"
            if self.unused_params
            else ""
        )
        opaque = "".join(
            f"<li>{html.escape(line.removeprefix('  '))}</li>" for line in self.opaque_lines()[1:]
        )
        return (
            "<table class='graphkit-groups'><thead><tr><th>group</th><th>parameters</th>"
            f"<th>intermediates</th><th>flags</th></tr></thead><tbody>{cells}</tbody></table>{unused}"
            + (f"<p>Opaque nodes:</p><ul>{opaque}</ul>" if opaque else "")
        )


def _opaque_lines(opaque: dict[str, OpaqueNode]) -> list[str]:
    """A heading and one line per opaque Node (empty without any)."""
    if not opaque:
        return []
    meanings = {entry.kind: entry.meaning for entry in opaque.values()}
    return (
        ["opaque nodes (their work is not split between B and W):"]
        + [f"  {entry.node} {entry.op} [{entry.kind}]" for entry in opaque.values()]
        + [f"  [{kind}] {meaning}" for kind, meaning in meanings.items()]
    )


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, item: str) -> str:
        parent = self.parent.setdefault(item, item)
        root = item
        while parent != root:
            root, parent = parent, self.parent[parent]
        while item != root:  # path compression
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, first: str, second: str) -> None:
        first_root, second_root = self.find(first), self.find(second)
        if first_root != second_root:
            self.parent[max(first_root, second_root)] = min(first_root, second_root)


def _entries_reached(
    graph: AutogradGraph, weight_only: set[str], entry_nodes: set[str], output_nodes: set[str]
) -> dict[str, frozenset[str]]:
    """For each weight-only node, up to two entries (intermediates / outputs) it reaches.

    Capped sets are enough to tell "one" from "several": if the true set has two or more members, the
    union of the capped sets of the consumers has two or more too.
    """
    reached: dict[str, frozenset[str]] = {}
    subgraph = graph.subgraph(weight_only)
    for node in reversed(list(nx.topological_sort(subgraph))):
        found: set[str] = {node} if node in output_nodes else set()
        for consumer in graph.successors(node):
            if len(found) >= 2:
                break
            if consumer in entry_nodes:
                found.add(consumer)
            elif consumer in weight_only:
                found.update(reached[consumer])
        reached[node] = frozenset(sorted(found)[:2])
    return reached


def param_groups(graph: AutogradGraph) -> ParamGroups:
    """Partition the weight leaves of ``graph`` into parameter groups.

    Args:
        graph: a graph from :func:`graphkit.capture` (its ``stage_input`` nodes define the input closure).

    Returns:
        A :class:`ParamGroups` list in forward order: a group comes before another when the stage computes
        its first intermediate (where its gradient leaves the input path) earlier, from stage input to
        output (:func:`forward_ranks`); ties go by natural order of the parameter names (``h.2`` before
        ``h.10``). ``unused_params`` lists parameters with no path to any output.

    The algorithm (union-find over weight-only edges and weight-side edges) is described in the module
    docstring; it is one pass, O(nodes + edges).
    """
    closure_of_inputs = input_closure(graph)
    weight_only = weight_only_nodes(graph, closure_of_inputs)
    found = intermediates(graph, closure_of_inputs, weight_only)
    output_endpoints = [endpoint for endpoint in graph.outputs if endpoint.node in weight_only]
    output_nodes = {endpoint.node for endpoint in output_endpoints}

    union_find = _UnionFind()
    for node in weight_only:
        union_find.find(node)
        for consumer in graph.successors(node):
            if consumer in weight_only or consumer in found:
                union_find.union(node, consumer)

    members: dict[str, list[str]] = {}
    for node in graph.nodes:  # node order keeps every list below deterministic
        if node in weight_only or node in found:
            members.setdefault(union_find.find(node), []).append(node)

    reached = _entries_reached(graph, weight_only, set(found), output_nodes)
    opaque = opaque_nodes(graph, found)
    groups: list[ParamGroup] = []
    for nodes in members.values():
        leaves = [node for node in nodes if graph.nodes[node]["kind"] in (NodeKind.PARAMETER, NodeKind.LEAF)]
        if not leaves:
            continue
        names = sorted(_leaf_names(graph, leaves), key=natural_key)
        group_intermediates = [node for node in nodes if node in found]
        shared = sorted(
            name for leaf in leaves if len(reached.get(leaf, ())) >= 2 for name in _leaf_names(graph, [leaf])
        )
        flags = []
        if shared:
            flags.append(GroupFlag.SHARED_PARAMETER)
        if any(found[node].num_outputs > 1 for node in group_intermediates):
            flags.append(GroupFlag.MULTI_OUTPUT_INTERMEDIATE)
        member_set = set(nodes)
        entries = tuple(endpoint for endpoint in output_endpoints if endpoint.node in member_set)
        if entries:
            flags.append(GroupFlag.PARAMETER_ONLY_OUTPUT)
        if any(found[node].is_custom_function for node in group_intermediates):
            flags.append(GroupFlag.CUSTOM_FUNCTION)
        group_opaque = tuple(opaque[node] for node in group_intermediates if node in opaque)
        split_kinds = (OpaqueKind.CUSTOM_FUNCTION, OpaqueKind.SPLIT_COMPILED_REGION)
        if any(entry.kind not in split_kinds for entry in group_opaque):
            flags.append(GroupFlag.OPAQUE_NODE)  # a custom Function has its own flag
        groups.append(
            ParamGroup(
                index=-1,
                params=tuple(names),
                param_nodes=tuple(leaves),
                intermediates=tuple(group_intermediates),
                weight_side_edges={node: found[node].weight_side_edges for node in group_intermediates},
                weight_only_nodes=tuple(node for node in nodes if node in weight_only and node not in leaves),
                output_entries=entries,
                flags=tuple(flags),
                shared_params=tuple(shared),
                opaque_nodes=group_opaque,
            )
        )
    rank = forward_ranks(graph)
    groups.sort(key=lambda group: _forward_key(group, rank))
    numbered = [dataclasses.replace(group, index=index) for index, group in enumerate(groups)]
    return ParamGroups(numbered, graph.graph.get("unused_params", []), found, graph, opaque)


_NUMBER = re.compile(r"(\d+)")


def tensor_names(graph: AutogradGraph, names: Iterable[str]) -> list[str]:
    """``names`` with the names of one tensor joined: tied weights read ``lm_head.weight = wte.weight``.

    Each parameter tensor appears once, at the place of the first of its names in ``names``; names of no
    tied tensor stay as they are.
    """
    tied: dict[str, str] = {}
    for _, aliases in graph.nodes(data="param_names"):
        if aliases and len(aliases) > 1:
            for alias in aliases:
                tied[alias] = " = ".join(aliases)
    shown: list[str] = []
    for name in names:
        text = tied.get(name, name)
        if text not in shown:
            shown.append(text)
    return shown


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders the numbers inside names by value: ``h.2`` before ``h.10``."""
    return tuple(int(part) if part.isdigit() else part for part in _NUMBER.split(name))


def forward_ranks(graph: AutogradGraph) -> dict[str, int]:
    """When the forward computed each node: larger is later.

    With the live autograd Nodes at hand (``graph.autograd_nodes``, as :func:`graphkit.capture` leaves
    them) this is each op's autograd sequence number, the creation counter the engine gives every Node
    (``torch/csrc/autograd/function.h``): exactly the order the stage ran its ops. A graph without them
    (exported and read back) gets the longest path from a graph source instead: stage inputs and leaves
    0, an op one more than its latest producer. Leaves are never keys of an order, and get 0 or -1.
    Iterative, O(nodes + edges).
    """
    live = graph.autograd_nodes
    ranks: dict[str, int] = {}
    if live and len(live) == graph.number_of_nodes():
        for node, autograd_node in live.items():
            ranks[node] = -1 if is_accumulate_grad(autograd_node) else sequence_number(autograd_node)
        return ranks
    for node in nx.topological_sort(graph):
        ranks[node] = max((ranks[producer] + 1 for producer in graph.predecessors(node)), default=0)
    return ranks


def _forward_key(group: ParamGroup, rank: dict[str, int]) -> tuple[Any, ...]:
    """Where the stage computes ``group``: its first intermediate; groups with none (parameter-only
    outputs, stages without an input that requires grad) follow, by their first output entry or op."""
    candidates = (
        group.intermediates,
        [entry.node for entry in group.output_entries],
        group.weight_only_nodes,
    )
    for tier, nodes in enumerate(candidates):
        if nodes:
            return (
                tier,
                min(rank[node] for node in nodes),
                tuple(natural_key(name) for name in group.params),
            )
    return (len(candidates), 0, tuple(natural_key(name) for name in group.params))


def _leaf_names(graph: AutogradGraph, leaves: list[str]) -> list[str]:
    names = []
    for leaf in leaves:
        names.extend(graph.nodes[leaf]["param_names"] or [f"<leaf {leaf}>"])
    return names
