"""The split layer: the backward of a zero-bubble pipeline stage in two phases, and its checks.

- :mod:`graphkit.split.backward`: :func:`backward_input` (B: stage-input gradients, captured gradients at
  the intermediates) and :func:`backward_weight` (W: every parameter's ``.grad``), plus :func:`backward_full`;
- :mod:`graphkit.split.weight_rules`: W's formulas over the tensors an intermediate saved;
- :mod:`graphkit.split.checkpointing`: non-reentrant activation checkpointing, recomputed at most once per
  phase (:class:`Recompute`: in W, or kept from B);
- :mod:`graphkit.split.run_once`: reentrant checkpoints and compiled regions, run once in B;
- :mod:`graphkit.split.stage_compute`: :class:`StageCompute`, per-microbatch forward / B / W for a schedule;
- :mod:`graphkit.split.verification`: :func:`~graphkit.split.verification.verify_split`, split against a
  full backward;
- :mod:`graphkit.split.benchmark`: timing B + W against a full backward.

The split imports the graph and analysis layers, never drawing. Verification and benchmarking load on
first use (``from graphkit.split.verification import verify_split``), so ``import graphkit`` stays light.
"""

from __future__ import annotations

from graphkit.split.backward import (
    GraphFreedError,
    Phase,
    SplitError,
    SplitState,
    backward_full,
    backward_input,
    backward_weight,
    current_phase,
)
from graphkit.split.checkpointing import Recompute
from graphkit.split.stage_compute import StageCompute, StageError

__all__ = [
    "GraphFreedError",
    "Phase",
    "Recompute",
    "SplitError",
    "SplitState",
    "StageCompute",
    "StageError",
    "backward_full",
    "backward_input",
    "backward_weight",
    "current_phase",
]
