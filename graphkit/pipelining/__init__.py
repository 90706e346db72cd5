"""Zero-bubble pipelines with ``torch.distributed.pipelining`` and graphkit's exact split backward.

Change one import and a zero-bubble schedule trains with every parameter's exact gradient::

    from graphkit.pipelining import PipelineStage   # instead of torch.distributed.pipelining's

    stage = PipelineStage(module, stage_index, num_stages, device)
    schedule = ScheduleZBVZeroBubble([stage, ...], n_microbatches, loss_fn=loss_fn)

With the tracing frontend (``pipeline()`` then ``build_stage``) the one import is the same::

    from graphkit.pipelining import SplitPoint, build_stage, pipeline   # instead of torch's

    pipe = pipeline(module, mb_args=(example_microbatch,), split_spec={"layers.4": SplitPoint.BEGINNING})
    stage = build_stage(pipe.get_stage_module(stage_index), stage_index, pipe.info(), device, group)

(``pipeline``, ``pipe_split`` and ``SplitPoint`` are PyTorch's own objects, re-exported unchanged; only
``build_stage`` is graphkit's.)

The one home of graphkit's ``torch.distributed.pipelining`` integration, a module per idea, in two wings
that barely touch.

The drop-in runtime (what a user's training runs):

- :mod:`~graphkit.pipelining.stage`: :class:`PipelineStage`, PyTorch's stage whose I (input-gradient
  backward, B in the ZB paper) and W actions run graphkit's B and W phases, and :func:`build_stage`
  (:class:`TracedPipelineStage`), the same for the stages of PyTorch's tracing frontend;
- :mod:`~graphkit.pipelining.stage_backward`: :func:`stage_backward_input` / :func:`stage_backward_weight`
  with the signatures of PyTorch's ``_backward.py`` functions;
- :mod:`~graphkit.pipelining.contract`: the check that the installed torch routes I and W as expected;
- :mod:`~graphkit.pipelining.data_parallel`: DDP / FSDP2 settings around B and W;
- :mod:`~graphkit.pipelining.gradient_scaling`: a parameter that stages on one rank share, divided by
  the number of microbatches once per step;
- :mod:`~graphkit.pipelining.tracing_frontend`: :func:`trace_pipeline`, a pipeline spec's stage modules
  composed into one model (:class:`StageChain`) and cut by ``pipeline()`` (:class:`TracedPipeline`).

The schedules (choosing, running, recording and checking them):

- :mod:`~graphkit.pipelining.planning`: the one home of schedules as data - the action record, parsed
  schedules and their CSV files, costs, generators, the simulator, timelines, calibration (no torch);
- :mod:`~graphkit.pipelining.schedules`: schedule names, classes, stage placement, stage counts, building
  a schedule over this rank's stages;
- :mod:`~graphkit.pipelining.launcher`: the one way to start ranks: free port, process group, deadline,
  ending only the processes it started;
- :mod:`~graphkit.pipelining.recording`: what a real schedule step ran on every rank, and when;
- :mod:`~graphkit.pipelining.verification`: :func:`verify_pipeline`, a real schedule step against a full
  backward (``graphkit verify-pipeline``);
- :mod:`~graphkit.pipelining.schedule_plan`: the planner's answer as data (:class:`SchedulePlan`);
- :mod:`~graphkit.pipelining.planner`: ``graphkit plan``: measure costs, simulate every schedule, rank
  them, record the best and calibrate (orchestration only).

The pipeline specs every pipeline command takes (:class:`PipelineModel`, :func:`load_pipeline_spec`,
:func:`load_stage_or_pipeline`) come from :mod:`graphkit.models.pipeline_specs` and are re-exported here.
Importing this package imports ``torch.distributed``; ``import graphkit`` does not.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.distributed.pipelining import SplitPoint, pipe_split, pipeline

from graphkit.models.pipeline_specs import PipelineModel, load_pipeline_spec, load_stage_or_pipeline
from graphkit.pipelining.contract import TESTED_TORCH, PipelineContractError, check_torch_contract
from graphkit.pipelining.schedules import SCHEDULE_NAMES, build_schedule
from graphkit.pipelining.stage import BackwardCalls, PipelineStage, TracedPipelineStage, build_stage
from graphkit.pipelining.stage_backward import stage_backward_input, stage_backward_weight
from graphkit.pipelining.tracing_frontend import (
    PipelineTracingError,
    StageChain,
    TracedPipeline,
    trace_pipeline,
)
from graphkit.pipelining.verification import (
    ParameterVerification,
    PipelineCase,
    PipelineVerification,
    verify_cases,
    verify_pipeline,
)
from graphkit.split.compile_backend import register_backends

__all__ = [
    "SCHEDULE_NAMES",
    "TESTED_TORCH",
    "BackwardCalls",
    "ParameterVerification",
    "PipelineCase",
    "PipelineContractError",
    "PipelineModel",
    "PipelineStage",
    "PipelineTracingError",
    "PipelineVerification",
    "SplitPoint",
    "StageChain",
    "TracedPipeline",
    "TracedPipelineStage",
    "build_schedule",
    "build_stage",
    "check_torch_contract",
    "load_pipeline_spec",
    "load_stage_or_pipeline",
    "pipe_split",
    "pipeline",
    "stage_backward_input",
    "stage_backward_weight",
    "trace_pipeline",
    "verify_cases",
    "verify_pipeline",
]

_DEPRECATED = {
    "check_pipeline": "verify_pipeline",
    "run_cases": "verify_cases",
    "PipelineCheck": "PipelineVerification",
    "ParameterCheck": "ParameterVerification",
}
"""Names of the previous release, kept for one release: graphkit verifies, with one verb everywhere."""

register_backends()  # compile=split in pipeline specs selects graphkit's splitting backend by name


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        new_name = _DEPRECATED[name]
        warnings.warn(
            f"graphkit.pipelining.{name} is deprecated and will be removed in the next release: "
            f"use graphkit.pipelining.{new_name} (same arguments, same result)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new_name]
    raise AttributeError(f"module 'graphkit.pipelining' has no attribute {name!r}")
