"""graphkit.pipelining.build_stage: the tracing frontend's stages with graphkit's split, against a full backward.

Each cell is a whole model: the stage modules of tests/pipeline_models.py chained in one module (plus a
parameter shared by every stage, which ``pipeline()`` replicates into each stage), traced and cut with
``pipeline(model, mb_args=..., split_spec=...)`` at every stage boundary
(:func:`graphkit.pipelining.tracing_frontend.trace_pipeline`). All stages run on rank 0 of a
world-size-1 gloo group. The oracle is a second, identically seeded model traced the same way, whose stage
modules run one ordinary full backward per microbatch, chained in one process
(:meth:`~graphkit.pipelining.tracing_frontend.TracedPipeline.full_backward`). Two tests (slow) repeat
a few cells on 2 gloo processes, where V placements put two neighbour stages on one rank. The last tests
run ``verify_pipeline(..., frontend="tracing")`` and ``graphkit verify-pipeline --frontend tracing``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pipeline_models
import pytest
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.pipelining import build_stage as torch_build_stage
from torch.distributed.pipelining.stage import _PipelineStage
from torch_versions import TRACED_WARMUP_ON_ONE_RANK, fixed_in, torch_at_least

import graphkit.pipelining.stage as stage_module
from graphkit.pipelining import (
    PipelineContractError,
    PipelineModel,
    SplitPoint,
    StageChain,
    TracedPipeline,
    TracedPipelineStage,
    build_schedule,
    build_stage,
    load_pipeline_spec,
    pipeline,
    trace_pipeline,
    verify_pipeline,
)
from graphkit.pipelining.schedules import SCHEDULE_NAMES, stage_count
from graphkit.pipelining.stage import _LocalNeighbourWarmup

CPU = torch.device("cpu")
# schedule -> its stages, all on rank 0: two for the V schedules, four for the looped ones
SCHEDULES = {name: stage_count(name, ranks=1, stages_per_rank=4) for name in SCHEDULE_NAMES}
SHARED_ACROSS = "shared_across_stages"
CELLS = (*pipeline_models.CELLS, SHARED_ACROSS)
MICROBATCH_SIZE = 2
LEARNING_RATE = 0.1


pytestmark = pytest.mark.usefixtures("world_of_one")


class ScaledChain(StageChain):
    """``x = stage(x) * scale`` for every stage: one parameter, owned by the whole model, used by every stage.

    ``pipeline()`` copies ``scale`` into each stage (``pipe.replicated_params``).
    """

    def __init__(self, stages: list[nn.Module]) -> None:
        super().__init__(stages)
        self.scale = nn.Parameter(torch.rand(pipeline_models.WIDTH) + 0.5)

    def forward(self, x: Tensor) -> Tensor:
        for stage in self.stages:
            x = stage(x) * self.scale
        return x


class SharedScale(nn.Module):
    """``tanh(linear(x) * shared.scale)``, the ``shared`` submodule registered in every stage."""

    def __init__(self, shared: nn.Module) -> None:
        super().__init__()
        self.linear = nn.Linear(pipeline_models.WIDTH, pipeline_models.WIDTH)
        self.shared = shared

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.linear(x) * self.shared.scale)


def eager(cell: str, num_stages: int, microbatches: int) -> tuple[StageChain, PipelineModel]:
    """The cell's model in float64, built under a fixed seed: the whole model and its pipeline."""
    torch.manual_seed(0)
    model = getattr(pipeline_models, "mlp" if cell == SHARED_ACROSS else cell)(
        num_stages, MICROBATCH_SIZE * microbatches
    )
    whole = (ScaledChain if cell == SHARED_ACROSS else StageChain)(model.stages).double()
    loss_fn = model.loss_fn.double() if isinstance(model.loss_fn, nn.Module) else model.loss_fn
    stages = list(whole.stages)
    return whole, PipelineModel(stages, loss_fn, (model.inputs[0].double(),), model.target.double())


def traced(cell: str, num_stages: int, microbatches: int) -> TracedPipeline:
    """The cell's model traced by ``pipeline()`` and cut into ``num_stages`` stages, one per stage module."""
    whole, model = eager(cell, num_stages, microbatches)
    return trace_pipeline(model, MICROBATCH_SIZE, whole=whole)


class StockWarmedUp(_LocalNeighbourWarmup, _PipelineStage):
    """PyTorch's traced stage with graphkit's warm-up only: one process reaches PyTorch's own I and W."""


@dataclass
class TracedRun:
    error: str | None = None
    mismatched: list[str] = field(default_factory=list)  # parameters whose gradient is not bitwise equal
    silent: list[str] = field(default_factory=list)  # parameters whose hooks did not fire once per microbatch
    backward_calls: Counter[str] = field(default_factory=Counter)
    max_abs_error: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.mismatched and not self.silent


def run_traced(
    cell: str, schedule: str, *, stage: str = "graphkit", microbatches: int = 4, steps: int = 1
) -> TracedRun:
    """Run ``steps`` schedule steps over traced stages and compare every gradient with the oracle.

    ``stage``: ``"graphkit"`` (graphkit's build_stage), ``"torch"`` (PyTorch's build_stage) or
    ``"stock"`` (PyTorch's stage with graphkit's warm-up, so the one-process run reaches its I and W).
    """
    num_stages = SCHEDULES[schedule]
    model, reference = traced(cell, num_stages, microbatches), traced(cell, num_stages, microbatches)
    make = {"graphkit": build_stage, "torch": torch_build_stage, "stock": StockWarmedUp}[stage]
    stages = [make(module, index, model.pipe.info(), CPU) for index, module in enumerate(model.stages)]
    named, reference_named = model.named_parameters(), reference.named_parameters()
    hooks: Counter[str] = Counter()
    handles = [
        parameter.register_post_accumulate_grad_hook(lambda _, name=name: hooks.update([name]))
        for name, parameter in named.items()
    ]
    result = TracedRun()
    try:
        runner = build_schedule(schedule, stages, microbatches, model.loss_fn, ranks=1)
        for _ in range(steps):
            for parameter in [*named.values(), *reference_named.values()]:
                parameter.grad = None
            hooks.clear()
            try:
                runner.step(*model.inputs, target=model.target)
            except Exception as error:  # a failing PyTorch stage is a result
                while error.__cause__ is not None:
                    error = error.__cause__
                result.error = f"{type(error).__name__}: {error}"
                return result
            reference.full_backward(microbatches)
            for name, parameter in named.items():
                grad, expected = parameter.grad, reference_named[name].grad
                if (grad is None) != (expected is None) or (
                    grad is not None and not torch.equal(grad, expected)
                ):
                    result.mismatched.append(name)
                    both = grad is not None and expected is not None
                    error = (grad - expected).abs().max().item() if both else math.inf
                    result.max_abs_error = max(result.max_abs_error, error)
                if hooks[name] != (microbatches if expected is not None else 0):
                    result.silent.append(name)
            with torch.no_grad():
                for parameter in [*named.values(), *reference_named.values()]:
                    if parameter.grad is not None:
                        parameter.sub_(LEARNING_RATE * parameter.grad)
    finally:
        for handle in handles:
            handle.remove()
    for traced_stage in stages:
        calls = getattr(traced_stage, "backward_calls", None)
        if calls is not None:
            result.backward_calls.update(input=calls.input, weight=calls.weight, full=calls.full)
    return result


def expected_calls(schedule: str, microbatches: int, steps: int) -> dict[str, int]:
    """On one rank: an I and a W per microbatch on every stage but stage 0, whose W is a full backward;
    DualPipeV, with both its stages on one rank, runs full backwards only."""
    num_stages = SCHEDULES[schedule]
    runs = microbatches * steps
    if schedule == "DualPipeV":
        return {"input": 0, "weight": 0, "full": num_stages * runs}
    return {"input": (num_stages - 1) * runs, "weight": (num_stages - 1) * runs, "full": runs}


def _cells(schedules: Any, fast_schedules: tuple[str, ...], *marks: Any) -> list:
    """Every cell x schedule; the transformer and the schedules not in ``fast_schedules`` are marked slow."""
    return [
        pytest.param(
            cell,
            schedule,
            marks=[
                *marks,
                *([pytest.mark.slow] if cell == "transformer" or schedule not in fast_schedules else []),
            ],
        )
        for cell in CELLS
        for schedule in schedules
    ]


FAST = ("ZBVZeroBubble", "InterleavedZeroBubble")


@pytest.mark.matrix
@pytest.mark.parametrize(("cell", "schedule"), _cells(SCHEDULES, FAST))
def test_build_stage_is_bitwise_exact_with_hooks_once_per_microbatch(cell: str, schedule: str) -> None:
    result = run_traced(cell, schedule)
    assert result.ok, result
    assert dict(result.backward_calls) == expected_calls(schedule, 4, 1)


@pytest.mark.matrix
@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "InterleavedZeroBubble", "CSV"])
@pytest.mark.parametrize("cell", CELLS)
def test_build_stage_is_exact_over_two_steps_of_eight_microbatches(cell: str, schedule: str) -> None:
    result = run_traced(cell, schedule, microbatches=8, steps=2)
    assert result.ok, result
    assert dict(result.backward_calls) == expected_calls(schedule, 8, 2)


def _stock_cells() -> list:
    reasons = {
        "shared_late": "PyTorch's W: 'Trying to backward through the graph a second time'",
        "view_outputs": "PyTorch's I: 'Can't detach views in-place'",
        "param_only_output": "PyTorch's W: no gradient for a parameter-only output",
        "loss_parameter": "PyTorch's W gives parameters inside loss_fn no gradient",
    }
    hooks = "PyTorch's W never runs AccumulateGrad: post-accumulate-grad hooks stay silent"
    return [
        pytest.param(
            cell,
            schedule,
            marks=[
                pytest.mark.xfail(strict=True, reason=reasons.get(cell, hooks)),
                *([pytest.mark.slow] if cell == "transformer" else []),
            ],
        )
        for cell in CELLS
        for schedule in FAST
    ]


@pytest.mark.matrix
@pytest.mark.parametrize(("cell", "schedule"), _stock_cells())
def test_stock_traced_stage_fails_where_graphkit_is_exact(cell: str, schedule: str) -> None:
    result = run_traced(cell, schedule, stage="stock")
    assert result.ok, result


@fixed_in(
    TRACED_WARMUP_ON_ONE_RANK, "PyTorch's warm-up sends to this rank itself: gloo 'Pair is not connected'"
)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_stock_build_stage_warms_up_stages_on_one_rank(schedule: str) -> None:
    result = run_traced("mlp", schedule, stage="torch")
    assert result.error is None, result.error


def test_stock_results_are_what_the_xfails_say() -> None:
    """The strict xfails above fail for their stated reasons, not for some other error."""
    warm_up = run_traced("mlp", "ZBVZeroBubble", stage="torch")
    if torch_at_least(TRACED_WARMUP_ON_ONE_RANK):
        assert warm_up.error is None, warm_up.error
    else:
        assert "Pair is not connected" in warm_up.error
    assert (
        "backward through the graph a second time"
        in run_traced("shared_late", "ZBVZeroBubble", stage="stock").error
    )
    assert "detach views in-place" in run_traced("view_outputs", "InterleavedZeroBubble", stage="stock").error
    silent = run_traced("mlp", "ZBVZeroBubble", stage="stock")
    assert (
        silent.error is None
        and not silent.mismatched
        and silent.silent
        == [
            "stage1.linear.weight",
            "stage1.linear.bias",
        ]
    )


def test_build_stage_routes_every_i_and_w_action_through_graphkit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The private contract, pinned for the tracing frontend: each I action is one graphkit B, each W one W."""
    calls = Counter()
    real_input, real_weight = stage_module.split_input_gradients, stage_module.backward_weight

    def counting_input(*args: Any, **kwargs: Any) -> Any:
        calls["input"] += 1
        return real_input(*args, **kwargs)

    def counting_weight(*args: Any, **kwargs: Any) -> Any:
        calls["weight"] += 1
        return real_weight(*args, **kwargs)

    monkeypatch.setattr(stage_module, "split_input_gradients", counting_input)
    monkeypatch.setattr(stage_module, "backward_weight", counting_weight)
    for schedule in ("ZBVZeroBubble", "InterleavedZeroBubble", "CSV"):
        calls.clear()
        model = traced("mlp", SCHEDULES[schedule], 4)
        stages = [
            build_stage(module, index, model.pipe.info(), CPU) for index, module in enumerate(model.stages)
        ]
        assert all(
            isinstance(stage, TracedPipelineStage) and isinstance(stage, _PipelineStage) for stage in stages
        )
        build_schedule(schedule, stages, 4, model.loss_fn, ranks=1).step(*model.inputs, target=model.target)
        made = Counter()
        for stage in stages:
            made.update(input=stage.backward_calls.input, weight=stage.backward_calls.weight)
        expected = expected_calls(schedule, 4, 1)
        assert calls == made == {"input": expected["input"], "weight": expected["weight"]}, schedule
        assert expected["input"] > 0


def test_build_stage_checks_the_contract_of_the_tracing_frontends_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[type] = []
    monkeypatch.setattr(stage_module, "check_torch_contract", checked.append)
    model = traced("mlp", 2, 4)
    build_stage(model.stages[0], 0, model.pipe.info(), CPU)
    stage_module.PipelineStage(nn.Linear(2, 2), 0, 2, CPU)
    assert checked == [_PipelineStage, torch.distributed.pipelining.PipelineStage]

    def broken(base: type) -> None:
        raise PipelineContractError(f"graphkit's pipeline stage cannot plug into {base.__qualname__}")

    monkeypatch.setattr(stage_module, "check_torch_contract", broken)
    with pytest.raises(PipelineContractError, match="_PipelineStage"):
        build_stage(model.stages[1], 1, model.pipe.info(), CPU)


def test_the_installed_tracing_frontend_keeps_the_contract() -> None:
    from graphkit.pipelining import check_torch_contract

    check_torch_contract(_PipelineStage)
    assert _PipelineStage.backward_one_chunk is _PipelineStage.__mro__[1].backward_one_chunk  # inherited


def test_build_stage_takes_the_arguments_of_pytorchs() -> None:
    import inspect

    ours, theirs = inspect.signature(build_stage), inspect.signature(torch_build_stage)
    assert list(ours.parameters) == list(theirs.parameters)
    assert [parameter.default for parameter in ours.parameters.values()] == [
        parameter.default for parameter in theirs.parameters.values()
    ]


def test_build_stage_rejects_a_ddp_stage_module_clearly() -> None:
    model = traced("mlp", 2, 4)
    wrapped = nn.parallel.DistributedDataParallel(model.stages[0])
    with pytest.raises(ValueError, match="fx graph"):
        build_stage(wrapped, 0, model.pipe.info(), CPU)


def test_a_parameter_shared_across_stages_is_replicated_and_its_copies_sum_to_the_eager_gradient() -> None:
    """pipeline() copies a parameter used by several stages into each; each copy gets its stage's share
    (checked bitwise above), and the copies add up to the untraced model's gradient."""
    microbatches = 4
    model = traced(SHARED_ACROSS, 2, microbatches)
    assert model.pipe.replicated_params == [{"submod_pp_0": "scale", "submod_pp_1": "scale"}]
    stages = [build_stage(module, index, model.pipe.info(), CPU) for index, module in enumerate(model.stages)]
    build_schedule("ZBVZeroBubble", stages, microbatches, model.loss_fn, ranks=1).step(
        *model.inputs, target=model.target
    )
    copies = [dict(module.named_parameters())["scale"] for module in model.stages]
    assert copies[0] is not copies[1]
    untraced, pipeline_model = eager(SHARED_ACROSS, 2, microbatches)
    (inputs,), target = pipeline_model.inputs, pipeline_model.target
    for microbatch in range(microbatches):
        window = slice(microbatch * MICROBATCH_SIZE, (microbatch + 1) * MICROBATCH_SIZE)
        pipeline_model.loss_fn(untraced(inputs[window]), target[window]).backward()
    expected = untraced.scale.grad / microbatches
    torch.testing.assert_close(copies[0].grad + copies[1].grad, expected, rtol=1e-14, atol=0)


def test_pipeline_traces_a_custom_functions_forward_only_and_drops_checkpointing() -> None:
    """What torch.export makes of two cells: the traced stage holds neither the custom autograd.Function
    (its forward is inlined as ATen ops; autograd differentiates those, not the Function's backward) nor
    the checkpoint (the block is traced as ordinary ops, whose activations are saved)."""
    custom = traced("custom_function", 2, 4)
    stage = custom.stages[0]
    targets = [
        str(node.target)
        for module in stage.modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    ]
    assert "aten.mul.Tensor" in targets and not any(
        "ScaleAndShift" in target or "autograd_function" in target for target in targets
    )
    checkpointed = traced("checkpointed", 2, 4)
    targets = [
        str(node.target)
        for module in checkpointed.stages[0].modules()
        if hasattr(module, "graph")
        for node in module.graph.nodes
    ]
    assert not any("checkpoint" in target for target in targets)


@pytest.mark.xfail(
    strict=True,
    reason="pipeline(): 'Child module 'linear' is not a descendant of parent module 'stages.1'' "
    "(torch.export's unflattening does not take a submodule registered in two stages)",
)
def test_pipeline_traces_a_submodule_registered_in_two_stages() -> None:
    shared = pipeline_models._Holder()
    model = StageChain([SharedScale(shared) for _ in range(2)]).double()
    inputs = torch.randn(MICROBATCH_SIZE, pipeline_models.WIDTH, dtype=torch.float64)
    pipeline(model, mb_args=(inputs,), split_spec={"stages.1": SplitPoint.BEGINNING})


def across_ranks(cases: list[tuple[str, str]], stage: str) -> list[str]:
    """On each of 2 gloo ranks: run every (cell, schedule) case; this rank's verdict for each."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    make = {"graphkit": build_stage, "torch": torch_build_stage}[stage]
    verdicts = []
    for cell, schedule in cases:
        num_stages = 2 * ranks
        model, reference = traced(cell, num_stages, 4), traced(cell, num_stages, 4)
        v_shaped = schedule in ("ZBVZeroBubble", "DualPipeV")
        indices = sorted({rank, num_stages - 1 - rank}) if v_shaped else [rank, rank + ranks]
        stages = [make(model.stages[index], index, model.pipe.info(), CPU) for index in indices]
        runner = build_schedule(schedule, stages, 4, model.loss_fn, ranks=ranks)
        try:
            runner.step(*(model.inputs if rank == 0 else ()), target=model.target)
        except Exception as error:
            verdicts.append(f"{type(error).__name__}: {error}")
            break  # the process group may be broken: later cases would wait on it
        reference.full_backward(4)
        mismatched = [
            f"stage{index}.{name}"
            for index in indices
            for (name, parameter), (_, expected) in zip(
                model.stages[index].named_parameters(),
                reference.stages[index].named_parameters(),
                strict=True,
            )
            if (parameter.grad is None) != (expected.grad is None)
            or (parameter.grad is not None and not torch.equal(parameter.grad, expected.grad))
        ]
        verdicts.append("exact" if not mismatched else f"gradients differ: {mismatched}")
    return verdicts


CROSS_PROCESS_CELLS = ("mlp", "shared_late", "view_outputs", "param_only_output", SHARED_ACROSS)


@pytest.mark.slow
def test_across_two_gloo_processes_build_stage_is_exact_also_on_v_placements() -> None:
    """One spawn: 2 ranks x 2 stages each; V placements put stages 1 and 2 on one rank (local warm-up)."""
    from graphkit.pipelining.launcher import run_on_processes

    cases = [
        (cell, schedule)
        for cell in CROSS_PROCESS_CELLS
        for schedule in ("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV")
    ]
    per_rank = run_on_processes(across_ranks, (cases, "graphkit"), world_size=2, deadline=240)
    assert per_rank == [["exact"] * len(cases)] * 2


@pytest.mark.slow
def test_across_two_gloo_processes_stock_build_stage_fails_on_a_v_placement() -> None:
    from graphkit.pipelining.launcher import run_on_processes

    per_rank = run_on_processes(
        across_ranks, ([("mlp", "ZBVZeroBubble")], "torch"), world_size=2, deadline=120
    )
    if torch_at_least(TRACED_WARMUP_ON_ONE_RANK):  # PyTorch's warm-up no longer sends to its own rank
        assert per_rank == [["exact"], ["exact"]]
    else:
        assert any("Pair is not connected" in verdicts[0] for verdicts in per_rank), per_rank
    per_rank = run_on_processes(
        across_ranks, ([("mlp", "InterleavedZeroBubble")], "torch"), world_size=2, deadline=120
    )
    assert per_rank == [["exact"], ["exact"]]  # no two neighbour stages on one rank: PyTorch's warm-up works


# --- verify_pipeline and graphkit verify-pipeline with the tracing frontend -----------------------------------
def spec(cell: str) -> str:
    return f"{pipeline_models.__file__}:{cell}"


def untraced_names(pipeline_spec: str, num_stages: int) -> set[str]:
    """``stage{i}.{name}`` of every parameter of the spec's stage modules (one held by several: the first)."""
    model = load_pipeline_spec(pipeline_spec, num_stages=num_stages, batch_size=8, seed=0)
    names, seen = set(), set()
    for index, stage in enumerate(model.stages):
        for name, parameter in stage.named_parameters():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                names.add(f"stage{index}.{name}")
    if isinstance(model.loss_fn, nn.Module):
        names |= {f"loss_fn.{name}" for name, _ in model.loss_fn.named_parameters()}
    return names


@pytest.mark.parametrize(
    "cell",
    [
        pytest.param(cell, marks=[pytest.mark.slow] if cell == "transformer" else [])
        for cell in (*pipeline_models.CELLS, "shared_across_stages")
    ],
)
def test_check_pipeline_with_the_tracing_frontend_is_exact_against_the_traced_and_untraced_models(
    cell: str,
) -> None:
    result = verify_pipeline(
        spec(cell), schedule="ZBVZeroBubble", microbatches=4, steps=2, frontend="tracing"
    )
    assert result.ok and result.exact and result.error is None, result.error or result.table()
    assert result.case.frontend == "tracing"
    for (
        parameter
    ) in result.parameters:  # one hook call per microbatch and step; 0: a copy its stage leaves unused
        assert parameter.hooks == parameter.expected_hooks in (0, 8), result.table()
    assert {check.name for check in result.untraced} == untraced_names(spec(cell), 2)
    # tracing changes the untraced gradients by rounding at most (a custom Function traced as ATen
    # operations; a replicated parameter's copies summed in another order than autograd adds them)
    assert all(check.relative_error <= 1e-14 for check in result.untraced), result.table(untraced=True)
    if cell not in ("custom_function", "shared_across_stages"):
        assert result.untraced_exact, result.table(untraced=True)
    assert result.backward_calls == {"input": 8, "weight": 8, "full": 8}


def test_the_copies_pipeline_makes_of_a_parameter_sum_to_its_untraced_gradient_over_two_steps() -> None:
    """Four stages on one rank; every copy gets its own stage's share, and before the SGD step their sum."""
    result = verify_pipeline(
        spec("shared_across_stages"),
        schedule="InterleavedZeroBubble",
        microbatches=4,
        steps=2,
        stages_per_rank=4,
        frontend="tracing",
    )
    assert result.ok, result.error or result.table()
    (copies,) = result.replicated.values()
    assert list(result.replicated) == ["stage0.scale"]
    assert {"stage0.scale", "stage1.scale", "stage2.scale", "stage3.scale"} <= set(copies)
    used = {check.name: check for check in result.parameters if check.expected_hooks}
    assert all(used[f"stage{index}.scale"].hooks == 8 for index in range(4))
    (scale,) = [check for check in result.untraced if check.name == "stage0.scale"]
    assert 0 <= scale.relative_error <= 1e-14


def test_a_trace_that_changes_the_gradients_fails_the_check_though_the_split_is_exact() -> None:
    """A straight-through estimator: pipeline() traces round(), whose derivative is zero."""
    result = verify_pipeline(spec("straight_through"), microbatches=4, frontend="tracing")
    assert result.exact and result.hooks_ok  # the split matches the traced model bit for bit
    assert not result.untraced_ok and not result.ok
    assert all(check.relative_error == pytest.approx(1.0) for check in result.untraced)
    manual = verify_pipeline(spec("straight_through"), microbatches=4)
    assert manual.ok and manual.exact  # the manual frontend runs the Function's own backward


def test_a_spec_that_pipeline_cannot_trace_is_refused_with_its_reason() -> None:
    from graphkit.pipelining import PipelineTracingError

    for ranks in (1, 2):  # with 2 the parent traces first: no process is spawned
        with pytest.raises(PipelineTracingError, match="cannot trace .*shared_submodule.* not a descendant"):
            verify_pipeline(spec("shared_submodule"), ranks=ranks, frontend="tracing")
    with pytest.raises(ValueError, match="without data parallelism"):
        verify_pipeline(spec("mlp"), ranks=2, data_parallel="ddp", frontend="tracing")
    with pytest.raises(ValueError, match="frontend must be 'manual' or 'tracing'"):
        verify_pipeline(spec("mlp"), frontend="traced")


def test_gpt2_cut_into_two_stages_traces_and_checks_exactly_in_one_process() -> None:
    pytest.importorskip("transformers")
    result = verify_pipeline(
        "hf:gpt2?n_layer=2", schedule="ZBVZeroBubble", microbatches=4, frontend="tracing"
    )
    assert result.ok and result.exact and result.untraced_exact, result.error or result.table()
    names = {check.name for check in result.parameters}
    assert {"stage0.wte.weight", "stage1.lm_head.weight"} <= names
    assert names == {check.name for check in result.untraced}


def test_verify_pipeline_frontend_tracing_exits_0_exact_1_not_exact_2_bad_input(
    capsys: pytest.CaptureFixture,
) -> None:
    import json

    from graphkit.cli import main

    with pytest.raises(SystemExit):
        main(["verify-pipeline", "--help"])
    assert "--frontend {manual,tracing}" in capsys.readouterr().out
    command = ["verify-pipeline", spec("shared_across_stages"), "--frontend", "tracing", "--steps", "2"]
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "tracing frontend" in out and "stage0.stages.1.scale" in out
    assert "pipeline() copied stage0.scale into 3 stage-module parameters" in out
    assert out.strip().splitlines()[-1].startswith("exact: every gradient equals the traced model's")
    assert main([*command, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["frontend"] == "tracing" and payload["ok"] and payload["exact"]
    assert payload["replicated"] == {
        "stage0.scale": ["stage0.scale", "stage0.stages.1.scale", "stage1.scale"]
    }
    assert {parameter["name"] for parameter in payload["untraced"]} == untraced_names(
        spec("shared_across_stages"), 2
    )

    assert main(["verify-pipeline", spec("straight_through"), "--frontend", "tracing"]) == 1
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("NOT exact: pipeline() changed 4 of 4 gradients beyond 1e-10")
    assert main(["verify-pipeline", spec("straight_through")]) == 0  # the manual frontend
    capsys.readouterr()
    assert main(["verify-pipeline", "zoo-pipeline:mlp", "--frontend", "tracing", "--stage", "torch"]) == 1
    out = capsys.readouterr().out
    if torch_at_least(TRACED_WARMUP_ON_ONE_RANK):  # PyTorch's stage runs; its W leaves the hooks silent
        assert "NOT exact: post-accumulate-grad hooks did not fire once per microbatch" in out
    else:
        assert "Pair is not connected" in out and "graphkit's build_stage leaves those sends out" in out
    assert main(["verify-pipeline", spec("shared_submodule"), "--frontend", "tracing"]) == 2
    assert "pipeline() cannot trace" in capsys.readouterr().err
    assert main(["verify-pipeline", spec("mlp"), "--frontend", "tracing", "--ranks", "2", "--ddp"]) == 2
    assert "without data parallelism" in capsys.readouterr().err


def test_copies_of_a_parameter_on_two_gloo_processes_are_summed_across_them() -> None:
    """2 ranks x 2 stages (V: stages 0 and 3 on rank 0, 1 and 2 on rank 1), two steps; each rank sums
    the copies of both (all_gather_object) before comparing with the untraced model and stepping."""
    result = verify_pipeline(
        spec("shared_across_stages"), microbatches=4, steps=2, ranks=2, deadline=120, frontend="tracing"
    )
    assert result.ok and result.exact and result.ranks == 2, result.error or result.table()
    (copies,) = result.replicated.values()
    assert {f"stage{index}.scale" for index in range(4)} <= set(copies)
    assert {check.name for check in result.untraced} == untraced_names(spec("shared_across_stages"), 4)
    assert all(check.relative_error <= 1e-14 for check in result.untraced)
    assert all(check.hooks == check.expected_hooks for check in result.parameters)


@pytest.mark.slow
def test_check_pipeline_with_the_tracing_frontend_across_two_gloo_processes() -> None:
    """One spawn: a V placement (stages 1 and 2 on one rank), a view output, a parameter-only output,
    loss_fn's parameters, every schedule."""
    from graphkit.pipelining import PipelineCase, verify_cases

    cases = [
        PipelineCase(spec("view_outputs"), "InterleavedZeroBubble", 4, 2, frontend="tracing"),
        PipelineCase(spec("param_only_output"), "DualPipeV", 4, 1, frontend="tracing"),
        PipelineCase(spec("loss_parameter"), "CSV", 4, 1, frontend="tracing"),
        PipelineCase(spec("tied"), "ZBVZeroBubble", 8, 2, frontend="tracing"),
        PipelineCase("zoo-pipeline:mlp", "ZBVZeroBubble", 4, 1, frontend="tracing"),
    ]
    results = verify_cases(cases, ranks=2, deadline=240)
    for result in results:
        assert result.ok and result.exact, (result.case.spec, result.error, result.table())
        assert result.ranks == 2 and result.untraced_exact
        assert {check.name for check in result.untraced} == untraced_names(result.case.spec, 4)


@pytest.mark.slow
def test_verify_pipeline_checks_gpt2_traced_across_two_processes(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("transformers")
    from graphkit.cli import main

    command = ["verify-pipeline", "hf:gpt2?n_layer=4", "--frontend", "tracing", "--ranks", "2"]
    assert main([*command, "--schedule", "DualPipeV", "--timeout", "240"]) == 0
    out = capsys.readouterr().out
    assert "2 processes" in out and "stage3.lm_head.weight" in out and "the untraced model's too" in out
