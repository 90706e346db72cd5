"""Who depends on what in an autograd graph: closures, the weight-only subgraph and intermediates.

Definitions (edges of an :class:`~graphkit.graph.AutogradGraph` run producer -> consumer, i.e. in the
direction values flow in the forward; ``next_functions`` point the other way):

- **weight leaf**: an AccumulateGrad node that is not a stage input (kind ``parameter`` or ``leaf``).
- **input closure**: the nodes whose value depends on a stage input that requires grad - every node
  reachable from a ``stage_input`` node along data-flow edges, the stage inputs included.
- **parameter closure**: the nodes whose value depends on at least one weight leaf, the leaves included.
- **weight-only subgraph**: parameter closure minus input closure - nodes that depend on weights and on
  no stage input (``W.t()``, ``W / W.norm()``, ``logit_scale.exp()``). Their gradient can wait for W.
- **intermediate**: an input-closure node with at least one *weight-side edge*: an entry of its
  ``next_functions`` that leads to a weight-only node (a weight leaf is weight-only too). During the B
  phase its gradient is captured; during the W phase it is pushed along the weight-side edges only.

Every function here is one pass over the graph, O(nodes + edges), and iterative.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = [
    "Intermediate",
    "WeightSideEdge",
    "input_closure",
    "intermediates",
    "parameter_closure",
    "reverse_adjacency",
    "weight_leaves",
    "weight_only_nodes",
    "weight_only_subgraph",
]


@dataclass(slots=True, frozen=True)
class WeightSideEdge:
    """An edge from an intermediate into the weight-only subgraph.

    ``input_nr`` is the position in the intermediate's ``next_functions``; ``target`` the weight-only node
    it leads to and ``target_output_nr`` which of the target's forward outputs it is (the
    ``GradientEdge(target, target_output_nr)`` the W phase feeds).
    """

    input_nr: int
    target: str
    target_output_nr: int


@dataclass(slots=True, frozen=True)
class Intermediate:
    """An input-closure node whose gradient also feeds weights (see module docstring)."""

    node: str
    num_outputs: int
    weight_side_edges: tuple[WeightSideEdge, ...]
    is_custom_function: bool


def reverse_adjacency(graph: AutogradGraph) -> dict[str, list[str]]:
    """For every node, the nodes that consume its value (whose ``next_functions`` point at it).

    This is the adjacency the forward would have: the inverse of ``next_functions``. Consumers appear once
    per edge (a node used twice by one consumer appears twice), in edge order.
    """
    return {node: [consumer for _, consumer in graph.out_edges(node)] for node in graph.nodes}


def weight_leaves(graph: AutogradGraph) -> list[str]:
    """AccumulateGrad nodes that are not stage inputs: parameters and other leaves that require grad."""
    return graph.nodes_of_kind(NodeKind.PARAMETER, NodeKind.LEAF)


def _forward_reachable(graph: AutogradGraph, sources: Iterable[str]) -> set[str]:
    seen = set(sources)
    queue = deque(seen)
    while queue:
        node = queue.popleft()
        for consumer in graph.successors(node):
            if consumer not in seen:
                seen.add(consumer)
                queue.append(consumer)
    return seen


def input_closure(graph: AutogradGraph) -> set[str]:
    """Nodes whose value depends on a stage input that requires grad (stage inputs included).

    Empty when no stage input requires grad (stage 0, token ids): then every weight is reached from the
    outputs through weight-only nodes.
    """
    return _forward_reachable(graph, graph.nodes_of_kind(NodeKind.STAGE_INPUT))


def parameter_closure(graph: AutogradGraph) -> set[str]:
    """Nodes whose value depends on at least one weight leaf (the leaves included)."""
    return _forward_reachable(graph, weight_leaves(graph))


def weight_only_nodes(graph: AutogradGraph, closure_of_inputs: set[str] | None = None) -> set[str]:
    """Nodes that depend on a weight leaf and on no stage input (weight leaves included)."""
    closure_of_inputs = input_closure(graph) if closure_of_inputs is None else closure_of_inputs
    return parameter_closure(graph) - closure_of_inputs


def weight_only_subgraph(graph: AutogradGraph) -> nx.MultiDiGraph:
    """A networkx subgraph view of the weight-only nodes (weight leaves included)."""
    return graph.subgraph(weight_only_nodes(graph))


def intermediates(
    graph: AutogradGraph,
    closure_of_inputs: set[str] | None = None,
    weight_only: set[str] | None = None,
) -> dict[str, Intermediate]:
    """Input-closure nodes with weight-side edges, keyed by node id, in node order.

    Args:
        graph: a captured graph.
        closure_of_inputs, weight_only: precomputed :func:`input_closure` / :func:`weight_only_nodes`
            (computed when omitted).
    """
    closure_of_inputs = input_closure(graph) if closure_of_inputs is None else closure_of_inputs
    if weight_only is None:
        weight_only = weight_only_nodes(graph, closure_of_inputs)
    found: dict[str, Intermediate] = {}
    for node in graph.nodes:
        if node not in closure_of_inputs:
            continue
        edges = [
            WeightSideEdge(data["input_nr"], producer, data["output_nr"])
            for producer, _, data in graph.in_edges(node, data=True)
            if producer in weight_only
        ]
        if edges:
            data = graph.nodes[node]
            found[node] = Intermediate(
                node=node,
                num_outputs=data["num_outputs"],
                weight_side_edges=tuple(sorted(edges, key=lambda edge: edge.input_nr)),
                is_custom_function=data["is_custom_function"],
            )
    return found
