"""Opaque Nodes: where the split backward cannot split a Node's work, and what that costs.

The split relies on each intermediate computing, in each phase, only the gradients that phase needs
(``Node::task_should_compute_output``), or on a weight-side formula. Some Nodes cannot:

==========================  ============================================================================
kind                        what the split does with it
==========================  ============================================================================
``checkpointed``            saved tensors packed by ``saved_tensors_hooks`` (non-reentrant activation
                            checkpointing, offloading): W calls the Node, which unpacks them; a checkpoint
                            recomputes its region once more in W (``recompute="in-w"``, the default) or
                            keeps B's recomputation (``"keep-from-b"``)
``reentrant-checkpoint``    ``checkpoint(..., use_reentrant=True)``: one nested full backward, run once in
                            B; the parameters inside get their ``.grad`` in B
``compiled-region``         a ``torch.compile``'d region: one compiled backward for every input, run once
                            in B; W feeds in the weight gradients it returned there
``split-compiled-region``   a region compiled with ``graphkit.splitting_backend()``: its compiled I graph
                            runs in B, its compiled W graph in W; no work runs twice
``custom-function``         a Python ``torch.autograd.Function`` that W calls again: graphkit sets its
                            ``ctx.needs_input_grad`` per phase; unless its backward computes only what
                            that asks for, it computes every gradient in both phases
``no-output-skip``          a C++ op whose backward computes what W skips (``linalg.solve`` with a learned
                            matrix: the matrix's gradient needs the right-hand side's, so W solves again)
==========================  ============================================================================

This is the one enumeration of these kinds: :func:`opaque_kind` classifies a live autograd Node (a
reentrant checkpoint or a compiled region by the ``torch.autograd.Function`` class its Node belongs to),
and :mod:`graphkit.split.run_once` asks it which Nodes to run once, in B. :func:`opaque_nodes` finds them
in a captured graph: from its live Nodes, or, for a graph without them (read back from GraphML), from the
Node class names. :func:`graphkit.measure.verification.verify_split` measures the FLOPs each one costs in
B, in W and in a full backward.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch.utils.checkpoint
from torch.autograd.graph import Node

from graphkit.analysis.closures import Intermediate, input_closure, intermediates, weight_only_nodes
from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = [
    "NO_OUTPUT_SKIP_NODES",
    "OPAQUE_MEANINGS",
    "RUN_ONCE_KINDS",
    "OpaqueKind",
    "OpaqueNode",
    "opaque_kind",
    "opaque_nodes",
]


class OpaqueKind(enum.StrEnum):
    """Why the split cannot split a Node's work (module docstring)."""

    CHECKPOINTED = "checkpointed"
    REENTRANT_CHECKPOINT = "reentrant-checkpoint"
    COMPILED_REGION = "compiled-region"
    SPLIT_COMPILED_REGION = "split-compiled-region"
    CUSTOM_FUNCTION = "custom-function"
    NO_OUTPUT_SKIP = "no-output-skip"


RUN_ONCE_KINDS = frozenset({OpaqueKind.REENTRANT_CHECKPOINT, OpaqueKind.COMPILED_REGION})
"""The kinds whose Node computes every gradient in one backward, wherever it is: the split runs it once, in B
(:mod:`graphkit.split.run_once`)."""


OPAQUE_MEANINGS: dict[str, str] = {
    OpaqueKind.CHECKPOINTED.value: (
        "its saved tensors are packed by saved_tensors_hooks (activation checkpointing): W calls the Node, "
        "and a checkpoint recomputes its region once more in W unless backward_input(recompute='keep-from-b')"
    ),
    OpaqueKind.REENTRANT_CHECKPOINT.value: (
        "a reentrant activation checkpoint (use_reentrant=True): its nested backward runs once, in B, and "
        "gives the parameters used inside their .grad in B; use use_reentrant=False to defer them to W"
    ),
    OpaqueKind.COMPILED_REGION.value: (
        "a torch.compile'd region: its compiled backward computes every gradient at once, so it runs once, "
        "in B, weight gradients included (W reuses them)"
    ),
    OpaqueKind.SPLIT_COMPILED_REGION.value: (
        "a torch.compile'd region of graphkit.splitting_backend(): its compiled backward is cut in two, the "
        "input gradients run in B and the weight gradients in W, and no work runs twice"
    ),
    OpaqueKind.CUSTOM_FUNCTION.value: (
        "a Python torch.autograd.Function that W calls again: graphkit sets its ctx.needs_input_grad per "
        "phase; unless its backward computes only what needs_input_grad asks for, it computes every "
        "gradient in both phases"
    ),
    OpaqueKind.NO_OUTPUT_SKIP.value: (
        "its backward cannot compute the weight-side gradient without the input-side one, so W repeats "
        "that work"
    ),
}
"""One sentence per :class:`OpaqueKind`: what the split does with such a Node, and what it costs."""

# C++ Nodes whose backward computes a gradient it was not asked for to get the one it was: the
# gradient of the coefficient matrix is built from the right-hand side's (derivatives.yaml:
# linalg_solve_backward, triangular_solve_backward, cholesky_solve_backward, lu_solve), and fused
# attention computes dq, dk and dv in one kernel.
NO_OUTPUT_SKIP_NODES = frozenset(
    {
        "LinalgSolveExBackward0",
        "LinalgSolveTriangularBackward0",
        "TriangularSolveBackward0",
        "CholeskySolveBackward0",
        "LinalgLuSolveBackward0",
        "LuSolveBackward0",
        "LinalgLstsqBackward0",
        "ScaledDotProductFlashAttentionBackward0",
        "ScaledDotProductFlashAttentionForCpuBackward0",
        "ScaledDotProductEfficientAttentionBackward0",
        "ScaledDotProductCudnnAttentionBackward0",
    }
)

_RUN_ONCE_NAMES = {
    "CheckpointFunctionBackward": OpaqueKind.REENTRANT_CHECKPOINT,
    "CompiledFunctionBackward": OpaqueKind.COMPILED_REGION,
}

_SPLIT_REGION_NAME = "SplitRegionFunctionBackward"
"""The Node class name of a region compiled by ``graphkit.splitting_backend()``, for graphs read back."""
"""The run-once kinds by Node class name, for graphs whose live Nodes are gone."""

_run_once_by_class: dict[type, OpaqueKind | None] = {}


def _run_once_kind(node: Node) -> OpaqueKind | None:
    """A kind of :data:`RUN_ONCE_KINDS` for ``node``, by the Function class it belongs to (cached per Node
    class): ``CheckpointFunction`` (``torch/utils/checkpoint.py``) or AOTAutograd's ``CompiledFunction``
    (``torch/_functorch/_aot_autograd/runtime_wrappers.py``); None for any other Node."""
    node_class = type(node)
    try:
        return _run_once_by_class[node_class]
    except KeyError:
        pass
    function_class = _autograd.forward_class(node)
    kind = None
    if function_class is torch.utils.checkpoint.CheckpointFunction:
        kind = OpaqueKind.REENTRANT_CHECKPOINT
    elif (
        function_class is not None
        and function_class.__name__ == "CompiledFunction"
        and function_class.__module__.startswith("torch._functorch")
    ):
        kind = OpaqueKind.COMPILED_REGION
    _run_once_by_class[node_class] = kind
    return kind


def opaque_kind(node: Node, *, intermediate: bool) -> OpaqueKind | None:
    """The :class:`OpaqueKind` of a live autograd Node, or None when the split can split its work.

    Args:
        node: the Node.
        intermediate: whether it feeds weights through weight-side edges
            (:func:`graphkit.analysis.closures.intermediates`). A reentrant checkpoint or a compiled
            region (:data:`RUN_ONCE_KINDS`) is opaque wherever it is; the other kinds only in an
            intermediate, whose work W must restrict to the weight side. With ``intermediate=False`` the
            answer is a run-once kind or None: what :mod:`graphkit.split.run_once` asks.
    """
    kind = _run_once_kind(node)
    if kind is not None or not intermediate:
        return kind
    if getattr(_autograd.forward_class(node), "computes_only_needed_gradients", False):
        return OpaqueKind.SPLIT_COMPILED_REGION
    if _autograd.uses_saved_tensor_hooks(node):
        return OpaqueKind.CHECKPOINTED
    if _autograd.is_custom_function(node):
        return OpaqueKind.CUSTOM_FUNCTION
    if type(node).__name__ in NO_OUTPUT_SKIP_NODES:
        return OpaqueKind.NO_OUTPUT_SKIP
    return None


@dataclass(slots=True, frozen=True)
class OpaqueNode:
    """One opaque Node of a graph.

    Attributes:
        node: the node id in the graph.
        op: its forward op name (``"addmm"``, ``"CheckpointFunction"``).
        kind: an :class:`OpaqueKind`.
        intermediate: whether it feeds weights through weight-side edges (then W must serve them).
        meaning: what the split does with it (:data:`OPAQUE_MEANINGS`).
    """

    node: str
    op: str
    kind: OpaqueKind
    intermediate: bool
    meaning: str

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "op": self.op,
            "kind": str(self.kind),
            "intermediate": self.intermediate,
            "meaning": self.meaning,
        }


def opaque_nodes(
    graph: AutogradGraph, found_intermediates: Mapping[str, Intermediate] | None = None
) -> dict[str, OpaqueNode]:
    """The opaque Nodes of ``graph``, keyed by node id, in node order.

    ``found_intermediates``: :func:`graphkit.analysis.closures.intermediates` of ``graph``, if already
    computed.

    Every reentrant checkpoint and compiled region (they run their whole backward wherever they are), and
    the intermediates whose work W cannot restrict to the weight side: hooked saved tensors, custom
    Functions, and the ops of :data:`NO_OUTPUT_SKIP_NODES`. Each Node the graph holds live (a graph from
    :func:`graphkit.capture`) is classified by :func:`opaque_kind`; any other (a graph read back from
    GraphML) by its class name and recorded details (hooked saved tensors need ``details=True``).
    """
    if found_intermediates is None:
        closure_of_inputs = input_closure(graph)
        found_intermediates = intermediates(
            graph, closure_of_inputs, weight_only_nodes(graph, closure_of_inputs)
        )
    live_nodes: Mapping[str, Node] = getattr(graph, "autograd_nodes", {})
    found: dict[str, OpaqueNode] = {}
    for node, data in graph.nodes(data=True):
        if data["kind"] in (NodeKind.PARAMETER, NodeKind.LEAF):
            continue
        is_intermediate = node in found_intermediates
        live = live_nodes.get(node)
        if live is not None:
            kind = opaque_kind(live, intermediate=is_intermediate)
        else:
            kind = _opaque_kind_by_name(data, intermediate=is_intermediate)
        if kind is not None:
            found[node] = OpaqueNode(node, data["op"], kind, is_intermediate, OPAQUE_MEANINGS[kind.value])
    return found


def _opaque_kind_by_name(data: Mapping[str, Any], *, intermediate: bool) -> OpaqueKind | None:
    """:func:`opaque_kind` from a graph node's recorded attributes, for a graph without its live Nodes."""
    kind = _RUN_ONCE_NAMES.get(data["name"]) if data["is_custom_function"] else None
    if kind is not None or not intermediate:
        return kind
    if data.get("saved_reason") == _autograd.HOOKED_SAVED_TENSORS_REASON:
        return OpaqueKind.CHECKPOINTED
    if data["is_custom_function"]:
        return (
            OpaqueKind.SPLIT_COMPILED_REGION
            if data["name"] == _SPLIT_REGION_NAME
            else OpaqueKind.CUSTOM_FUNCTION
        )
    if data["name"] in NO_OUTPUT_SKIP_NODES:
        return OpaqueKind.NO_OUTPUT_SKIP
    return None
