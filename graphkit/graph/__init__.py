"""The capture layer: an autograd graph as a networkx ``MultiDiGraph``.

- :mod:`graphkit.graph.autograd_graph`: :class:`AutogradGraph`, :func:`capture` (walk ``grad_fn`` /
  ``next_functions`` from output tensors), the node and edge schema, JSON / DOT / GraphML export;
- :mod:`graphkit.graph.tracing`: :func:`trace`, which runs a module and records the module path of each Node;
- :mod:`graphkit.graph.walk`: :func:`~graphkit.graph.walk.walk_nodes`, the bare breadth-first walk over
  ``next_functions`` that capture and the split backward share;
- :mod:`graphkit.graph.tensors`: nested tensor structures and :class:`GraphkitInputError`;
- :mod:`graphkit.graph._autograd`: the few private autograd attributes graphkit reads, in one place.

Nothing here imports a higher layer (analysis, split, drawing).
"""

from __future__ import annotations

from graphkit.graph.autograd_graph import (
    AutogradGraph,
    GraphEndpoint,
    NodeKind,
    capture,
    gradient_edge,
    parameter_names,
)
from graphkit.graph.tensors import GraphkitInputError, distinct_bytes, flatten_tensors, unflatten_like
from graphkit.graph.tracing import trace

__all__ = [
    "AutogradGraph",
    "GraphEndpoint",
    "GraphkitInputError",
    "NodeKind",
    "capture",
    "distinct_bytes",
    "flatten_tensors",
    "gradient_edge",
    "parameter_names",
    "trace",
    "unflatten_like",
]
