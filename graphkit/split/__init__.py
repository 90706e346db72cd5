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
- :mod:`graphkit.split.benchmark`: timing B + W against a full backward;
- :mod:`graphkit.split.costs`: time, FLOPs and memory of each stage's F, B and W, as schedulers take them;
- :mod:`graphkit.split.schedule_recording`: what a real ``torch.distributed.pipelining`` schedule step ran
  on every rank (F, I, W, B, sends, receives), and schedules compared on the same stages.
- :mod:`graphkit.split.pipelining`: B and W inside ``torch.distributed.pipelining`` (a ``PipelineStage``
  subclass, drop-in backward functions, ``check_pipeline``), re-exported as :mod:`graphkit.pipelining`;
  imported on demand, since it imports ``torch.distributed``.

The split imports the graph and analysis layers, never drawing. Verification, benchmarking, costs and
recording load on first use (``from graphkit.split.verification import verify_split``), so
``import graphkit`` stays light.
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

_REMOVED = (
    "graphkit sets ctx.needs_input_grad of each custom Function's Node to the running phase (in B only the "
    "arguments on the input path need a gradient, in W only the weight-side ones): compute what "
    "ctx.needs_input_grad asks for and drop the phase check"
)


def __getattr__(name: str) -> Any:
    if name in ("current_phase", "Phase"):
        raise AttributeError(f"graphkit.split.{name} was removed: {_REMOVED}")
    raise AttributeError(f"module 'graphkit.split' has no attribute {name!r}")
