"""``verify_pipeline``: one real schedule step against a single-process full backward, parameter by parameter.

The check builds the pipeline twice from its spec (:mod:`graphkit.models.pipeline_specs`, under a fixed
seed, so both copies and every rank hold the same weights, in float64 by default). The first copy runs the
schedule: its stages become ``PipelineStage`` objects (graphkit's, or PyTorch's for comparison) on a
pipeline process group - all on this process by default (a world-size-1 gloo group), or spread over ``ranks``
local processes (:mod:`graphkit.pipelining.launcher`). The second copy runs an ordinary full backward,
in one process, over the same microbatches in the same order, and divides the stage modules' gradients
by the number of microbatches as the schedule does (``scale_grads``; PyTorch leaves the gradients of
parameters inside ``loss_fn`` unscaled, and so does the reference). Every parameter's gradient - stages and ``loss_fn`` - is then compared,
and its post-accumulate-grad hooks counted (one call per microbatch is expected).

With data parallelism (``data_parallel="ddp"`` or ``"fsdp"``) the ranks form ``ranks // 2`` pipeline ranks x 2
replicas; each replica runs its own shard of the batch, and the reference is the full backward over the
whole batch divided by ``microbatches x replicas``: exact up to the all-reduce's order of summation, so
those runs compare within a relative error of ``1e-10`` instead of bit for bit. So do runs where stages
on one rank share a parameter (tied first and last stages of a V schedule): the reference divides it once
by the number of microbatches, as graphkit's stages do (PyTorch's divide it once per stage), its hooks
fire once per stage and microbatch, and its gradient sums the stages' contributions in the schedule's
order.

With ``frontend="tracing"`` the stages come from PyTorch's tracing frontend instead: the spec's stage modules,
composed into one model, are traced and cut by ``pipeline()``
(:func:`~graphkit.pipelining.tracing_frontend.trace_pipeline`) on every rank, and each rank builds its
stages with ``build_stage`` (graphkit's, or PyTorch's). The oracle is then a full backward through the
traced stage modules of a second, identically traced copy - the same operations as the split, so the
comparison is bit for bit - and every parameter a stage module holds is compared, each copy of a parameter
that ``pipeline()`` replicated into several stages on its own. A third copy, the untraced model, checks what
tracing itself changed: the traced gradients (a replicated parameter's copies summed, across ranks) against
its full backward, within a relative error of ``1e-10`` (``torch.export`` inlines a custom
``autograd.Function``'s forward, whose rounding may differ from the Function's own backward by an ulp or
so). Before each SGD step the copies of a replicated parameter all take their sum, as a training loop over
traced stages must do, so the copies stay equal to the untraced parameter.

With ``timeline=True`` the last step is recorded on every rank by
:class:`graphkit.pipelining.recording.ScheduleRecorder` (every F, I, W, B, send and receive) and returned
as a :class:`~graphkit.pipelining.recording.ScheduleTimeline` (``graphkit verify-pipeline --timeline``
draws it with :mod:`graphkit.drawing.timeline`).

Between steps both copies take the same plain SGD step (``p -= 0.1 * grad``), so a second step starts from
weights that a first step changed, with gradients cleared.
"""

from __future__ import annotations

import math
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import build_stage as torch_build_stage

from graphkit.measure.gradient_check import GradientCheck, compare_gradients
from graphkit.models.pipeline_specs import load_pipeline_spec, schedule_loss_and_target
from graphkit.models.specs import model_frame
from graphkit.models.stage_chain import StageChain, chained_full_backward
from graphkit.pipelining.launcher import local_process_group, run_on_processes
from graphkit.pipelining.planning.actions import ScheduleOrder
from graphkit.pipelining.planning.timelines import ScheduleTimeline
from graphkit.pipelining.recording import memory_probe, record_rank_step, resolve_stage_class
from graphkit.pipelining.schedules import (
    GENERATED_SCHEDULES,
    SCHEDULE_NAMES,
    build_schedule,
    check_microbatches,
    check_ranks,
    resolve_schedule,
    schedule_name,
    stage_count,
    stage_indices,
)
from graphkit.pipelining.stage import build_stage
from graphkit.pipelining.tracing_frontend import trace_pipeline

__all__ = ["ParameterVerification", "PipelineVerification", "PipelineCase", "verify_pipeline", "verify_cases"]

_TOLERANCE = 1e-10
_LEARNING_RATE = 0.1


@dataclass(slots=True, frozen=True)
class PipelineCase:
    """One schedule run to check: which pipeline, schedule, microbatch count and number of steps.

    ``stage`` is ``"graphkit"`` (graphkit's :class:`~graphkit.pipelining.stage.PipelineStage`) or
    ``"torch"`` (``torch.distributed.pipelining.PipelineStage``, for comparison). ``stages_per_rank`` other
    than 2 suits ``InterleavedZeroBubble`` and ``CSV`` only. ``record_timeline``: record the last step.
    ``frontend`` is ``"manual"`` (the spec's stage modules are the stages) or ``"tracing"`` (``pipeline()``
    traces them composed into one model, and ``build_stage`` builds the stages).
    """

    spec: Any
    schedule: str | ScheduleOrder = "ZBVZeroBubble"
    microbatches: int = 4
    steps: int = 1
    stage: str = "graphkit"
    data_parallel: str | None = None
    stages_per_rank: int = 2
    record_timeline: bool = False
    frontend: str = "manual"


@dataclass(slots=True)
class ParameterVerification(GradientCheck):
    """One parameter's gradient against the full backward's, over every step: a
    :class:`~graphkit.measure.gradient_check.GradientCheck` (as :func:`graphkit.verify_split` gives) with
    the parameter's hook counts.

    Attributes:
        name: ``stage{i}.{parameter name}`` or ``loss_fn.{name}``.
        status: the first step's status that is not ``ok`` (``ok`` within ``1e-10`` relative; see
            :func:`~graphkit.measure.gradient_check.compare_gradients`), else ``ok``.
        max_abs_error: largest absolute difference over all steps (None when one side has no gradient).
        relative_error: largest ``max |grad - reference| / max |reference|`` over all steps (None as
            ``max_abs_error``).
        bitwise: whether every step's gradient equals the reference bit for bit.
        hooks: post-accumulate-grad hook calls over all steps (None where hooks are not counted: FSDP2).
        expected_hooks: microbatches x steps (x ``stages``) for a parameter that gets a gradient, else 0.
        stages: the stages on this rank that hold the parameter (tied weights): above 1, its gradient
            sums their contributions in the schedule's order, so the run passes within ``1e-10``
            relative (not bit for bit), and its hooks fire once per stage and microbatch.
        steps_compared: the schedule steps whose gradient was compared; 0 when the first step failed
            (then the errors say nothing, and :meth:`PipelineVerification.table` says "not run").
    """

    max_abs_error: float | None = 0.0  # 0 until a step differs (a parameter no side gives a gradient stays 0)
    relative_error: float | None = 0.0
    hooks: int | None = 0
    expected_hooks: int = 0
    stages: int = 1
    steps_compared: int = 0

    def add_step(self, step: GradientCheck) -> None:
        """Take one more step's comparison in: the largest errors, the first status that is not ``ok``.

        A step where one side has no gradient (or the shapes differ) leaves the errors None from then on.
        """
        if step.max_abs_error is None:
            if not step.ok:
                self.max_abs_error = self.relative_error = None
        elif self.max_abs_error is not None or self.ok:
            self.max_abs_error = max(self.max_abs_error or 0.0, step.max_abs_error)
            self.relative_error = max(self.relative_error or 0.0, step.relative_error or 0.0)
        if self.ok:
            self.status = step.status
        self.bitwise = self.bitwise and step.bitwise
        self.steps_compared += 1


@dataclass(slots=True)
class PipelineVerification:
    """The result of one checked schedule run (see :func:`verify_pipeline`).

    ``passed`` is True when the step ran, every gradient matches (bit for bit without data parallelism or
    shared parameters, within ``1e-10`` relative with them) and every counted hook fired once per
    microbatch (and stage holding it). ``timeline``: the
    recorded last step on every rank (a :class:`~graphkit.pipelining.recording.ScheduleTimeline`), when
    asked for and the step ran.

    With the tracing frontend, ``parameters`` are the traced stage modules' (named ``stage{i}.{name}``,
    each copy of a replicated parameter on its own) against the traced model's full backward, and
    ``untraced`` compares the untraced model's parameters (hooks not counted) with the sum of their traced
    copies; ``passed`` also needs every one of those within ``1e-10`` relative. ``replicated``: each
    parameter ``pipeline()`` copied into several stages, with the names of its copies. When the step
    raised, ``error`` says what, ``error_traceback`` holds the whole traceback, and ``model_error`` where the
    spec's own model raised it (``file.py:12 in forward``; empty when graphkit or PyTorch did).
    """

    case: PipelineCase
    ranks: int
    parameters: list[ParameterVerification] = field(default_factory=list)
    error: str | None = None
    backward_calls: dict[str, int] = field(default_factory=dict)
    timeline: Any = None
    untraced: list[ParameterVerification] = field(default_factory=list)
    replicated: dict[str, list[str]] = field(default_factory=dict)
    model_error: str = ""
    error_traceback: str = ""

    @property
    def exact(self) -> bool:
        """Whether every gradient equals the reference bit for bit (and the step ran)."""
        return (
            self.error is None and bool(self.parameters) and all(check.bitwise for check in self.parameters)
        )

    @property
    def hooks_ok(self) -> bool:
        """Whether every counted post-accumulate-grad hook fired once per microbatch."""
        return all(check.hooks is None or check.hooks == check.expected_hooks for check in self.parameters)

    @property
    def untraced_ok(self) -> bool:
        """Whether tracing kept every gradient within ``1e-10`` of the untraced model's (True unless tracing)."""
        return all(check.ok for check in self.untraced)

    @property
    def untraced_exact(self) -> bool:
        """Whether every traced gradient (copies summed) equals the untraced model's bit for bit."""
        return all(check.bitwise for check in self.untraced)

    @property
    def ok(self) -> bool:
        """Whether the run is correct: exact with hooks once each (within ``1e-10`` relative with data
        parallelism, or when stages on one rank share a parameter: its sum's rounding spreads to the
        other parameters from the second step on); with the tracing frontend, also within ``1e-10`` of
        the untraced model."""
        if self.error is not None or not self.parameters or not self.hooks_ok or not self.untraced_ok:
            return False
        if self.case.data_parallel is None and all(check.stages == 1 for check in self.parameters):
            return self.exact
        return all(check.ok for check in self.parameters)

    @property
    def passed(self) -> bool:
        """Deprecated: :attr:`ok` (graphkit says ``ok`` for a check that passed, as ``verify_split`` does)."""
        warnings.warn(
            "PipelineVerification.passed is deprecated and will be removed in the next release: use .ok "
            "(same value)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.ok

    @property
    def max_relative_error(self) -> float:
        """The largest relative error over all parameters (``inf`` when the step failed, or a parameter
        lacks a gradient on one side)."""
        if self.error is not None or not self.parameters:
            return math.inf
        return max(_relative_or_inf(check) for check in self.parameters)

    def table(self, untraced: bool = False) -> str:
        """A per-parameter text table: errors, bitwise equality and hook counts (``untraced``: of
        :attr:`untraced`, the untraced model's parameters against their traced copies, summed)."""
        rows = [("parameter", "max abs error", "relative error", "bitwise", "hooks")]
        steps = self.case.steps
        for check in self.untraced if untraced else self.parameters:
            if not check.steps_compared:  # a step that did not run is no pass
                rows.append((check.name, "-", "-", "not compared: the step did not run", "-"))
                continue
            hooks = "n/a" if check.hooks is None else f"{check.hooks}/{check.expected_hooks}"
            bitwise = "yes" if check.bitwise else "no"
            if check.steps_compared < steps:
                bitwise += f" (steps 1-{check.steps_compared} of {steps}; the next did not run)"
            rows.append(
                (check.name, _error(check.max_abs_error), _error(check.relative_error), bitwise, hooks)
            )
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * width for width in widths))
        return "\n".join(lines)


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _relative_or_inf(check: GradientCheck) -> float:
    """A check's relative error; ``inf`` where a failed check has none (one side has no gradient)."""
    if check.relative_error is None:
        return 0.0 if check.ok else math.inf
    return check.relative_error


def verify_pipeline(
    spec: Any,
    *,
    schedule: str = "ZBVZeroBubble",
    microbatches: int = 4,
    steps: int = 1,
    ranks: int = 1,
    data_parallel: str | None = None,
    stage: str = "graphkit",
    stages_per_rank: int = 2,
    deadline: float = 120.0,
    timeline: bool = False,
    frontend: str = "manual",
) -> PipelineVerification:
    """Run a real pipeline schedule step and compare every parameter's gradient with a full backward.

    Args:
        spec: a pipeline spec (``path/to/file.py:function``, ``module:function``, ``zoo-pipeline:NAME``,
            ``hf:gpt2?...``, ``hf:llama?...``) or a function returning a
            :class:`~graphkit.models.pipeline_specs.PipelineModel`;
            see :mod:`graphkit.models.pipeline_specs`. It is built with ``stages_per_rank x pipeline ranks``
            stages and a batch of 2 rows per microbatch per replica. A function must be importable by name
            when ``ranks > 1``.
        schedule: ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``, ``CSV``, ``ZBH1``, ``ZBH2``,
            ``Adaptive``, ``CostAware`` or ``csv:PATH`` (:mod:`graphkit.pipelining.schedules`); ``ZBH1``,
            ``ZBH2``, ``Adaptive`` and ``CostAware`` put one stage on each pipeline rank, the others two
            (``CSV``: ``stages_per_rank``).
        microbatches: microbatches per step (the batch is split evenly).
        steps: schedule steps, with an SGD step in between.
        ranks: processes; 1 runs every stage in this process (a world-size-1 gloo group, unless a default
            process group already exists, whose ranks are then used as they are).
        data_parallel: None, ``"ddp"`` (each stage module in ``DistributedDataParallel``) or ``"fsdp"``
            (``fully_shard``): then ``ranks`` must be even, ``ranks // 2`` pipeline ranks x 2 replicas.
        stage: ``"graphkit"`` or ``"torch"`` (PyTorch's own stage, to compare).
        stages_per_rank: stages on each pipeline rank (2; any number for ``InterleavedZeroBubble`` and ``CSV``).
        deadline: seconds before spawned processes are ended (``ranks > 1``).
        timeline: record the last step on every rank (:attr:`PipelineVerification.timeline`).
        frontend: ``"manual"`` (the spec's stage modules are the stages, ``PipelineStage``) or
            ``"tracing"`` (``pipeline()`` traces them composed into one model, ``build_stage`` builds the
            stages; no data parallelism).

    Returns:
        A :class:`PipelineVerification`; ``error`` holds the exception text when the schedule step itself raised.

    Raises:
        ValueError: an unknown schedule, stage, frontend or data_parallel, ``ranks`` that do not fit it, or
            data parallelism with the tracing frontend.
        graphkit.models.specs.SpecError: a bad pipeline spec.
        graphkit.pipelining.tracing_frontend.PipelineTracingError: ``pipeline()`` cannot trace the
            spec's stages (a ValueError; the message says why).
        graphkit.pipelining.launcher.LaunchError: a spawned process failed outside the step, or the
            deadline passed.
    """
    case = PipelineCase(
        spec, schedule, microbatches, steps, stage, data_parallel, stages_per_rank, timeline, frontend
    )
    return verify_cases([case], ranks=ranks, deadline=deadline)[0]


def verify_cases(
    cases: list[PipelineCase], *, ranks: int = 1, deadline: float = 120.0
) -> list[PipelineVerification]:
    """Check several cases on one process group (one spawn of ``ranks`` processes for all of them).

    Raises:
        as :func:`verify_pipeline`.
    """
    for case in cases:
        _validate(case, ranks)
    # a csv:PATH is read here, once, and its order passed down to the ranks; the results name the case asked
    runs = [replace(case, schedule=resolve_schedule(case.schedule)) for case in cases]
    if ranks == 1 or (dist.is_initialized() and dist.get_world_size() == ranks):
        with local_process_group():
            results = _run_rank(runs)
    else:
        for case in runs:
            if (
                case.frontend == "tracing"
            ):  # an untraceable spec: a clear error here, not one per spawned rank
                _traced(case, stage_count(case.schedule, ranks, case.stages_per_rank), 2 * case.microbatches)
        per_rank = run_on_processes(_run_rank, (runs,), world_size=ranks, deadline=deadline)
        results = [_merge([checks[index] for checks in per_rank]) for index in range(len(runs))]
    for result, case in zip(results, cases, strict=True):
        result.case = case
    return results


def _validate(case: PipelineCase, ranks: int) -> None:
    known = (*SCHEDULE_NAMES, *GENERATED_SCHEDULES)
    if (
        not isinstance(resolve_schedule(case.schedule), ScheduleOrder)
        and schedule_name(case.schedule) not in known
    ):
        raise ValueError(
            f"unknown schedule {case.schedule!r} for verify-pipeline, which verifies the schedules with "
            f"separate I and W actions: choose one of {', '.join(known)} or csv:PATH"
        )
    stage_indices(case.schedule, 0, 1, case.stages_per_rank)  # an unknown schedule or placement raises
    if case.stage not in ("graphkit", "torch"):
        raise ValueError(f"stage must be 'graphkit' or 'torch', got {case.stage!r}")
    if case.frontend not in ("manual", "tracing"):
        raise ValueError(f"frontend must be 'manual' or 'tracing', got {case.frontend!r}")
    if case.frontend == "tracing" and case.data_parallel is not None:
        raise ValueError(
            "the tracing frontend is checked without data parallelism: a traced stage module cannot be "
            "wrapped in DistributedDataParallel (build_stage reads its fx graph), and fully_shard over "
            "traced stages is not checked; drop --ddp / --fsdp, or use the manual frontend"
        )
    if case.data_parallel not in (None, "ddp", "fsdp"):
        raise ValueError(f"data_parallel must be None, 'ddp' or 'fsdp', got {case.data_parallel!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if case.data_parallel is not None and ranks % 2:
        raise ValueError(
            f"data parallelism needs an even number of ranks (pipeline ranks x 2 replicas), got ranks={ranks}"
        )
    if case.microbatches < 1 or case.steps < 1:
        raise ValueError("microbatches and steps must be at least 1")
    check_microbatches(case.schedule, case.microbatches)
    check_ranks(case.schedule, ranks // 2 if case.data_parallel is not None else ranks)


def _merge(checks: list[PipelineVerification]) -> PipelineVerification:
    merged = PipelineVerification(checks[0].case, len(checks))
    errors = [check.error for check in checks if check.error is not None]
    # a rank whose peer failed reports a closed connection: name the peer's own error first
    errors.sort(key=lambda error: "Connection closed" in error or error.startswith("not run"))
    merged.error = errors[0] if errors else None
    failed = [check for check in checks if check.error is not None and check.error == merged.error]
    if failed:
        merged.model_error, merged.error_traceback = failed[0].model_error, failed[0].error_traceback
    seen: set[str] = set()
    seen_untraced: set[str] = set()
    for check in checks:
        for parameter in check.parameters:
            if parameter.name not in seen:  # replicas report the same parameters: keep the first
                seen.add(parameter.name)
                merged.parameters.append(parameter)
        for parameter in check.untraced:  # a replicated parameter is reported by each rank of a copy
            if parameter.name not in seen_untraced:
                seen_untraced.add(parameter.name)
                merged.untraced.append(parameter)
        merged.replicated.update(check.replicated)
        for kind, count in check.backward_calls.items():
            merged.backward_calls[kind] = merged.backward_calls.get(kind, 0) + count
    if all(check.timeline is not None for check in checks):
        merged.timeline = ScheduleTimeline.merge([check.timeline for check in checks])
    merged.parameters.sort(key=lambda parameter: _sort_key(parameter.name))
    merged.untraced.sort(key=lambda parameter: _sort_key(parameter.name))
    return merged


def _sort_key(name: str) -> tuple[int, str]:
    head = name.split(".", 1)[0]
    return (int(head[len("stage") :]) if head.startswith("stage") else 1 << 30, name)


# --- one rank ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Mesh:
    pipeline_group: Any
    pipeline_rank: int
    pipeline_size: int
    replica_group: Any
    replica: int
    replicas: int


def _mesh(data_parallel: str | None) -> _Mesh:
    rank, world = dist.get_rank(), dist.get_world_size()
    if data_parallel is None:
        return _Mesh(dist.group.WORLD, rank, world, None, 0, 1)
    pipeline_size, replicas = world // 2, 2
    pipeline_groups = [
        dist.new_group(list(range(d * pipeline_size, (d + 1) * pipeline_size))) for d in range(replicas)
    ]
    replica_groups = [
        dist.new_group([p + d * pipeline_size for d in range(replicas)]) for p in range(pipeline_size)
    ]
    replica, pipeline_rank = divmod(rank, pipeline_size)
    return _Mesh(
        pipeline_groups[replica],
        pipeline_rank,
        pipeline_size,
        replica_groups[pipeline_rank],
        replica,
        replicas,
    )


def _run_rank(cases: list[PipelineCase]) -> list[PipelineVerification]:
    results: list[PipelineVerification] = []
    for case in cases:
        results.append(_run_case(case))
        if results[-1].error is not None and dist.get_world_size() > 1:
            # the other ranks may wait on this one: later cases would deadlock, so report them as not run
            for rest in cases[len(results) :]:
                results.append(
                    PipelineVerification(rest, dist.get_world_size(), error="not run: an earlier case failed")
                )
            break
    return results


def _build(case: PipelineCase, num_stages: int, batch_size: int) -> Any:

    model = load_pipeline_spec(case.spec, num_stages=num_stages, batch_size=batch_size, seed=0)
    for stage in model.stages:
        stage.to(torch.float64)
    if isinstance(model.loss_fn, nn.Module):
        model.loss_fn.to(torch.float64)
    model.inputs = tuple(_float64(value) for value in model.inputs)
    model.target = _float64(model.target)
    return model


def _float64(value: Any) -> Any:
    return value.to(torch.float64) if isinstance(value, torch.Tensor) and value.is_floating_point() else value


def _named_parameters(model: Any, indices: list[int], num_stages: int) -> dict[str, nn.Parameter]:
    named: dict[str, nn.Parameter] = {}
    for index in indices:
        for name, parameter in model.stages[index].named_parameters():
            named[f"stage{index}.{name}"] = parameter
    if num_stages - 1 in indices and isinstance(model.loss_fn, nn.Module):
        for name, parameter in model.loss_fn.named_parameters():
            named[f"loss_fn.{name}"] = parameter
    return named


@dataclass(slots=True)
class _Run:
    """One rank's side of a case: its stages, and the parameters to compare, zero and step."""

    stages: list[Any]
    loss_fn: Any
    named: dict[str, nn.Parameter]  # this rank's parameters, in the pipeline that runs the schedule
    reference_named: dict[str, nn.Parameter]  # the same names in the reference
    reference_all: dict[str, nn.Parameter]  # every parameter of the reference (all stages)
    inputs: tuple[Any, ...]
    target: Any
    reference_backward: Any  # () -> None: the reference's full backward over the step's microbatches
    untraced: _UntracedComparison | None = None


def _manual_run(case: PipelineCase, mesh: _Mesh, num_stages: int, indices: list[int]) -> _Run:
    per_replica = 2 * case.microbatches
    batch_size = per_replica * mesh.replicas
    pipeline = _build(case, num_stages, batch_size)
    reference = _build(case, num_stages, batch_size)
    if pipeline.inputs and pipeline.inputs[0].shape[0] % (case.microbatches * mesh.replicas):
        raise ValueError(
            f"the batch ({pipeline.inputs[0].shape[0]}) does not split into {case.microbatches} equal "
            f"microbatches per replica x {mesh.replicas}; declare batch_size in the spec function"
        )
    stages = [_make_stage(case, mesh, pipeline.stages[index], index, num_stages) for index in indices]
    inputs, target = _replica_batch(pipeline, mesh.replica, per_replica)
    return _Run(
        stages,
        pipeline.loss_fn,
        _named_parameters(pipeline, indices, num_stages),  # after wrapping: FSDP2 swaps in shards
        _named_parameters(reference, indices, num_stages),
        _named_parameters(reference, list(range(num_stages)), num_stages),
        inputs,
        target,
        lambda: _reference_backward(reference, case.microbatches, per_replica, mesh.replicas),
    )


def _traced(case: PipelineCase, num_stages: int, batch_size: int) -> Any:
    """The case's pipeline spec traced by ``pipeline()`` into ``num_stages`` stages of 2 rows a microbatch."""

    model = _build(case, num_stages, batch_size)
    if model.batch_size != batch_size:
        raise ValueError(
            f"the batch ({model.batch_size}) is not {case.microbatches} microbatches of 2 rows, as "
            "the tracing frontend traces one microbatch's shapes; declare batch_size in the spec function"
        )
    name = case.spec if isinstance(case.spec, str) else getattr(case.spec, "__qualname__", repr(case.spec))
    return trace_pipeline(model, 2, description=f"{name} ({num_stages} stages)")


def _tracing_run(case: PipelineCase, mesh: _Mesh, num_stages: int, indices: list[int]) -> _Run:
    batch_size = 2 * case.microbatches
    pipeline, reference = _traced(case, num_stages, batch_size), _traced(case, num_stages, batch_size)
    with_loss = num_stages - 1 in indices
    stages = [_make_traced_stage(case, mesh, pipeline, index) for index in indices]
    named = pipeline.named_parameters(indices, loss_fn=with_loss)
    untraced = _UntracedComparison(
        pipeline, named, reference, _build(case, num_stages, batch_size), indices, case.microbatches
    )
    return _Run(
        stages,
        pipeline.loss_fn,
        named,
        reference.named_parameters(indices, loss_fn=with_loss),
        reference.named_parameters(),
        pipeline.inputs,
        pipeline.target,
        lambda: reference.full_backward(case.microbatches),
        untraced,
    )


def _run_case(case: PipelineCase) -> PipelineVerification:

    mesh = _mesh(case.data_parallel)
    num_stages = stage_count(case.schedule, mesh.pipeline_size, case.stages_per_rank)
    indices = stage_indices(case.schedule, mesh.pipeline_rank, mesh.pipeline_size, case.stages_per_rank)
    make_run = _tracing_run if case.frontend == "tracing" else _manual_run
    run = make_run(case, mesh, num_stages, indices)
    schedule_loss, schedule_target = schedule_loss_and_target(run.loss_fn, run.inputs, run.target)
    check = PipelineVerification(case, dist.get_world_size())
    stages, named, untraced = run.stages, run.named, run.untraced
    hooks: Counter[str] = Counter()
    handles = []
    count_hooks = case.data_parallel != "fsdp"
    try:
        if count_hooks:
            for name, parameter in named.items():
                handles.append(
                    parameter.register_post_accumulate_grad_hook(lambda _, name=name: hooks.update([name]))
                )
        schedule = build_schedule(
            case.schedule, stages, case.microbatches, schedule_loss, ranks=mesh.pipeline_size
        )
        holders = Counter(id(parameter) for name, parameter in named.items() if name.startswith("stage"))
        results = {
            name: ParameterVerification(name, stages=max(1, holders[id(parameter)]))
            for name, parameter in named.items()
        }
        for step in range(case.steps):
            _zero(named.values())
            _zero(run.reference_all.values())
            if untraced is not None:
                untraced.zero()
            try:
                if case.record_timeline and step == case.steps - 1:
                    check.timeline = _recorded_step(
                        schedule, stages, run.inputs, schedule_target, mesh, num_stages, case, step == 0
                    )
                else:
                    schedule.step(*run.inputs, target=schedule_target)
            except Exception as error:  # a failing PyTorch stage is a result, not a crash of the check
                check.error = f"{type(error).__name__}: {_root_message(error)}"
                frame = model_frame(error)
                if frame is not None:  # the spec's own model raised: bad input, not a verdict on the split
                    check.model_error = f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
                check.error_traceback = "".join(traceback.format_exception(error))
                break
            run.reference_backward()
            grads = {name: _full_gradient(parameter) for name, parameter in named.items()}
            for name, result in results.items():
                _compare(result, grads[name], run.reference_named[name].grad, case.microbatches, hooks)
            hooks.clear()
            if untraced is not None:
                untraced.compare()  # and gives every copy of a replicated parameter their sum
            _sgd(named.values())
            _sgd(run.reference_all.values())
            if untraced is not None:
                untraced.sgd()
        check.parameters = list(results.values())
        if not count_hooks:
            for result in check.parameters:
                result.hooks = None
        if untraced is not None:
            check.untraced = list(untraced.results.values()) if check.error is None else []
            check.replicated = untraced.replicated
    finally:
        for handle in handles:
            handle.remove()
    for stage in stages:
        calls = getattr(stage, "backward_calls", None)
        if calls is not None:
            for kind in ("input", "weight", "full"):
                check.backward_calls[kind] = check.backward_calls.get(kind, 0) + getattr(calls, kind)
    return check


class _UntracedComparison:
    """The tracing frontend's second oracle: the untraced model's gradients against the traced copies' sum.

    ``pipeline()`` may copy a parameter into several stages (on several ranks); the untraced parameter's
    gradient is the sum of its copies'. :meth:`compare` gathers the copies' gradients from every rank
    (``all_gather_object``, only when some parameter has copies), adds them in stage order, compares the
    sums with the untraced model's full backward, and gives each copy - in the pipeline and in the traced
    reference alike - the sum, so the SGD step keeps every copy equal to the untraced parameter.
    """

    def __init__(
        self,
        pipeline: Any,
        named: dict[str, nn.Parameter],
        reference: Any,
        untraced: Any,
        indices: list[int],
        microbatches: int,
    ) -> None:

        self.pipeline, self.named, self.reference, self.untraced = pipeline, named, reference, untraced
        self.microbatches = microbatches
        self.copies = pipeline.copies()
        self.replicated = {
            name: [copy for _, copy in copies] for name, copies in self.copies.items() if len(copies) > 1
        }
        chain = StageChain(untraced.stages)
        self.untraced_named = {
            pipeline.untraced_name(name): parameter for name, parameter in chain.named_parameters()
        }
        local = set(indices)
        reported = [
            name
            for name in self.untraced_named
            if name not in self.copies or any(index in local for index, _ in self.copies[name])
        ]
        self.loss_fn_named: dict[str, tuple[nn.Parameter, nn.Parameter]] = {}
        if len(pipeline.stages) - 1 in local and isinstance(untraced.loss_fn, nn.Module):
            ours = dict(pipeline.loss_fn.named_parameters())
            for name, parameter in untraced.loss_fn.named_parameters():
                self.loss_fn_named[f"loss_fn.{name}"] = (ours[name], parameter)
        self.results = {name: ParameterVerification(name) for name in [*reported, *self.loss_fn_named]}
        self.reference_named = reference.named_parameters()

    def zero(self) -> None:
        _zero(self.untraced_named.values())
        if isinstance(self.untraced.loss_fn, nn.Module):
            _zero(self.untraced.loss_fn.parameters())

    def compare(self) -> None:
        _reference_backward(self.untraced, self.microbatches, 2 * self.microbatches, 1)
        gathered = self._gathered_copies()
        for name, result in self.results.items():
            if name in self.loss_fn_named:
                ours, theirs = self.loss_fn_named[name]
                total = ours.grad
                reference = theirs.grad
            else:
                total = _sum(gathered.get(name, {}).get(copy) for _, copy in self.copies.get(name, []))
                reference = self.untraced_named[name].grad
            _compare(result, total, reference, 0, Counter())
            result.hooks = None
        for name, copies in self.copies.items():
            if len(copies) < 2:
                continue
            total = _sum(gathered[name].get(copy) for _, copy in copies)
            expected = _sum(self.reference_named[copy].grad for _, copy in copies)
            for _, copy in copies:
                if copy in self.named:
                    self.named[copy].grad = None if total is None else total.clone()
                self.reference_named[copy].grad = None if expected is None else expected.clone()

    def _gathered_copies(self) -> dict[str, dict[str, torch.Tensor | None]]:
        """Every copy's gradient, ``{untraced name: {copy's name: grad}}``: this rank's, and, of the
        replicated parameters, every rank's."""
        local: dict[str, dict[str, torch.Tensor | None]] = {}
        for name, copies in self.copies.items():
            for _, copy in copies:
                if copy in self.named:
                    grad = self.named[copy].grad
                    local.setdefault(name, {})[copy] = None if grad is None else grad.detach().clone()
        if not self.replicated or dist.get_world_size() == 1:
            return local
        shared = {name: local.get(name, {}) for name in self.replicated}
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, shared)
        for theirs in everyone:
            for name, grads in theirs.items():
                local.setdefault(name, {}).update(grads)
        return local

    def sgd(self) -> None:
        _sgd(self.untraced_named.values())
        if isinstance(self.untraced.loss_fn, nn.Module):
            _sgd(self.untraced.loss_fn.parameters())


def _sum(grads: Any) -> torch.Tensor | None:
    """The sum of the gradients that are not None, in order (None if all are)."""
    total = None
    for grad in grads:
        if grad is not None:
            total = grad.clone() if total is None else total + grad
    return total


def _recorded_step(
    schedule: Any,
    stages: list[Any],
    inputs: tuple[Any, ...],
    target: Any,
    mesh: _Mesh,
    num_stages: int,
    case: Any,
    first_step: bool = False,
) -> Any:
    """Run one step under :class:`~graphkit.pipelining.recording.ScheduleRecorder`; this rank's timeline.

    ``first_step``: the schedule's first step, whose set-up before the first action (PyTorch's stage
    set-up and shape inference) becomes the timeline's ``setup_seconds``."""

    probe, method = memory_probe(torch.device("cpu"))
    dist.barrier()  # every rank's time zero at the same moment
    rank = record_rank_step(
        schedule, stages, lambda: schedule.step(*inputs, target=target), mesh.pipeline_rank, "cpu", probe
    )
    rank.rank = dist.get_rank()
    setup = min((action.start for action in rank.actions), default=0.0) if first_step else 0.0
    return ScheduleTimeline(
        schedule_name(case.schedule), case.microbatches, num_stages, [rank], "cpu", method, setup
    )


def _root_message(error: BaseException) -> str:
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _make_stage(case: PipelineCase, mesh: _Mesh, module: nn.Module, index: int, num_stages: int) -> Any:
    if case.data_parallel == "ddp":
        module = nn.parallel.DistributedDataParallel(module, process_group=mesh.replica_group)
    elif case.data_parallel == "fsdp":
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        ranks = [mesh.pipeline_rank + replica * mesh.pipeline_size for replica in range(mesh.replicas)]
        device_mesh = DeviceMesh.from_group(mesh.replica_group, "cpu", mesh=torch.tensor(ranks))
        fully_shard(module, mesh=device_mesh, reshard_after_forward=False)
    stage_class = resolve_stage_class(case.stage)
    return stage_class(module, index, num_stages, torch.device("cpu"), group=mesh.pipeline_group)


def _make_traced_stage(case: PipelineCase, mesh: _Mesh, traced: Any, index: int) -> Any:
    build = build_stage if case.stage == "graphkit" else torch_build_stage
    return build(
        traced.stages[index], index, traced.pipe.info(), torch.device("cpu"), group=mesh.pipeline_group
    )


def _replica_batch(model: Any, replica: int, per_replica: int) -> tuple[tuple[Any, ...], Any]:
    window = slice(replica * per_replica, (replica + 1) * per_replica)
    inputs = tuple(value[window] if isinstance(value, torch.Tensor) else value for value in model.inputs)
    target = model.target[window] if isinstance(model.target, torch.Tensor) else model.target
    return inputs, target


def _reference_backward(model: Any, microbatches: int, per_replica: int, replicas: int) -> None:
    """Full backward over every replica's microbatches, in the schedule's order; scaled like the schedule.

    Each parameter's gradient is divided once, also one held by several stage modules (the model's mean
    gradient), as graphkit's stages divide it (PyTorch's ``scale_grads`` divides it once per stage).
    """
    size = per_replica // microbatches

    def batches() -> Any:
        for replica in range(replicas):
            inputs, target = _replica_batch(model, replica, per_replica)
            for microbatch in range(microbatches):
                window = slice(microbatch * size, (microbatch + 1) * size)
                values = tuple(
                    value[window] if isinstance(value, torch.Tensor) else value for value in inputs
                )
                yield values, target[window] if isinstance(target, torch.Tensor) else target

    # as the schedule's scale_grads, which divides the stage modules' gradients only (not loss_fn's),
    # each parameter once: graphkit's stages divide one that several stages share once per step
    chained_full_backward(
        model.stages, model.loss_fn, batches(), (microbatches, replicas) if replicas > 1 else (microbatches,)
    )


def _full_gradient(parameter: torch.Tensor) -> torch.Tensor | None:
    grad = parameter.grad
    if grad is not None and hasattr(grad, "full_tensor"):  # a DTensor shard (FSDP2)
        grad = grad.full_tensor()
    return grad


def _compare(
    result: ParameterVerification,
    grad: torch.Tensor | None,
    reference: torch.Tensor | None,
    microbatches: int,
    hooks: Counter[str],
) -> None:
    result.hooks = (result.hooks or 0) + hooks[result.name]
    if reference is not None:
        result.expected_hooks += microbatches * result.stages
    result.add_step(compare_gradients(result.name, reference, grad, _TOLERANCE))


def _zero(parameters: Any) -> None:
    for parameter in parameters:
        parameter.grad = None


def _sgd(parameters: Any) -> None:
    """``p -= 0.1 * p.grad``, once for each parameter (one held under two names is stepped once)."""
    unique = {id(parameter): parameter for parameter in parameters}
    with torch.no_grad():
        for parameter in unique.values():
            if parameter.grad is not None:
                parameter.sub_(_LEARNING_RATE * parameter.grad)
