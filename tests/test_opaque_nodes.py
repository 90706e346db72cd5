"""Opaque Nodes in the groups and verify output: each named, with the FLOPs B + W repeats."""

from __future__ import annotations

import torch
from torch import nn

from graphkit.analysis.opaque import OpaqueKind, opaque_nodes
from graphkit.analysis.parameter_groups import GroupFlag, param_groups
from graphkit.graph.autograd_graph import capture
from graphkit.measure.verification import verify_split
from tests.opaque_models import CheckpointedStage, CompiledStage, ReentrantStage


class SolveStage(nn.Module):
    """``linalg.solve`` with a learned matrix: the matrix's gradient needs the right-hand side's."""

    def __init__(self) -> None:
        super().__init__()
        self.matrix = nn.Parameter(torch.eye(4) * 3 + torch.randn(4, 4) * 0.1)
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.solve(self.matrix, self.linear(x).t()).t()


class IgnoresNeedsInputGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad @ weight.t(), x.t() @ grad  # both, whatever ctx.needs_input_grad says


class CustomStage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(IgnoresNeedsInputGrad.apply(x, self.weight))


def _report(module, width, **options):
    torch.manual_seed(0)
    return verify_split(module, (torch.randn(5, width, requires_grad=True),), dtype=torch.float64, **options)


def _groups(module, width):
    torch.manual_seed(0)
    module = module.double()
    x = torch.randn(5, width, dtype=torch.float64, requires_grad=True)
    return param_groups(capture(module(x), inputs=x, module=module))


def _extra_flops(report):
    return report.flops["b"] + report.flops["w"] - report.flops["full"]


def test_linalg_solve_with_a_learned_matrix_is_named_with_the_solve_w_repeats():
    torch.manual_seed(0)
    report = _report(SolveStage(), 4)
    assert report.ok, report.table()
    [solve] = report.opaque
    assert (solve.op, solve.kind) == ("linalg_solve_ex", "no-output-skip")
    # W solves for the right-hand side's gradient again to get the matrix's: one 4x4 solve of 5 columns
    assert solve.repeated == solve.flops["b"] > 0
    assert solve.repeated == _extra_flops(report)
    assert "linalg_solve_ex [no-output-skip]" in report.table()
    groups = _groups(SolveStage(), 4)
    [group] = [group for group in groups if "matrix" in group.params]
    assert GroupFlag.OPAQUE_NODE in group.flags
    assert [entry.kind for entry in group.opaque_nodes] == [OpaqueKind.NO_OUTPUT_SKIP]
    assert "opaque nodes" in repr(groups) and "no-output-skip" in groups._repr_html_()


def test_a_custom_function_ignoring_needs_input_grad_repeats_its_whole_backward():
    report = _report(CustomStage(), 4)
    assert report.ok, report.table()
    [custom] = report.opaque
    assert (custom.op, custom.kind) == ("IgnoresNeedsInputGrad", "custom-function")
    assert custom.flops["b"] == custom.flops["w"] == custom.flops["full"] > 0
    assert custom.repeated == custom.flops["full"] == _extra_flops(report)
    groups = _groups(CustomStage(), 4)
    # flagged as a custom Function (its own flag), listed among the opaque Nodes
    assert groups[0].flags == (GroupFlag.CUSTOM_FUNCTION,)
    assert [entry.kind for entry in groups.opaque_nodes.values()] == [OpaqueKind.CUSTOM_FUNCTION]


def test_checkpointed_intermediates_repeat_exactly_the_recomputation_in_w():
    report = _report(CheckpointedStage(), 8)
    assert report.ok, report.table()
    assert {cost.kind for cost in report.opaque} == {"checkpointed"}
    assert len(report.opaque) == 12  # layer norm and two Linears per block
    repeated = sum(cost.repeated for cost in report.opaque)
    assert repeated == _extra_flops(report) > 0
    assert report.extra["recomputations"] == {"b": 4, "w": 4}
    kept = _report(CheckpointedStage(), 8, recompute="keep-from-b")
    assert kept.ok, kept.table()
    assert sum(cost.repeated for cost in kept.opaque) == _extra_flops(kept) == 0
    assert kept.extra["recomputations"] == {"b": 4, "w": 0}
    assert "recomputed: 4 in B, 0 in W (recompute='keep-from-b')" in kept.table()
    groups = _groups(CheckpointedStage(), 8)
    assert all(GroupFlag.OPAQUE_NODE in group.flags for group in groups)


def test_reentrant_checkpoints_repeat_nothing_and_their_parameters_are_named_as_served_in_b():
    report = _report(ReentrantStage(), 8)
    assert report.ok, report.table()
    assert [cost.kind for cost in report.opaque] == ["reentrant-checkpoint"] * 4
    assert all(cost.repeated == 0 and cost.flops["w"] == 0 for cost in report.opaque)
    assert _extra_flops(report) == 0
    blocks = [name for name, _ in ReentrantStage().named_parameters() if name.startswith("blocks.")]
    assert report.grads_in_b == blocks
    assert "parameters given their gradient in B" in report.table()
    assert report.to_dict()["grads_in_b"] == blocks
    groups = _groups(ReentrantStage(), 8)
    # the regions are no intermediates (their parameters are no edges), but listed, and not "unused"
    assert [entry.kind for entry in groups.opaque_nodes.values()] == [OpaqueKind.REENTRANT_CHECKPOINT] * 4
    assert groups.unused_params == []


def test_a_compiled_region_runs_once_in_b_and_is_named():
    torch._dynamo.reset()
    torch.manual_seed(0)
    report = _report(CompiledStage("aot_eager"), 8)
    assert report.ok, report.table()
    [compiled] = report.opaque
    assert (compiled.kind, compiled.flops["w"], compiled.repeated) == ("compiled-region", 0, 0)
    assert compiled.flops["b"] == compiled.flops["full"] > 0
    assert report.to_dict()["opaque_nodes"][0]["repeated_flops"] == 0


def test_a_plain_stage_has_no_opaque_nodes():
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4)).double()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert opaque_nodes(capture(stage(x), inputs=x)) == {}
    report = verify_split(stage, (x,))
    assert report.opaque == [] and report.grads_in_b == []
    assert "opaque" not in report.table()
