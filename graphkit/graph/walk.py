"""The bare structure behind a set of autograd Nodes: a breadth-first walk over ``next_functions``.

:func:`walk_nodes` is what :func:`graphkit.capture` and the split backward both start from: every Node
reached from some roots, each once, in breadth-first order, with the edges between them as plain integers.
It reads only public Node API (``next_functions``), holds no graph attributes and builds no networkx graph,
so it is cheap enough to run once per microbatch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.autograd.graph import Node

from graphkit.graph._autograd import ACCUMULATE_GRAD_CLASS

__all__ = ["NodeWalk", "walk_nodes"]


@dataclass(slots=True)
class NodeWalk:
    """The bare structure of an autograd graph: Nodes in breadth-first order and their edges."""

    nodes: list[Node]
    index: dict[Node, int]
    # flat: producer index, consumer index, output_nr, input_nr, then the next edge (one list, no tuple
    # per edge: the split backward walks every microbatch and each tuple costs the garbage collector)
    flat_edges: list[int]

    def edges(self) -> Iterator[tuple[int, int, int, int]]:
        """``(producer index, consumer index, output_nr, input_nr)`` of every edge, in walk order."""
        values = iter(self.flat_edges)
        return zip(values, values, values, values, strict=True)


def walk_nodes(
    roots: Iterable[Node], stop: set[Node], leaf_variables: dict[int, torch.Tensor] | None = None
) -> NodeWalk:
    """Breadth-first walk over ``next_functions`` from ``roots``; nodes in ``stop`` are not expanded.

    Args:
        roots: the Nodes to start from (``grad_fn`` of the outputs, or ``GradientEdge.node``).
        stop: Nodes whose ``next_functions`` are not followed (stage inputs that are not leaves).
        leaf_variables: if given, filled with the ``variable`` (the leaf tensor) of every AccumulateGrad
            Node reached, by its index in the walk: read here, where the walk meets the Node anyway,
            instead of in a second pass (the split backward needs them every microbatch).

    Returns:
        A :class:`NodeWalk`: every reached Node once, in breadth-first order, and every edge.

    Iterative, O(nodes + edges). The split backward walks every microbatch's graph, so this loop is kept
    lean: the node list is its own queue (a list iterator sees what is appended while it runs), and edges
    go into one flat list of ints (four per edge).
    """
    nodes: list[Node] = []
    index: dict[Node, int] = {}
    edges: list[int] = []
    add_node = nodes.append
    add_edge = edges.extend
    for root in roots:
        if root not in index:
            index[root] = len(nodes)
            add_node(root)
    count = len(nodes)
    for position, consumer in enumerate(nodes):
        # an AccumulateGrad Node (a leaf) has no next_functions: not asking spares a read of a cold Node
        if type(consumer) is ACCUMULATE_GRAD_CLASS:
            if leaf_variables is not None:
                leaf_variables[position] = consumer.variable
        elif consumer not in stop:
            input_nr = 0
            for producer, output_nr in consumer.next_functions:
                if producer is not None:
                    producer_index = index.get(producer)
                    if producer_index is None:
                        producer_index = index[producer] = count
                        count += 1
                        add_node(producer)
                    add_edge((producer_index, position, output_nr, input_nr))
                input_nr += 1  # noqa: SIM113 - enumerate() costs more in this hot loop
    return NodeWalk(nodes, index, edges)
