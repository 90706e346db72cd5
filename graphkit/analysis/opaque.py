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
``custom-function``         a Python ``torch.autograd.Function`` that W calls again: graphkit sets its
                            ``ctx.needs_input_grad`` per phase; unless its backward computes only what
                            that asks for, it computes every gradient in both phases
``no-output-skip``          a C++ op whose backward computes what W skips (``linalg.solve`` with a learned
                            matrix: the matrix's gradient needs the right-hand side's, so W solves again)
==========================  ============================================================================

:func:`opaque_nodes` finds them in a captured graph, from the Node class names and, when the graph
holds its live Nodes, their saved-tensor hooks. :func:`graphkit.measure.verification.verify_split`
measures the FLOPs each one costs in B, in W and in a full backward.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from graphkit.analysis.closures import Intermediate, input_closure, intermediates, weight_only_nodes
from graphkit.graph import _autograd
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["NO_OUTPUT_SKIP_NODES", "OPAQUE_MEANINGS", "OpaqueKind", "OpaqueNode", "opaque_nodes"]


class OpaqueKind(enum.StrEnum):
    """Why the split cannot split a Node's work (module docstring)."""

    CHECKPOINTED = "checkpointed"
    REENTRANT_CHECKPOINT = "reentrant-checkpoint"
    COMPILED_REGION = "compiled-region"
    CUSTOM_FUNCTION = "custom-function"
    NO_OUTPUT_SKIP = "no-output-skip"


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
    the intermediates whose work W cannot restrict to the weight side: hooked saved tensors (needs the
    live Nodes, which a graph from :func:`graphkit.capture` holds, or ``details=True``), custom Functions,
    and the ops of :data:`NO_OUTPUT_SKIP_NODES`.
    """
    if found_intermediates is None:
        closure_of_inputs = input_closure(graph)
        found_intermediates = intermediates(
            graph, closure_of_inputs, weight_only_nodes(graph, closure_of_inputs)
        )
    found: dict[str, OpaqueNode] = {}
    for node, data in graph.nodes(data=True):
        if data["kind"] in (NodeKind.PARAMETER, NodeKind.LEAF):
            continue
        is_intermediate = node in found_intermediates
        kind = _RUN_ONCE_NAMES.get(data["name"]) if data["is_custom_function"] else None
        if kind is None and is_intermediate:
            if _hooked(graph, node):
                kind = OpaqueKind.CHECKPOINTED
            elif data["is_custom_function"]:
                kind = OpaqueKind.CUSTOM_FUNCTION
            elif data["name"] in NO_OUTPUT_SKIP_NODES:
                kind = OpaqueKind.NO_OUTPUT_SKIP
        if kind is not None:
            found[node] = OpaqueNode(node, data["op"], kind, is_intermediate, OPAQUE_MEANINGS[kind.value])
    return found


def _hooked(graph: AutogradGraph, node: str) -> bool:
    live = graph.autograd_nodes.get(node) if hasattr(graph, "autograd_nodes") else None
    if live is not None:
        return _autograd.uses_saved_tensor_hooks(live)
    return graph.nodes[node].get("saved_reason") == _autograd.HOOKED_SAVED_TENSORS_REASON
