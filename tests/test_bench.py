"""The split benchmark's non-timing measurements: FLOPs, engine calls and the memory kept between B and W."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from graphkit.graph.tensors import GraphkitInputError
from graphkit.measure.benchmark import (
    SplitBenchmark,
    account_split_time,
    benchmark_split,
    count_engine_calls,
)
from graphkit.models import zoo


def _bench_script(name: str) -> ModuleType:
    """The script ``bench/<name>.py``, loaded as a module (the bench folder is no package)."""
    path = Path(__file__).resolve().parent.parent / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # as an import does: dataclasses look their module up there
    spec.loader.exec_module(bench)
    return bench


def test_engine_call_counter_counts_backward_and_grad():
    x = torch.randn(3, requires_grad=True)
    with count_engine_calls() as calls:
        (x * 2).sum().backward()
        torch.autograd.grad((x * 3).sum(), x)
    assert calls[0] == 2


def test_split_benchmark_measures_flops_calls_and_memory():
    module, inputs = zoo.build("gpt_stage")
    result = benchmark_split(module, inputs, repeat=1, warmup=0)
    assert result.flops["b"] + result.flops["w"] == result.flops["full"] > 0
    assert result.w_engine_calls == 1
    # every intermediate of gpt_stage has a weight-side formula: the state keeps exactly what W needs
    assert result.retained_bytes == result.w_needs_bytes > 0
    assert result.extra["pytorch_w_engine_calls"] == result.extra["intermediates"]
    assert result.extra["b_engine_s"] > 0  # the engine's own input-gradient call, timed for comparison
    assert all(parameter.grad is None for parameter in module.parameters())


def test_state_keeps_far_less_than_the_graph_when_formulas_apply():
    torch.manual_seed(0)
    blocks = []
    for _ in range(8):
        blocks += [nn.Linear(32, 32), nn.GELU()]
    module = nn.Sequential(*blocks)
    result = benchmark_split(module, (torch.randn(64, 32, requires_grad=True),), repeat=1, warmup=0)
    # GELU's saved inputs are not needed by W; the Linear inputs and captured gradients are
    assert result.retained_bytes == result.w_needs_bytes
    linear_inputs = 8 * 64 * 32 * 4
    captured = 8 * 64 * 32 * 4
    assert result.retained_bytes == linear_inputs + captured


def test_every_zoo_state_keeps_only_what_w_needs():
    # the bound is retained <= 1.1 x needed; graphkit keeps exactly what W needs (parameters,
    # alive in the module anyway, count in neither figure - a Node that saved W.t() shares W's storage)
    for name in zoo.MODELS:
        module, inputs = zoo.build(name)
        result = benchmark_split(module, inputs, repeat=1, warmup=0, compare_pytorch=False)
        assert result.retained_bytes == result.w_needs_bytes, name


def test_time_account_sees_the_same_matrix_products_in_both_backwards():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))
    account = account_split_time(module, (torch.randn(8, 16, requires_grad=True),), repeat=2, warmup=0)
    # the split does the same products as the full backward: input side in B, weight side in W
    # (a Linear on a 2-D input is addmm; its backward runs mm for the input and for the weight)
    full_seconds, split_seconds, full_calls, split_calls = account.operators["aten::mm"]
    assert full_calls == split_calls == 6  # 3 weight gradients + 3 input gradients (the stage input's too)
    assert full_seconds > 0 and split_seconds > 0
    assert account.intermediates == 3
    assert account.full_s > 0 and account.split_s > 0 and account.full_kernel_s > 0
    assert account.added_kernel_s == pytest.approx(account.split_kernel_s - account.full_kernel_s)
    assert account.other_s == pytest.approx(account.split_s - account.full_s - account.added_kernel_s)
    assert len(account.largest_added(2)) == 2
    assert all(parameter.grad is None for parameter in module.parameters())


def test_time_account_refuses_no_repeats():
    with pytest.raises(GraphkitInputError, match="repeat must be at least 1"):
        account_split_time(nn.Linear(2, 2), (torch.randn(1, 2),), repeat=0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*reentrant activation checkpoint")
def test_checkpointing_bench_counts_forwards_flops_and_memory_for_every_variant():
    bench = _bench_script("checkpointing")
    rows = {name: bench.measure(name, width=16, repeat=1) for name in bench.VARIANTS}
    forwards = {
        name: (row["forwards_full"], row["forwards_b"], row["forwards_w"]) for name, row in rows.items()
    }
    assert forwards == {
        "no checkpointing": (0, 0, 0),
        "non-reentrant, in-w": (4, 4, 4),
        "non-reentrant, keep-from-b": (4, 4, 0),
        "reentrant": (4, 4, 0),
    }
    assert rows["non-reentrant, in-w"]["flops_ratio"] > 1
    for name in ("no checkpointing", "non-reentrant, keep-from-b", "reentrant"):
        assert rows[name]["flops_ratio"] == 1, name
    retained = {name: row["retained_bytes"] for name, row in rows.items()}
    # keeping B's recomputation holds what the stage holds without checkpointing and the four blocks'
    # inputs (4 x 32 tokens x width 16, float32; without checkpointing W reads none of them: their
    # LayerNorms' weight gradients are computed in B), a few scalars more; recomputing in W much less
    block_inputs = 4 * (4 * 32 * 16 * 4)
    assert retained["non-reentrant, keep-from-b"] == pytest.approx(
        retained["no checkpointing"] + block_inputs, rel=1e-3
    )
    assert retained["non-reentrant, in-w"] < 0.8 * retained["non-reentrant, keep-from-b"]


def test_graphkit_bench_explains_every_column_under_its_table(capsys):
    from graphkit.cli import main
    from graphkit.measure.benchmark import HEADER

    threads = torch.get_num_threads()
    try:
        assert main(["bench", "zoo:mlp", "--repeat", "1", "--threads", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    header, row, *legend = capsys.readouterr().out.splitlines()
    assert header == HEADER and row.startswith("zoo:mlp ")
    legend_text = " ".join(legend)
    for column in ("B+W:", "Beng:", "FLOPs:", "Wc:", "kept MiB:", "/need:", "graph MiB:", "pytorch:"):
        assert column in legend_text
    assert max(len(line) for line in legend) <= 110


def test_split_bench_runs_rebuilds_a_result_from_its_dict_and_drops_its_own_option():
    bench = _bench_script("split")
    module = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))
    result = benchmark_split(module, (torch.randn(4, 8, requires_grad=True),), repeat=1, warmup=0)
    rebuilt = SplitBenchmark.from_dict(json.loads(json.dumps(result.to_dict())))
    assert rebuilt.to_dict() == result.to_dict()
    assert bench.format_row("m", rebuilt) == bench.format_row("m", result)
    assert bench._without_runs(["--threads", "1", "--runs", "3", "--only", "a", "--runs=2"]) == [
        "--threads",
        "1",
        "--only",
        "a",
    ]


def _layer_norm_stack() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 4, bias=False))
    return module, torch.randn(6, 8, requires_grad=True)


def test_split_floor_gives_the_gradients_of_a_full_backward():
    floor = _bench_script("split_floor")
    module, x = _layer_norm_stack()
    cotangent = torch.randn(6, 4)
    module(x).backward(cotangent)
    expected = [p.grad.clone() for p in module.parameters()]
    expected_input = x.grad.clone()
    module.zero_grad(set_to_none=True)
    x.grad = None

    output = module(x)
    work = floor._prepare_floor([output], [cotangent], (x,))
    assert len(work.rules) == 4  # both Linear layers, and the LayerNorm's weight and bias (computed in B)
    assert sum(rule is None for rule in work.rules) == 2
    (input_grad,), captured = floor._floor_b(work)
    assert torch.equal(input_grad, expected_input)
    assert x.grad is None and all(p.grad is None for p in module.parameters())  # B accumulates nothing
    floor._floor_w(work, captured)
    for parameter, gradient in zip(module.parameters(), expected, strict=True):
        assert torch.equal(parameter.grad, gradient)


def test_split_floor_compares_every_run_with_graphkits_split():
    floor = _bench_script("split_floor")
    module, x = _layer_norm_stack()
    result = floor.floor_split(module, (x,), repeat=2, warmup=0, clock=time.perf_counter)
    assert result.exact and result.intermediates == 3
    assert min(result.full_s, result.floor_b_s, result.floor_w_s, result.graphkit_b_s) > 0
    assert all(p.grad is None for p in module.parameters())


def test_split_floor_refuses_an_intermediate_without_a_formula():
    floor = _bench_script("split_floor")
    weight = nn.Parameter(torch.randn(5, 3))
    x = torch.randn(4, 3, requires_grad=True)
    output = torch.cdist(x, weight)  # CdistBackward0: graphkit calls the Node in W, the floor has no formula
    with pytest.raises(floor.FloorUnsupported, match="no weight formula for CdistBackward0"):
        floor._prepare_floor([output], [torch.ones_like(output)], (x,))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_type", "checkpoint"),
    [
        ("wav2vec2", False),  # SpecAugment draws its masks from np.random in training mode
        ("t5", True),  # non-reentrant checkpointing makes position_bias a new leaf in each forward
        ("gpt2", False),
        ("qwen2_moe", False),
        ("clip", False),
        ("whisper", False),
    ],
)
def test_the_transformers_sweep_finds_the_split_exact_on_real_families(model_type: str, checkpoint: bool):
    pytest.importorskip("transformers")
    sweep = _bench_script("hf_sweep")
    (family,) = [entry for entry in sweep.families() if entry[0] == model_type]
    outcome = sweep.sweep_one(*family, checkpoint=checkpoint)
    assert outcome.status == "exact", outcome
    assert outcome.gradients > 10 and outcome.max_rel_err <= 1e-9
    assert outcome.input_with_grad != "-"


def test_split_breakdown_splits_the_excess_into_parts_that_add_up():
    breakdown = _bench_script("split_breakdown")
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    row = breakdown.measure_stage(module, (torch.randn(8, 16, requires_grad=True),), 2, 0, time.perf_counter)
    assert min(row["full"], row["b"], row["w"], row["i"], row["pw"]) > 0
    assert sum(row["parts"].values()) == pytest.approx(row["b"] + row["w"] - row["full"])
    # B + W run a full backward's kernels once each: no product counted twice
    assert "aten::mm" not in row["differing"] and "aten::addmm" not in row["differing"]
    assert all(parameter.grad is None for parameter in module.parameters())


@pytest.mark.slow  # two child processes
def test_split_breakdown_quick_runs_one_child_per_allocator(capsys):
    breakdown = _bench_script("split_breakdown")
    assert breakdown.allocator_environment("tuned")["GRAPHKIT_ALLOCATOR"] == "tuned"
    assert "MALLOC_TOP_PAD_" not in breakdown.allocator_environment("default")
    assert breakdown.main(["--quick", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    default, tuned = results["default"]["mlp-48-linear-gelu"], results["tuned"]["mlp-48-linear-gelu"]
    assert default["malloc"].startswith("glibc malloc, default"), default[
        "malloc"
    ]  # what the child ran under
    assert tuned["malloc"].startswith("glibc malloc, tuned"), tuned["malloc"]
    assert default["full"] > 0 and tuned["b"] > 0
