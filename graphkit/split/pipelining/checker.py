"""``check_pipeline``: one real schedule step against a single-process full backward, parameter by parameter.

The check builds the pipeline twice from its spec (:mod:`graphkit.models.pipeline_specs`, under a fixed
seed, so both copies and every rank hold the same weights, in float64 by default). The first copy runs the
schedule: its stages become ``PipelineStage`` objects (graphkit's, or PyTorch's for comparison) on a
pipeline process group - all on this process by default (a world-size-1 gloo group), or spread over ``ranks``
local processes (:mod:`graphkit.split.pipelining.launcher`). The second copy runs an ordinary full backward,
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

With ``timeline=True`` the last step is recorded on every rank by
:class:`graphkit.split.schedule_recording.ScheduleRecorder` (every F, I, W, B, send and receive) and returned
as a :class:`~graphkit.split.schedule_recording.ScheduleTimeline` (``graphkit verify-pipeline --timeline``
draws it with :mod:`graphkit.drawing.timeline`).

Between steps both copies take the same plain SGD step (``p -= 0.1 * grad``), so a second step starts from
weights that a first step changed, with gradients cleared.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ParameterCheck", "PipelineCheck", "PipelineCase", "check_pipeline", "run_cases"]

_TOLERANCE = 1e-10
_LEARNING_RATE = 0.1


@dataclass(slots=True, frozen=True)
class PipelineCase:
    """One schedule run to check: which pipeline, schedule, microbatch count and number of steps.

    ``stage`` is ``"graphkit"`` (graphkit's :class:`~graphkit.split.pipelining.stage.PipelineStage`) or
    ``"torch"`` (``torch.distributed.pipelining.PipelineStage``, for comparison). ``stages_per_rank`` other
    than 2 suits ``InterleavedZeroBubble`` and ``CSV`` only. ``record_timeline``: record the last step.
    """

    spec: Any
    schedule: str = "ZBVZeroBubble"
    microbatches: int = 4
    steps: int = 1
    stage: str = "graphkit"
    data_parallel: str | None = None
    stages_per_rank: int = 2
    record_timeline: bool = False


@dataclass(slots=True)
class ParameterCheck:
    """One parameter's gradient against the full backward's.

    Attributes:
        name: ``stage{i}.{parameter name}`` or ``loss_fn.{name}``.
        max_abs_error: largest absolute difference over all steps (``inf`` when one side has no gradient).
        relative_error: largest ``||grad - reference|| / ||reference||`` over all steps.
        bitwise: whether every step's gradient equals the reference bit for bit.
        hooks: post-accumulate-grad hook calls over all steps (None where hooks are not counted: FSDP2).
        expected_hooks: microbatches x steps (x ``stages``) for a parameter that gets a gradient, else 0.
        stages: the stages on this rank that hold the parameter (tied weights): above 1, its gradient
            sums their contributions in the schedule's order, so the run passes within ``1e-10``
            relative (not bit for bit), and its hooks fire once per stage and microbatch.
    """

    name: str
    max_abs_error: float = 0.0
    relative_error: float = 0.0
    bitwise: bool = True
    hooks: int | None = 0
    expected_hooks: int = 0
    stages: int = 1


@dataclass(slots=True)
class PipelineCheck:
    """The result of one checked schedule run (see :func:`check_pipeline`).

    ``passed`` is True when the step ran, every gradient matches (bit for bit without data parallelism or
    shared parameters, within ``1e-10`` relative with them) and every counted hook fired once per
    microbatch (and stage holding it). ``timeline``: the
    recorded last step on every rank (a :class:`~graphkit.split.schedule_recording.ScheduleTimeline`), when
    asked for and the step ran.
    """

    case: PipelineCase
    ranks: int
    parameters: list[ParameterCheck] = field(default_factory=list)
    error: str | None = None
    backward_calls: dict[str, int] = field(default_factory=dict)
    timeline: Any = None

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
    def passed(self) -> bool:
        """Whether the run is correct: exact with hooks once each (within ``1e-10`` relative with data
        parallelism, or when stages on one rank share a parameter: its sum's rounding spreads to the
        other parameters from the second step on)."""
        if self.error is not None or not self.parameters or not self.hooks_ok:
            return False
        if self.case.data_parallel is None and all(check.stages == 1 for check in self.parameters):
            return self.exact
        return all(check.relative_error <= _TOLERANCE for check in self.parameters)

    @property
    def max_relative_error(self) -> float:
        """The largest relative error over all parameters (``inf`` when the step failed)."""
        if self.error is not None or not self.parameters:
            return math.inf
        return max(check.relative_error for check in self.parameters)

    def table(self) -> str:
        """A per-parameter text table: errors, bitwise equality and hook counts."""
        rows = [("parameter", "max abs error", "relative error", "bitwise", "hooks")]
        for check in self.parameters:
            hooks = "n/a" if check.hooks is None else f"{check.hooks}/{check.expected_hooks}"
            rows.append(
                (
                    check.name,
                    f"{check.max_abs_error:.3g}",
                    f"{check.relative_error:.3g}",
                    "yes" if check.bitwise else "no",
                    hooks,
                )
            )
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.insert(1, "  ".join("-" * width for width in widths))
        return "\n".join(lines)


def check_pipeline(
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
) -> PipelineCheck:
    """Run a real pipeline schedule step and compare every parameter's gradient with a full backward.

    Args:
        spec: a pipeline spec (``path/to/file.py:function``, ``module:function``, ``zoo-pipeline:NAME``,
            ``hf:gpt2?...``, ``hf:llama?...``) or a function returning a
            :class:`~graphkit.models.pipeline_specs.PipelineModel`;
            see :mod:`graphkit.models.pipeline_specs`. It is built with ``stages_per_rank x pipeline ranks``
            stages and a batch of 2 rows per microbatch per replica. A function must be importable by name
            when ``ranks > 1``.
        schedule: ``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``, ``CSV`` or ``csv:PATH``
            (:mod:`graphkit.split.pipelining.schedules`); every schedule puts two stages on each pipeline rank.
        microbatches: microbatches per step (the batch is split evenly).
        steps: schedule steps, with an SGD step in between.
        ranks: processes; 1 runs every stage in this process (a world-size-1 gloo group, unless a default
            process group already exists, whose ranks are then used as they are).
        data_parallel: None, ``"ddp"`` (each stage module in ``DistributedDataParallel``) or ``"fsdp"``
            (``fully_shard``): then ``ranks`` must be even, ``ranks // 2`` pipeline ranks x 2 replicas.
        stage: ``"graphkit"`` or ``"torch"`` (PyTorch's own stage, to compare).
        stages_per_rank: stages on each pipeline rank (2; any number for ``InterleavedZeroBubble`` and ``CSV``).
        deadline: seconds before spawned processes are ended (``ranks > 1``).
        timeline: record the last step on every rank (:attr:`PipelineCheck.timeline`).

    Returns:
        A :class:`PipelineCheck`; ``error`` holds the exception text when the schedule step itself raised.

    Raises:
        ValueError: an unknown schedule, stage or data_parallel, or ``ranks`` that do not fit it.
        graphkit.models.specs.SpecError: a bad pipeline spec.
        graphkit.split.pipelining.launcher.LaunchError: a spawned process failed outside the step, or the
            deadline passed.
    """
    case = PipelineCase(spec, schedule, microbatches, steps, stage, data_parallel, stages_per_rank, timeline)
    return run_cases([case], ranks=ranks, deadline=deadline)[0]


def run_cases(cases: list[PipelineCase], *, ranks: int = 1, deadline: float = 120.0) -> list[PipelineCheck]:
    """Check several cases on one process group (one spawn of ``ranks`` processes for all of them).

    Raises:
        as :func:`check_pipeline`.
    """
    for case in cases:
        _validate(case, ranks)
    if ranks == 1 or (dist.is_initialized() and dist.get_world_size() == ranks):
        with _local_group():
            return _run_rank(cases)
    from graphkit.split.pipelining.launcher import run_on_processes

    per_rank = run_on_processes(_run_rank, (cases,), world_size=ranks, deadline=deadline)
    return [_merge([checks[index] for checks in per_rank]) for index in range(len(cases))]


def _validate(case: PipelineCase, ranks: int) -> None:
    from graphkit.split.pipelining.schedules import stage_indices

    stage_indices(case.schedule, 0, 1, case.stages_per_rank)  # an unknown schedule or placement raises
    if case.stage not in ("graphkit", "torch"):
        raise ValueError(f"stage must be 'graphkit' or 'torch', got {case.stage!r}")
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


@contextmanager
def _local_group() -> Iterator[None]:
    """A world-size-1 gloo process group (no ports: a HashStore) for the duration, unless one exists."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def _merge(checks: list[PipelineCheck]) -> PipelineCheck:
    merged = PipelineCheck(checks[0].case, len(checks))
    errors = [check.error for check in checks if check.error is not None]
    # a rank whose peer failed reports a closed connection: name the peer's own error first
    errors.sort(key=lambda error: "Connection closed" in error or error.startswith("not run"))
    merged.error = errors[0] if errors else None
    seen: set[str] = set()
    for check in checks:
        for parameter in check.parameters:
            if parameter.name not in seen:  # replicas report the same parameters: keep the first
                seen.add(parameter.name)
                merged.parameters.append(parameter)
        for kind, count in check.backward_calls.items():
            merged.backward_calls[kind] = merged.backward_calls.get(kind, 0) + count
    if all(check.timeline is not None for check in checks):
        from graphkit.split.schedule_recording import ScheduleTimeline

        first = checks[0].timeline
        ranks = sorted(
            (rank for check in checks for rank in check.timeline.ranks), key=lambda rank: rank.rank
        )
        merged.timeline = ScheduleTimeline(
            first.schedule, first.microbatches, first.num_stages, ranks, first.device, first.memory_method
        )
    merged.parameters.sort(key=lambda parameter: _sort_key(parameter.name))
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


def _run_rank(cases: list[PipelineCase]) -> list[PipelineCheck]:
    results: list[PipelineCheck] = []
    for case in cases:
        results.append(_run_case(case))
        if results[-1].error is not None and dist.get_world_size() > 1:
            # the other ranks may wait on this one: later cases would deadlock, so report them as not run
            for rest in cases[len(results) :]:
                results.append(
                    PipelineCheck(rest, dist.get_world_size(), error="not run: an earlier case failed")
                )
            break
    return results


def _build(case: PipelineCase, num_stages: int, batch_size: int) -> Any:
    from graphkit.models.pipeline_specs import load_pipeline_spec

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


def _run_case(case: PipelineCase) -> PipelineCheck:
    from graphkit.split.pipelining.schedules import build_schedule, stage_count, stage_indices

    mesh = _mesh(case.data_parallel)
    num_stages = stage_count(case.schedule, mesh.pipeline_size, case.stages_per_rank)
    per_replica = 2 * case.microbatches
    batch_size = per_replica * mesh.replicas
    pipeline = _build(case, num_stages, batch_size)
    reference = _build(case, num_stages, batch_size)
    if pipeline.inputs and pipeline.inputs[0].shape[0] % (case.microbatches * mesh.replicas):
        raise ValueError(
            f"the batch ({pipeline.inputs[0].shape[0]}) does not split into {case.microbatches} equal "
            f"microbatches per replica x {mesh.replicas}; declare batch_size in the spec function"
        )
    indices = stage_indices(case.schedule, mesh.pipeline_rank, mesh.pipeline_size, case.stages_per_rank)
    check = PipelineCheck(case, dist.get_world_size())
    stages = [_make_stage(case, mesh, pipeline.stages[index], index, num_stages) for index in indices]
    named = _named_parameters(pipeline, indices, num_stages)  # after wrapping: FSDP2 swaps in shards
    reference_named = _named_parameters(reference, indices, num_stages)
    reference_all = _named_parameters(reference, list(range(num_stages)), num_stages)
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
            case.schedule, stages, case.microbatches, pipeline.loss_fn, ranks=mesh.pipeline_size
        )
        holders = Counter(id(parameter) for name, parameter in named.items() if name.startswith("stage"))
        results = {
            name: ParameterCheck(name, stages=max(1, holders[id(parameter)]))
            for name, parameter in named.items()
        }
        for step in range(case.steps):
            _zero(named.values())
            _zero(reference_all.values())
            inputs, target = _replica_batch(pipeline, mesh.replica, per_replica)
            try:
                if case.record_timeline and step == case.steps - 1:
                    check.timeline = _recorded_step(schedule, stages, inputs, target, mesh, num_stages, case)
                else:
                    schedule.step(*inputs, target=target)
            except Exception as error:  # a failing PyTorch stage is a result, not a crash of the check
                check.error = f"{type(error).__name__}: {_root_message(error)}"
                break
            _reference_backward(reference, case.microbatches, per_replica, mesh.replicas)
            grads = {name: _full_gradient(parameter) for name, parameter in named.items()}
            for name, result in results.items():
                _compare(result, grads[name], reference_named[name].grad, case.microbatches, hooks)
            hooks.clear()
            _sgd(named.values())
            _sgd(reference_all.values())
        check.parameters = list(results.values())
        if not count_hooks:
            for result in check.parameters:
                result.hooks = None
    finally:
        for handle in handles:
            handle.remove()
    for stage in stages:
        calls = getattr(stage, "backward_calls", None)
        if calls is not None:
            for kind in ("input", "weight", "full"):
                check.backward_calls[kind] = check.backward_calls.get(kind, 0) + getattr(calls, kind)
    return check


def _recorded_step(
    schedule: Any,
    stages: list[Any],
    inputs: tuple[Any, ...],
    target: Any,
    mesh: _Mesh,
    num_stages: int,
    case: Any,
) -> Any:
    """Run one step under :class:`~graphkit.split.schedule_recording.ScheduleRecorder`; this rank's timeline."""
    from graphkit.split.schedule_recording import ScheduleTimeline, memory_probe, record_rank_step

    probe, method = memory_probe(torch.device("cpu"))
    dist.barrier()  # every rank's time zero at the same moment
    rank = record_rank_step(
        schedule, stages, lambda: schedule.step(*inputs, target=target), mesh.pipeline_rank, "cpu", probe
    )
    rank.rank = dist.get_rank()
    return ScheduleTimeline(type(schedule).__name__, case.microbatches, num_stages, [rank], "cpu", method)


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
    if case.stage == "graphkit":
        from graphkit.split.pipelining.stage import PipelineStage
    else:
        from torch.distributed.pipelining import PipelineStage
    return PipelineStage(module, index, num_stages, torch.device("cpu"), group=mesh.pipeline_group)


def _replica_batch(model: Any, replica: int, per_replica: int) -> tuple[tuple[Any, ...], Any]:
    window = slice(replica * per_replica, (replica + 1) * per_replica)
    inputs = tuple(value[window] if isinstance(value, torch.Tensor) else value for value in model.inputs)
    target = model.target[window] if isinstance(model.target, torch.Tensor) else model.target
    return inputs, target


def _reference_backward(model: Any, microbatches: int, per_replica: int, replicas: int) -> None:
    """Full backward over every replica's microbatches, in the schedule's order; scaled like the schedule."""
    size = per_replica // microbatches
    for replica in range(replicas):
        inputs, target = _replica_batch(model, replica, per_replica)
        for microbatch in range(microbatches):
            window = slice(microbatch * size, (microbatch + 1) * size)
            values = tuple(value[window] if isinstance(value, torch.Tensor) else value for value in inputs)
            for stage in model.stages:
                output = stage(*values)
                values = output if isinstance(output, tuple) else (output,)
            chunk = target[window] if isinstance(target, torch.Tensor) else target
            model.loss_fn(values[0] if len(values) == 1 else values, chunk).backward()
    # as the schedule's scale_grads, which divides the stage modules' gradients only (not loss_fn's),
    # each parameter once: graphkit's stages divide one that several stages share once per step
    parameters = list({id(p): p for stage in model.stages for p in stage.parameters()}.values())
    with torch.no_grad():
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.grad.div_(microbatches)
                if replicas > 1:
                    parameter.grad.div_(replicas)


def _full_gradient(parameter: torch.Tensor) -> torch.Tensor | None:
    grad = parameter.grad
    if grad is not None and hasattr(grad, "full_tensor"):  # a DTensor shard (FSDP2)
        grad = grad.full_tensor()
    return grad


def _compare(
    result: ParameterCheck,
    grad: torch.Tensor | None,
    reference: torch.Tensor | None,
    microbatches: int,
    hooks: Counter[str],
) -> None:
    result.hooks = (result.hooks or 0) + hooks[result.name]
    if reference is not None:
        result.expected_hooks += microbatches * result.stages
    if grad is None and reference is None:
        return
    if grad is None or reference is None or grad.shape != reference.shape:
        result.bitwise = False
        result.max_abs_error = math.inf
        result.relative_error = math.inf
        return
    difference = (grad.detach().double() - reference.detach().double()).abs()
    scale = reference.detach().double().norm().item()
    relative = (
        difference.norm().item() / scale if scale else (0.0 if difference.max().item() == 0 else math.inf)
    )
    result.max_abs_error = max(result.max_abs_error, difference.max().item() if difference.numel() else 0.0)
    result.relative_error = max(result.relative_error, relative)
    result.bitwise = result.bitwise and torch.equal(grad, reference)


def _zero(parameters: Any) -> None:
    for parameter in parameters:
        parameter.grad = None


def _sgd(parameters: Any) -> None:
    with torch.no_grad():
        for parameter in parameters:
            if parameter.grad is not None:
                parameter.sub_(_LEARNING_RATE * parameter.grad)
