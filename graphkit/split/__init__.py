"""The split layer: the backward of a zero-bubble pipeline stage in two phases, and nothing else.

- :mod:`graphkit.split.backward`: :func:`backward_input` (B: stage-input gradients, captured gradients at
  the intermediates) and :func:`backward_weight` (W: every parameter's ``.grad``), plus :func:`backward_full`;
- :mod:`graphkit.split.backward_plan`: what B and W need of a graph's structure, computed once per
  structure and cached;
- :mod:`graphkit.split.arguments`: outputs with their cotangents, stage inputs and parameters, checked;
- :mod:`graphkit.split.custom_functions`: ``ctx.needs_input_grad`` of custom Functions, per phase;
- :mod:`graphkit.split.weight_rules`: W's formulas over the tensors an intermediate saved;
- :mod:`graphkit.split.checkpointing`: non-reentrant activation checkpointing, recomputed at most once per
  phase (:class:`Recompute`: in W, or kept from B);
- :mod:`graphkit.split.run_once`: reentrant checkpoints and compiled regions, run once in B;
- :mod:`graphkit.split.weight_queue`: B without a walk where every parameter lies inside split compiled
  regions (each region queues its W on its microbatch's queue);
- :mod:`graphkit.split.graph_anchor`: keeping a microbatch's graph alive from B to W;
- :mod:`graphkit.split.stage_compute`: :class:`StageCompute`, per-microbatch forward / B / W for a schedule.

The split imports the graph and analysis layers only. Checking and measuring it live in
:mod:`graphkit.measure`, running it in ``torch.distributed.pipelining`` in :mod:`graphkit.pipelining`.
"""

from __future__ import annotations

from typing import Any

from graphkit.split.backward import (
    GraphFreedError,
    SplitError,
    SplitState,
    backward_full,
    backward_input,
    backward_weight,
)
from graphkit.split.checkpointing import Recompute
from graphkit.split.stage_compute import StageCompute, StageError

__all__ = [
    "GraphFreedError",
    "Recompute",
    "SplitError",
    "SplitState",
    "StageCompute",
    "StageError",
    "backward_full",
    "backward_input",
    "backward_weight",
]

REMOVED_PHASE_API = (  # what replaced current_phase() and Phase, for the error of the names removed
    "graphkit sets ctx.needs_input_grad of each custom Function's Node to the running phase (in B only the "
    "arguments on the input path need a gradient, in W only the weight-side ones): compute what "
    "ctx.needs_input_grad asks for and drop the phase check"
)


def __getattr__(name: str) -> Any:
    if name in ("current_phase", "Phase"):
        raise AttributeError(f"graphkit.split.{name} was removed: {REMOVED_PHASE_API}")
    raise AttributeError(f"module 'graphkit.split' has no attribute {name!r}")
