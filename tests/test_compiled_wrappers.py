"""torch.compile wrappers (OptimizedModule) in graphkit's stages under the zero-bubble schedules: admitted when
compiled with graphkit's splitting backend (exact against a full backward, over 2 gloo ranks), refused with
graphkit's message for any other backend, and PyTorch's own stages still refused by PyTorch's check."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage as TorchPipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit.pipelining import PipelineStage, compiled_modules
from graphkit.pipelining.compiled_modules import (
    admit_split_compiled_modules,
    check_compiled_stages,
    compiled_backend,
    is_split_compiled,
)
from graphkit.pipelining.launcher import local_process_group, run_on_processes
from graphkit.split.compile_backend import register_backends

ZERO_BUBBLE = ("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV")
WIDTH = 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Chunk(nn.Module):
    """One stage: two blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).pow(2).mean()


def _wrap(chunk: Chunk, how: str, backend: str) -> nn.Module:
    """``how``: "blocks" wraps each block in torch.compile's OptimizedModule, "stage" the whole stage module."""
    if how == "stage":
        return torch.compile(chunk, backend=backend)
    chunk.layers = nn.ModuleList(torch.compile(layer, backend=backend) for layer in chunk.layers)
    return chunk


# -- the private details relied on ---------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ZERO_BUBBLE)
def test_contract_the_zero_bubble_schedules_call_the_module_level_compile_check_by_name(schedule: str):
    cls = getattr(torch_schedules, f"Schedule{schedule}")
    assert "_check_torch_compile_compatibility" in cls.__init__.__code__.co_names, (
        f"torch {torch.__version__}'s {cls.__name__} no longer calls _check_torch_compile_compatibility: "
        "graphkit.pipelining.compiled_modules has nothing to replace"
    )
    assert "stages" in inspect.signature(cls.__init__).parameters
    torch_check = compiled_modules._torch_check or torch_schedules._check_torch_compile_compatibility
    assert tuple(inspect.signature(torch_check).parameters) == ("stages", "schedule_name")


def test_contract_an_optimized_module_shows_its_backend_name_and_function():
    register_backends()
    assert compiled_backend(torch.compile(nn.Linear(2, 2), backend="aot_eager"))[0] == "aot_eager"
    assert compiled_backend(torch.compile(nn.Linear(2, 2)))[0] == "inductor"
    for name in ("graphkit_split", "graphkit_split_eager"):
        wrapped = torch.compile(nn.Linear(2, 2), backend=name)
        assert compiled_backend(wrapped)[0] == name
        assert is_split_compiled(wrapped)
    assert not is_split_compiled(torch.compile(nn.Linear(2, 2), backend="aot_eager"))
    assert not is_split_compiled(nn.Linear(2, 2))


def test_building_a_graphkit_stage_replaces_the_check_once_and_keeps_pytorchs_for_its_stages():
    from graphkit.pipelining.stage import _SplitBackwardStage

    assert admit_split_compiled_modules(_SplitBackwardStage)
    assert admit_split_compiled_modules(_SplitBackwardStage)
    assert torch_schedules._check_torch_compile_compatibility is check_compiled_stages
    with local_process_group():
        compiled = _wrap(Chunk(), "blocks", "graphkit_split_eager")
        torch_stage = TorchPipelineStage(compiled, 0, 2, torch.device("cpu"))
        with pytest.raises(
            RuntimeError, match="not supported with stage modules that have used torch.compile"
        ):
            check_compiled_stages([torch_stage], "ScheduleZBVZeroBubble")


# -- refusals ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("how", "where"), [("blocks", "'layers.0'"), ("stage", "the stage module itself")])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_wrapper_compiled_with_another_backend_is_refused_naming_it_and_the_backend_to_use(
    how: str, where: str, backend: str
):
    with local_process_group():
        stages = [
            PipelineStage(_wrap(Chunk(), how, backend), index, 2, torch.device("cpu")) for index in range(2)
        ]
        with pytest.raises(RuntimeError) as refusal:
            torch_schedules.ScheduleZBVZeroBubble(stages, n_microbatches=2, loss_fn=_loss)
    message = str(refusal.value)
    assert f"{where} " in message and f"backend {backend!r}" in message
    assert 'backend="graphkit_split"' in message and "graphkit_split_eager" in message
    assert "ZBVZeroBubble" in message


# -- exact against a full backward -----------------------------------------------------------------------


def _placement(schedule: str, ranks: int) -> list[list[int]]:
    stages = 2 * ranks
    if schedule in ("ZBVZeroBubble", "DualPipeV"):
        return [[rank, stages - 1 - rank] for rank in range(ranks)]
    return [[rank, rank + ranks] for rank in range(ranks)]


def _full_backward(chunks: list[Chunk], batch: torch.Tensor, target: torch.Tensor, microbatches: int):
    reference = copy.deepcopy(chunks)
    for inputs, targets in zip(batch.chunk(microbatches), target.chunk(microbatches), strict=True):
        output = inputs
        for chunk in reference:
            output = chunk(output)
        (_loss(output, targets) / microbatches).backward()
    return reference


def pipeline_rank(schedule: str, how: str, backend: str, microbatches: int) -> dict[str, float | int]:
    """One rank of a 2-rank pipeline of 4 stages, each wrapped with torch.compile; returns the largest
    relative gradient error against a full backward of the unwrapped model, and the backward counts."""
    import torch.distributed as dist

    register_backends()
    dist.barrier()  # the previous case's messages are all received
    torch._dynamo.reset()
    ranks, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    chunks = [Chunk() for _ in range(2 * ranks)]
    batch, target = torch.randn(2 * microbatches, 8, WIDTH), torch.randn(2 * microbatches, 8, WIDTH)
    reference = _full_backward(chunks, batch, target, microbatches)
    local = _placement(schedule, ranks)[rank]
    wrapped = {index: _wrap(copy.deepcopy(chunks[index]), how, backend) for index in local}
    stages = [PipelineStage(wrapped[index], index, 2 * ranks, torch.device("cpu")) for index in local]
    runner = getattr(torch_schedules, f"Schedule{schedule}")(
        stages, n_microbatches=microbatches, loss_fn=_loss
    )
    is_first = any(stage.is_first for stage in stages)
    is_last = any(stage.is_last for stage in stages)
    runner.step(batch if is_first else None, target=target if is_last else None)
    worst = 0.0
    for index in local:
        expected = dict(reference[index].named_parameters())
        for name, parameter in wrapped[index].named_parameters():
            name = name.replace("_orig_mod.", "")
            assert parameter.grad is not None, f"stage {index}: {name} got no gradient"
            want = expected[name].grad
            error = (parameter.grad - want).abs().max() / want.abs().max().clamp_min(1e-30)
            worst = max(worst, float(error))
    calls = [stage.backward_calls for stage in stages]
    return {
        "error": worst,
        "input": sum(call.input for call in calls),
        "weight": sum(call.weight for call in calls),
    }


def pipeline_cases_rank(cases: list[tuple[str, str]], backend: str) -> list[dict[str, float | int]]:
    """:func:`pipeline_rank` for each (schedule, how) in turn: one start of the ranks for every case."""
    return [pipeline_rank(schedule, how, backend, 4) for schedule, how in cases]


def test_wrapped_blocks_are_exact_under_zbv_in_one_process():
    with local_process_group():
        torch.manual_seed(0)  # one rank holds both stages of the V
        chunks = [Chunk() for _ in range(2)]
        batch, target = torch.randn(4, 8, WIDTH), torch.randn(4, 8, WIDTH)
        reference = _full_backward(chunks, batch, target, 2)
        register_backends()
        wrapped = [_wrap(copy.deepcopy(chunk), "blocks", "graphkit_split_eager") for chunk in chunks]
        stages = [
            PipelineStage(module, index, 2, torch.device("cpu")) for index, module in enumerate(wrapped)
        ]
        runner = torch_schedules.ScheduleZBVZeroBubble(stages, n_microbatches=2, loss_fn=_loss)
        runner.step(batch, target=target)
    for module, expected_chunk in zip(wrapped, reference, strict=True):
        expected = dict(expected_chunk.named_parameters())
        for name, parameter in module.named_parameters():
            assert torch.equal(parameter.grad, expected[name.replace("_orig_mod.", "")].grad), name
    assert stages[1].backward_calls.input > 0 and stages[1].backward_calls.weight > 0


@pytest.mark.slow
def test_wrappers_compiled_with_graphkits_backend_are_exact_under_each_zero_bubble_schedule_on_two_gloo_ranks():
    cases = [(schedule, how) for schedule in ZERO_BUBBLE for how in ("blocks", "stage")]
    per_rank = run_on_processes(
        pipeline_cases_rank, (cases, "graphkit_split_eager"), world_size=2, deadline=400, group_timeout=120
    )
    for rank, results in enumerate(per_rank):
        for case, result in zip(cases, results, strict=True):
            assert result["error"] == 0.0, (rank, case, result)
            assert result["input"] > 0 and result["weight"] > 0, (rank, case, result)
