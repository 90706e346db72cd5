"""The analysis layer: pure functions over an :class:`~graphkit.graph.AutogradGraph`.

- :mod:`graphkit.analysis.closures`: reverse adjacency, the input and parameter closures, the weight-only
  subgraph and the intermediates where weight gradients leave the input path;
- :mod:`graphkit.analysis.parameter_groups`: :func:`param_groups`, the parameters with the intermediates
  that feed them;
- :mod:`graphkit.analysis.node_roles`: :func:`node_role`, where one node stands in the split and why.
- :mod:`graphkit.analysis.opaque`: :func:`opaque_nodes`, the Nodes whose work the split cannot divide
  between B and W.

Analysis imports the graph layer only; the display hooks of :class:`ParamGroups` reach for drawing lazily.
"""

from __future__ import annotations

from graphkit.analysis.closures import (
    Intermediate,
    WeightSideEdge,
    input_closure,
    intermediates,
    parameter_closure,
    reverse_adjacency,
    weight_leaves,
    weight_only_nodes,
    weight_only_subgraph,
)
from graphkit.analysis.node_roles import ROLES, NodeRole, node_role
from graphkit.analysis.opaque import OPAQUE_MEANINGS, OpaqueKind, OpaqueNode, opaque_nodes
from graphkit.analysis.parameter_groups import FLAG_MEANINGS, GroupFlag, ParamGroup, ParamGroups, param_groups

__all__ = [
    "FLAG_MEANINGS",
    "OPAQUE_MEANINGS",
    "GroupFlag",
    "Intermediate",
    "NodeRole",
    "ROLES",
    "OpaqueKind",
    "OpaqueNode",
    "ParamGroup",
    "ParamGroups",
    "WeightSideEdge",
    "input_closure",
    "intermediates",
    "node_role",
    "opaque_nodes",
    "param_groups",
    "parameter_closure",
    "reverse_adjacency",
    "weight_leaves",
    "weight_only_nodes",
    "weight_only_subgraph",
]
