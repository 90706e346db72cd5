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

This module re-exports :mod:`graphkit.split.pipelining`: :class:`PipelineStage`, :func:`build_stage`
(:class:`TracedPipelineStage`), the drop-in functions
:func:`stage_backward_input` / :func:`stage_backward_weight`, and :func:`check_pipeline`, which runs a real
schedule step and compares every gradient with a full backward (also ``graphkit verify-pipeline``; with
``frontend="tracing"``, of stages that :func:`trace_pipeline` traced with ``pipeline()``), and
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
    PipelineTracingError,
    SplitPoint,
    StageChain,
    TracedPipeline,
    TracedPipelineStage,
    build_stage,
    check_torch_contract,
    pipe_split,
    pipeline,
    stage_backward_input,
    stage_backward_weight,
    trace_pipeline,
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
    "PipelineTracingError",
    "SplitPoint",
    "StageChain",
    "TracedPipeline",
    "TracedPipelineStage",
    "build_schedule",
    "build_stage",
    "check_pipeline",
    "check_torch_contract",
    "load_pipeline_spec",
    "load_stage_or_pipeline",
    "pipe_split",
    "pipeline",
    "run_cases",
    "stage_backward_input",
    "stage_backward_weight",
    "trace_pipeline",
]
