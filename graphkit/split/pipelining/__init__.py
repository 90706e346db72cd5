"""graphkit's split backward inside ``torch.distributed.pipelining``.

- :mod:`~graphkit.split.pipelining.stage`: :class:`PipelineStage`, PyTorch's stage whose I and W actions
  run graphkit's B and W, and :func:`build_stage` (:class:`TracedPipelineStage`), the same for the stages of
  PyTorch's tracing frontend;
- :mod:`~graphkit.split.pipelining.stage_backward`: :func:`stage_backward_input` / :func:`stage_backward_weight`
  with the signatures of PyTorch's ``_backward.py`` functions;
- :mod:`~graphkit.split.pipelining.contract`: the check that the installed torch routes I and W as expected;
- :mod:`~graphkit.split.pipelining.data_parallel`: DDP / FSDP2 settings around B and W;
- :mod:`~graphkit.split.pipelining.gradient_scaling`: a parameter that stages on one rank share, divided by
  the number of microbatches once per step;
- :mod:`~graphkit.split.pipelining.schedules`: the zero-bubble schedules by name, and CSV schedules;
- :mod:`~graphkit.split.pipelining.tracing_frontend`: :func:`trace_pipeline`, a pipeline spec's stage
  modules composed into one model (:class:`StageChain`) and cut by ``pipeline()`` (:class:`TracedPipeline`);
- :mod:`~graphkit.split.pipelining.checker`: :func:`check_pipeline`, a real schedule step against a full backward;
- :mod:`~graphkit.split.pipelining.launcher`: running a function on R local processes with a deadline.

It also re-exports, unchanged, the tracing frontend's own ``pipeline``, ``pipe_split`` and ``SplitPoint``
from ``torch.distributed.pipelining`` (they are PyTorch's objects, not graphkit's), so that a tracing
frontend user imports everything from one place.

Importing this package imports ``torch.distributed``; ``import graphkit`` does not.
"""

from __future__ import annotations

from torch.distributed.pipelining import SplitPoint, pipe_split, pipeline

from graphkit.split.pipelining.contract import TESTED_TORCH, PipelineContractError, check_torch_contract
from graphkit.split.pipelining.stage import BackwardCalls, PipelineStage, TracedPipelineStage, build_stage
from graphkit.split.pipelining.stage_backward import stage_backward_input, stage_backward_weight
from graphkit.split.pipelining.tracing_frontend import (
    PipelineTracingError,
    StageChain,
    TracedPipeline,
    trace_pipeline,
)

__all__ = [
    "TESTED_TORCH",
    "BackwardCalls",
    "PipelineContractError",
    "PipelineStage",
    "PipelineTracingError",
    "SplitPoint",
    "StageChain",
    "TracedPipeline",
    "TracedPipelineStage",
    "build_stage",
    "check_torch_contract",
    "pipe_split",
    "pipeline",
    "stage_backward_input",
    "stage_backward_weight",
    "trace_pipeline",
]
