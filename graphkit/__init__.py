"""graphkit: see, analyse and split PyTorch autograd graphs.

Capture the autograd graph behind a model's outputs into networkx (:func:`capture`, :func:`trace`),
find the parameter groups a zero-bubble pipeline schedule needs (:func:`param_groups`), run the split
backward they drive (:mod:`graphkit.split`) and check it against a full backward (:func:`verify_split`).
:mod:`graphkit.pipelining` (imported on its own: it loads ``torch.distributed``) runs that split inside
``torch.distributed.pipelining``'s zero-bubble schedules.
"""

from __future__ import annotations

from typing import Any

from graphkit.analysis import (
    GroupFlag,
    Intermediate,
    ParamGroup,
    ParamGroups,
    WeightSideEdge,
    input_closure,
    intermediates,
    param_groups,
    parameter_closure,
    reverse_adjacency,
    weight_only_nodes,
    weight_only_subgraph,
)
from graphkit.graph.autograd_graph import AutogradGraph, GraphEndpoint, NodeKind, capture
from graphkit.graph.tensors import GraphkitInputError
from graphkit.graph.tracing import trace
from graphkit.split.backward import (
    SplitState,
    backward_full,
    backward_input,
    backward_weight,
)

__version__ = "0.1.0"

__all__ = [
    "AutogradGraph",
    "GraphEndpoint",
    "GraphkitInputError",
    "GroupFlag",
    "Intermediate",
    "NodeKind",
    "ParamGroup",
    "ParamGroups",
    "SplitState",
    "WeightSideEdge",
    "backward_full",
    "backward_input",
    "backward_weight",
    "capture",
    "draw",
    "input_closure",
    "intermediates",
    "parameter_closure",
    "param_groups",
    "reverse_adjacency",
    "splitting_backend",
    "trace",
    "verify_split",
    "weight_only_nodes",
    "weight_only_subgraph",
]


def __getattr__(name: str) -> Any:
    # Presentation and verification load lazily: importing graphkit stays light.
    if name == "draw":
        from graphkit.drawing.diagram import draw

        return draw
    if name == "verify_split":
        from graphkit.measure.verification import verify_split

        return verify_split
    if name == "splitting_backend":
        from graphkit.split.compile_backend import splitting_backend

        return splitting_backend
    if name in ("current_phase", "Phase"):
        from graphkit.split import REMOVED_PHASE_API

        raise AttributeError(f"graphkit.{name} was removed: {REMOVED_PHASE_API}")
    raise AttributeError(f"module 'graphkit' has no attribute {name!r}")
