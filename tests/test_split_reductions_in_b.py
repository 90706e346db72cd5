"""Layer, group and batch norm's weight and bias gradients are computed in B and reach ``.grad`` in W,
bit for bit as a full backward gives them; a parameter with tensor hooks keeps them in W.

The oracle is always a full backward of an identical copy of the stage on the same input and cotangent.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from graphkit import backward_input, backward_weight
from graphkit.graph import _autograd
from graphkit.graph.walk import walk_nodes
from graphkit.split.backward import SplitError
from graphkit.split.backward_plan import cached_plan


def _split_and_full(stage: nn.Module, x: torch.Tensor, cotangent: torch.Tensor):
    """(stage after B and W, reference after a full backward, the SplitState, input gradient of each)."""
    reference = copy.deepcopy(stage)
    x_reference = x.clone().requires_grad_()
    reference(x_reference).backward(cotangent)
    x_split = x.clone().requires_grad_()
    state = backward_input(stage(x_split), cotangent, [x_split])
    assert all(parameter.grad is None for parameter in stage.parameters())  # B leaves .grad alone
    finished = len(state._computed_in_b)
    input_grad = state.input_grads[0]
    backward_weight(state)
    return reference, finished, input_grad, x_reference.grad


def _assert_same_gradients(stage: nn.Module, reference: nn.Module) -> None:
    for name, parameter in reference.named_parameters():
        assert torch.equal(stage.get_parameter(name).grad, parameter.grad), name


class _NormStack(nn.Module):
    """Linear, LayerNorm, GELU, Linear, a GroupNorm over channels, and a learned offset added."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.second = nn.Linear(16, 16, bias=False)
        self.groups = nn.GroupNorm(4, 16)
        self.offset = nn.Parameter(torch.randn(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.second(nn.functional.gelu(self.norm(self.first(x))))
        return self.groups(hidden) + self.offset


def test_normalization_weights_and_biases_are_computed_in_b_and_exact():
    torch.manual_seed(0)
    stage = _NormStack()
    x, cotangent = torch.randn(6, 8), torch.randn(6, 16)
    reference, finished, input_grad, expected_input_grad = _split_and_full(stage, x, cotangent)
    # LayerNorm's and GroupNorm's weight and bias; the Linear's bias and the offset stay with W
    assert finished == 4
    _assert_same_gradients(stage, reference)
    assert torch.equal(input_grad, expected_input_grad)


def test_the_plan_leaves_the_normalizations_out_of_w():
    torch.manual_seed(0)
    stage = _NormStack()
    x = torch.randn(6, 8, requires_grad=True)
    output = stage(x)
    input_nodes = {_autograd.gradient_edge(x).node}
    walk = walk_nodes([output.grad_fn], input_nodes)
    plan = cached_plan(walk, input_nodes, frozenset(), (walk.index[next(iter(input_nodes))],))
    finishing = plan.reductions_in_b
    assert finishing is not None
    left = sorted(type(walk.nodes[index]).__name__ for index, _ in finishing.intermediates)
    assert left == ["AddBackward0", "AddmmBackward0", "MmBackward0"]
    assert len(finishing.computed_in_b) == 4
    assert len(finishing.done_in_b) == 2  # LayerNorm and GroupNorm
    before = sorted(type(walk.nodes[index]).__name__ for index, _ in plan.intermediates)
    assert before == sorted([*left, "NativeGroupNormBackward0", "NativeLayerNormBackward0"])


def test_a_hook_on_a_finished_parameter_runs_once_and_keeps_its_reduction_in_w():
    torch.manual_seed(0)
    stage = _NormStack()
    calls = []

    def double(grad: torch.Tensor) -> torch.Tensor:
        calls.append(grad.shape)
        return grad * 2

    reference = copy.deepcopy(stage)
    stage.norm.weight.register_hook(double)
    reference.norm.weight.register_hook(double)
    x, cotangent = torch.randn(6, 8), torch.randn(6, 16)
    reference(x.clone().requires_grad_()).backward(cotangent)
    assert len(calls) == 1
    x_split = x.clone().requires_grad_()
    state = backward_input(stage(x_split), cotangent, [x_split])
    assert state._computed_in_b == []  # one hooked parameter: this microbatch keeps every reduction in W
    assert len(calls) == 1  # not run in B
    backward_weight(state)
    assert len(calls) == 2  # once, in W
    _assert_same_gradients(stage, reference)


def test_a_layer_norm_shared_by_two_layers_sums_in_b_as_a_full_backward():
    torch.manual_seed(0)
    norm = nn.LayerNorm(16)
    stage = nn.Sequential(nn.Linear(16, 16), norm, nn.Tanh(), nn.Linear(16, 16), norm).to(torch.bfloat16)
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    cotangent = torch.randn(5, 16, dtype=torch.bfloat16)
    reference, finished, _, _ = _split_and_full(stage, x, cotangent)
    assert finished == 2  # the shared weight and bias, each one sum of the two layers' contributions
    _assert_same_gradients(stage, reference)


def test_a_layer_norm_weight_also_used_by_a_multiplication_stays_in_w():
    # the weight feeds the LayerNorm (a reduction B computes) and a multiplication (a formula in W): all
    # of its gradient must come from one place, so it stays with W's formulas
    class Stage(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.norm(x) * self.norm.weight

    torch.manual_seed(0)
    stage = Stage()
    x, cotangent = torch.randn(4, 8), torch.randn(4, 8)
    reference, finished, _, _ = _split_and_full(stage, x, cotangent)
    assert finished == 1  # the bias only
    _assert_same_gradients(stage, reference)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_convolution_and_batch_norm_stage_accumulates_across_microbatches_exactly(mode: str):
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1)).double()
    getattr(stage, mode)()
    reference = copy.deepcopy(stage)
    for seed in range(2):
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(2, 3, 6, 6, dtype=torch.float64, generator=generator)
        cotangent = torch.randn(2, 2, 4, 4, dtype=torch.float64, generator=generator)
        reference(x.clone().requires_grad_()).backward(cotangent)
        x_split = x.clone().requires_grad_()
        state = backward_input(stage(x_split), cotangent, [x_split])
        assert len(state._computed_in_b) == 2  # batch norm's weight and bias
        backward_weight(state)
    _assert_same_gradients(stage, reference)


def test_a_hook_registered_on_a_normalization_weight_while_b_runs_is_refused():
    # a hook on a later activation registers a hook on the LayerNorm's weight during B: the engine's
    # capture may run it in B and W would run it again (twice the gradient), so B refuses
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 8))
    x = torch.randn(4, 8, requires_grad=True)
    output = stage[3](stage[2](stage[1](stage[0](x))))

    def register_late(grad: torch.Tensor) -> torch.Tensor:
        stage[1].weight.register_hook(lambda weight_grad: weight_grad * 2)
        return grad

    output.register_hook(register_late)
    with pytest.raises(SplitError, match="registered on a normalization parameter while B ran"):
        backward_input(output, torch.ones_like(output), [x])
    assert all(parameter.grad is None for parameter in stage.parameters())
