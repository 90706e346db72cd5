"""Stage costs against hand-computed stages: FLOPs and bytes of F, B and W of Linear stacks, exactly."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphkit.cli import main
from graphkit.graph.tensors import GraphkitInputError
from graphkit.measure.costs import PipelineCosts, pipeline_costs, stage_costs
from graphkit.models.pipeline_specs import PipelineModel, load_pipeline_spec, load_stage_or_pipeline
from graphkit.models.specs import SpecError

N = 8  # microbatch rows
WIDTHS = (4, 6, 3)
DOUBLE = 8  # bytes of a float64


def linear_stack(*, gelu: bool = False) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(WIDTHS[0], WIDTHS[1])]
    if gelu:
        layers.append(nn.GELU())
    layers.append(nn.Linear(WIDTHS[1], WIDTHS[2]))
    module = nn.Sequential(*layers).double()
    return module, torch.randn(N, WIDTHS[0], dtype=torch.float64, requires_grad=True)


def matmul_flops(widths: tuple[int, ...]) -> int:
    """One matrix product per layer, 2 * rows * in * out FLOPs (FlopCounterMode's count for mm/addmm)."""
    return sum(2 * N * d_in * d_out for d_in, d_out in zip(widths, widths[1:], strict=False))


def test_linear_stack_costs_are_exact():
    module, features = linear_stack()
    costs = stage_costs(module, (features,), repeat=2, warmup=1)
    d0, d1, d2 = WIDTHS
    # F: x @ W1.t() + b1, h @ W2.t() + b2; B: grad_x and grad_h; W: grad_W1 and grad_W2
    assert (
        costs.forward.flops
        == costs.backward_input.flops
        == costs.backward_weight.flops
        == matmul_flops(WIDTHS)
    )
    # each addmm saved its input (x and h); W1.t() and W2.t() are parameters, not counted
    assert costs.activation_bytes == N * (d0 + d1) * DOUBLE
    # B keeps both inputs for W (grad_W = grad_out.t() @ input) and the two captured gradients
    assert costs.b_keeps_bytes == N * (d0 + d1) * DOUBLE + N * (d1 + d2) * DOUBLE
    assert costs.b_frees_bytes == 0
    assert costs.w_needs_bytes == costs.w_frees_bytes == costs.b_keeps_bytes
    assert costs.input_grad_bytes == N * d0 * DOUBLE
    assert costs.parameter_grad_bytes == (d0 * d1 + d1 + d1 * d2 + d2) * DOUBLE
    # F allocates h and the output, both alive at the end
    assert costs.forward.peak_bytes == N * (d1 + d2) * DOUBLE
    assert all(parameter.grad is None for parameter in module.parameters())
    assert (
        costs.forward.seconds > 0 and costs.backward_input.seconds > 0 and costs.backward_weight.seconds > 0
    )


def test_gelu_activation_is_freed_by_b():
    module, features = linear_stack(gelu=True)
    costs = stage_costs(module, (features,), repeat=1, warmup=0)
    d0, d1, _ = WIDTHS
    # GELU saved its input (the first Linear's output); the second Linear saved GELU's output
    assert costs.activation_bytes == N * (d0 + d1 + d1) * DOUBLE
    # W needs x and GELU's output (the Linears' inputs), not GELU's input: B frees it
    assert costs.b_frees_bytes == N * d1 * DOUBLE


def test_scheduler_fields_are_net_changes_that_add_up_to_zero():
    module, features = linear_stack(gelu=True)
    fields = stage_costs(module, (features,), repeat=1, warmup=0).scheduler_fields()
    assert fields["mem_f"] + fields["mem_b"] + fields["mem_w"] == 0
    assert fields["mem_f"] > 0 > fields["mem_w"]
    assert set(fields) == {"cost_f", "cost_b", "cost_w", "mem_f", "mem_b", "mem_w"}


def test_pipeline_costs_feed_each_stage_its_predecessors_outputs():
    spec = load_pipeline_spec("zoo-pipeline:mlp")
    inputs, target = spec.microbatch()
    costs = pipeline_costs(spec.stages, inputs, spec.loss_fn, target, repeat=1, warmup=0)
    assert [stage.stage_index for stage in costs.stages] == [0, 1, 2, 3]
    rows, width = inputs[0].shape
    hidden = 256
    first, middle, last = costs.stages[0], costs.stages[1], costs.stages[3]
    # the first stage's input needs no grad: B computes nothing, W both weight gradients and the
    # gradient between the two Linears
    assert first.backward_input.flops == 0 and first.input_grad_bytes == 0
    assert first.backward_weight.flops == 3 * 2 * rows * width * hidden
    assert middle.input_grad_bytes == rows * width * 4
    assert middle.forward.flops == middle.backward_input.flops == middle.backward_weight.flops
    # the last stage's F includes the loss (output ** 2 saves the output)
    assert last.activation_bytes == middle.activation_bytes + rows * width * 4
    config = costs.scheduler_config()
    assert len(config["cost_f"]) == 4 and config["mem_f"][1] == middle.activation_bytes


def test_stage_costs_rejects_bad_repeat():
    module, features = linear_stack()
    with pytest.raises(GraphkitInputError, match="repeat must be at least 1"):
        stage_costs(module, (features,), repeat=0)


def test_costs_cli_prints_table_and_json(capsys: pytest.CaptureFixture[str]):
    assert main(["costs", "zoo:mlp", "--repeat", "1", "--warmup", "0"]) == 0
    table = capsys.readouterr().out
    assert "leaves" in table and "method: time: median" in table
    assert main(["costs", "zoo-pipeline:mlp", "--repeat", "1", "--warmup", "0", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["stages"]) == 4
    assert set(payload["scheduler"]) == {"cost_f", "cost_b", "cost_w", "mem_f", "mem_b", "mem_w"}
    assert payload["stages"][1]["backward_input"]["flops"] > 0


def test_pipeline_spec_from_a_file(tmp_path):
    path = tmp_path / "pipe.py"
    path.write_text(
        "import torch\n"
        "def pipeline(batch_size):\n"
        "    stages = [torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)]\n"
        "    return stages, lambda output, target: output.sum(), (torch.randn(batch_size, 3),), None\n"
        "def model():\n"
        "    return torch.nn.Linear(3, 2), (torch.randn(4, 3, requires_grad=True),)\n"
        "def broken():\n"
        "    return [torch.nn.Linear(3, 3)], lambda output, target: output.sum(), 'text', None\n"
    )
    loaded = load_stage_or_pipeline(f"{path}:pipeline", batch_size=12)
    assert isinstance(loaded, PipelineModel)
    assert len(loaded.stages) == 2 and loaded.inputs[0].shape == (12, 3)
    module, inputs = load_stage_or_pipeline(f"{path}:model")
    assert isinstance(module, nn.Linear) and inputs[0].shape == (4, 3)
    with pytest.raises(SpecError, match="inputs is a str"):
        load_stage_or_pipeline(f"{path}:broken")
    with pytest.raises(SpecError, match="unknown built-in pipeline"):
        load_pipeline_spec("zoo-pipeline:nope")


def test_table_lists_every_pass():
    module, features = linear_stack()
    table = PipelineCosts([stage_costs(module, (features,), repeat=1, warmup=0)], "m").table()
    assert [line.split()[1] for line in table.splitlines()[2:5]] == ["F", "I", "W"]


@settings(max_examples=15, deadline=None)
@given(
    widths=st.lists(st.integers(1, 9), min_size=2, max_size=5),
    rows=st.integers(1, 6),
)
def test_random_linear_stacks_have_exact_flops_and_bytes(widths: list[int], rows: int):
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)]).double()
    features = torch.randn(rows, widths[0], dtype=torch.float64, requires_grad=True)
    costs = stage_costs(module, (features,), repeat=1, warmup=0)
    flops = sum(2 * rows * a * b for a, b in zip(widths, widths[1:], strict=False))
    assert costs.forward.flops == costs.backward_input.flops == costs.backward_weight.flops == flops
    inputs = sum(widths[:-1]) * rows * DOUBLE  # each Linear saved its input
    captured = sum(widths[1:]) * rows * DOUBLE  # B captured each Linear's output gradient
    assert costs.activation_bytes == inputs
    assert costs.b_keeps_bytes == inputs + captured
    assert costs.input_grad_bytes == rows * widths[0] * DOUBLE
    fields = costs.scheduler_fields()
    assert (fields["mem_f"], fields["mem_b"], fields["mem_w"]) == (inputs, captured, -(inputs + captured))
