"""Which backward FLOPs ``torch.utils.flop_counter.FlopCounterMode`` cannot see, and estimates from shapes.

``FlopCounterMode`` counts the ATen operators it has a formula for (``torch/utils/flop_counter.py``:
``mm``, ``addmm``, ``bmm``, convolutions, attention) as they run. Work done inside one opaque kernel is
invisible to it, and the total it prints looks complete anyway. :func:`flop_coverage` lists the nodes of a
captured graph whose backward it misses:

- **fused RNN kernels** (``mkldnn_rnn_layer`` on the CPU, ``cudnn_rnn`` / ``miopen_rnn`` on GPUs): their
  backward is a single operator with no formula. Their matrix products are estimated from the saved
  shapes (:func:`rnn_backward_flops`);
- **custom Functions** (``torch.autograd.Function``): counted only as far as their backward calls PyTorch
  operators; a Triton or C++ kernel inside is not;
- **opaque Nodes**: backward Nodes that are no ATen operator (C++ extensions), which no formula covers.

Totals that leave such work out are *partial*; :class:`FlopCoverage` says so and by how much it knows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from graphkit.graph._autograd import aten_operator_names
from graphkit.graph.autograd_graph import AutogradGraph, NodeKind

__all__ = ["RNN_KERNELS", "FlopCoverage", "UncountedNode", "flop_coverage", "rnn_backward_flops"]

RNN_KERNELS: frozenset[str] = frozenset({"mkldnn_rnn_layer", "cudnn_rnn", "miopen_rnn", "lstm_mps"})
"""Fused recurrent kernels (LSTM, GRU, RNN layers) whose backward FlopCounterMode has no formula for."""

_COUNTED_WITHOUT_ATEN = frozenset({"accumulate_grad", "copy_slices"})  # no FLOPs, or counted inside

_REASONS = {
    "rnn": "fused RNN kernel: FlopCounterMode has no formula for its backward (estimated from shapes)",
    "custom": "custom autograd Function: counted only where its backward calls PyTorch operators",
    "opaque": "opaque Node (no ATen operator): FlopCounterMode cannot see inside it",
}


@dataclass(slots=True, frozen=True)
class UncountedNode:
    """One node whose backward FLOPs FlopCounterMode misses.

    Attributes:
        node: graph node id; op: its op name; module_path: the module that made it (or None).
        kind: ``"rnn"``, ``"custom"`` or ``"opaque"``; reason: one sentence for the user.
        estimated: estimated backward FLOPs ``{"full", "b", "w"}`` from shapes, or None when unknown.
    """

    node: str
    op: str
    module_path: str | None
    kind: str
    reason: str
    estimated: dict[str, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "op": self.op,
            "module_path": self.module_path,
            "kind": self.kind,
            "reason": self.reason,
            "estimated": dict(self.estimated) if self.estimated is not None else None,
        }


@dataclass(slots=True)
class FlopCoverage:
    """What FlopCounterMode's totals leave out of a graph's backward.

    Attributes:
        not_counted: the nodes it misses, in graph order.
        estimated: FLOPs estimated from shapes for those that have an estimate (``full``, ``b``, ``w``).
    """

    not_counted: list[UncountedNode] = field(default_factory=list)
    estimated: dict[str, int] = field(default_factory=lambda: {"full": 0, "b": 0, "w": 0})

    @property
    def partial(self) -> bool:
        """True when some node's backward FLOPs are neither counted nor estimated."""
        return any(item.estimated is None for item in self.not_counted)

    def totals(self, counted: dict[str, int]) -> dict[str, int]:
        """``counted`` (FlopCounterMode's ``full``/``b``/``w``; -1 = not counted) plus the estimates."""
        return {
            phase: (value + self.estimated.get(phase, 0)) if value >= 0 else value
            for phase, value in counted.items()
        }

    def note(self) -> str:
        """One line: what the totals include and leave out ("" when FlopCounterMode saw everything)."""
        if not self.not_counted:
            return ""
        parts = []
        estimated = [item for item in self.not_counted if item.estimated is not None]
        missing = [item for item in self.not_counted if item.estimated is None]
        if estimated:
            ops = sorted({item.op for item in estimated})
            parts.append(f"{len(estimated)} node(s) estimated from shapes ({', '.join(ops)})")
        if missing:
            ops = sorted({item.op for item in missing})
            parts.append(f"partial: {len(missing)} node(s) not counted ({', '.join(ops[:6])})")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "partial": self.partial,
            "estimated_from_shapes": dict(self.estimated),
            "not_counted": [item.to_dict() for item in self.not_counted],
            "note": self.note(),
        }


def _saved_shape(data: dict[str, Any], name: str) -> tuple[int, ...] | None:
    for saved in data.get("saved_tensors") or []:
        if saved["name"] == name or saved["name"].startswith(f"{name}["):
            return tuple(saved["shape"])
    return None


def rnn_backward_flops(data: dict[str, Any]) -> dict[str, int] | None:
    """Backward FLOPs of a fused RNN kernel node from its saved shapes, or None when they are missing.

    The forward multiplies every time step of the ``input`` (``(T, B, I)``) by the input-to-hidden and
    hidden-to-hidden matrices (the two-dimensional saved weights, ``(G*H, I)`` and ``(G*H, H)``, G = 4
    gates for an LSTM, 3 for a GRU, 1 for a plain RNN): ``2 * T * B * sum(rows * columns)`` FLOPs. Its
    backward does the same products twice: once for the gradients of the input and hidden state (the B
    phase) and once for the weight gradients (the W phase), as in the LSTM backward of
    ``aten/src/ATen/native/RNN.cpp``. Elementwise gate arithmetic is not counted (nor does FlopCounterMode
    count it elsewhere).
    """
    input_shape = _saved_shape(data, "input")
    matrices = [
        tuple(saved["shape"])
        for saved in data.get("saved_tensors") or []
        if saved["name"].startswith("weight") and len(saved["shape"]) == 2
    ]
    if input_shape is None or len(input_shape) < 2 or not matrices:
        return None
    steps = math.prod(input_shape[:-1])  # time steps x batch
    products = 2 * steps * sum(rows * columns for rows, columns in matrices)
    return {"full": 2 * products, "b": products, "w": products}


def flop_coverage(graph: AutogradGraph) -> FlopCoverage:
    """The nodes of ``graph`` whose backward FLOPs ``FlopCounterMode`` misses (see the module docstring).

    Args:
        graph: a captured graph (with details: the RNN estimates read the saved tensors' shapes, which a
            graph on the ``meta`` device has too).

    Returns:
        A :class:`FlopCoverage`; ``estimated`` sums the RNN estimates. O(nodes).
    """
    aten = aten_operator_names()
    coverage = FlopCoverage()
    for node, data in graph.nodes(data=True):
        if str(data["kind"]) in (NodeKind.PARAMETER.value, NodeKind.LEAF.value, NodeKind.STAGE_INPUT.value):
            continue  # leaves do no backward work; a stage input's Node belongs to an earlier stage
        op = data.get("op") or ""
        if op in RNN_KERNELS:
            kind = "rnn"
        elif data.get("is_custom_function"):
            kind = "custom"
        elif op not in aten and op not in _COUNTED_WITHOUT_ATEN:
            kind = "opaque"
        else:
            continue
        estimated = rnn_backward_flops(data) if kind == "rnn" else None
        coverage.not_counted.append(
            UncountedNode(node, op, data.get("module_path"), kind, _REASONS[kind], estimated)
        )
        if estimated is not None:
            for phase, value in estimated.items():
                coverage.estimated[phase] += value
    return coverage
