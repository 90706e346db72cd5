"""Zero-bubble pipelines with ``torch.distributed.pipelining`` and graphkit's exact split backward.

Change one import and a zero-bubble schedule trains with every parameter's exact gradient::

    from graphkit.pipelining import PipelineStage   # instead of torch.distributed.pipelining's

    stage = PipelineStage(module, stage_index, num_stages, device)
    schedule = ScheduleZBVZeroBubble([stage, ...], n_microbatches, loss_fn=loss_fn)

This module re-exports :mod:`graphkit.split.pipelining`: :class:`PipelineStage`, the drop-in functions
:func:`stage_backward_input` / :func:`stage_backward_weight`, and :func:`check_pipeline`, which runs a real
schedule step and compares every gradient with a full backward (also ``graphkit verify-pipeline``), and
the pipeline specs every pipeline command takes (:class:`PipelineModel`, :func:`load_pipeline_spec`,
:func:`load_stage_or_pipeline`; :mod:`graphkit.models.pipeline_specs`).
Importing it imports ``torch.distributed``; ``import graphkit`` does not.
"""

from __future__ import annotations

from graphkit.models.pipeline_specs import PipelineModel, load_pipeline_spec, load_stage_or_pipeline
from graphkit.split.pipelining import (
    TESTED_TORCH,
    BackwardCalls,
    PipelineContractError,
    PipelineStage,
    check_torch_contract,
    stage_backward_input,
    stage_backward_weight,
)
from graphkit.split.pipelining.checker import (
    ParameterCheck,
    PipelineCase,
    PipelineCheck,
    check_pipeline,
    run_cases,
)
from graphkit.split.pipelining.schedules import SCHEDULE_NAMES, build_schedule

__all__ = [
    "SCHEDULE_NAMES",
    "TESTED_TORCH",
    "BackwardCalls",
    "ParameterCheck",
    "PipelineCase",
    "PipelineCheck",
    "PipelineContractError",
    "PipelineModel",
    "PipelineStage",
    "build_schedule",
    "check_pipeline",
    "check_torch_contract",
    "load_pipeline_spec",
    "load_stage_or_pipeline",
    "run_cases",
    "stage_backward_input",
    "stage_backward_weight",
]
