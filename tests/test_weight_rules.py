"""Weight-side formulas against the Node they stand in for: same values, same memory layout.

The oracle is the intermediate Node itself, called directly with the same gradient: PyTorch's own
backward formula (``torch/csrc/autograd/FunctionsManual.cpp``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphkit.split.weight_rules import prepare

torch.manual_seed(0)
_DOUBLE = torch.float64


def _linear_3d():
    layer = nn.Linear(6, 5).double()
    return layer(torch.randn(3, 4, 6, dtype=_DOUBLE, requires_grad=True) * 2)


def _linear_2d():
    layer = nn.Linear(6, 5).double()
    return layer(torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2)


def _mm_weight_right():
    weight = nn.Parameter(torch.randn(6, 5, dtype=_DOUBLE))
    return (torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2) @ weight


def _mm_transposed_weight_left():
    weight = nn.Parameter(torch.randn(6, 4, dtype=_DOUBLE))
    return weight.t() @ (torch.randn(6, 5, dtype=_DOUBLE, requires_grad=True) * 2)


def _addmm_scaled():
    bias = nn.Parameter(torch.randn(5, dtype=_DOUBLE))
    weight = nn.Parameter(torch.randn(5, 6, dtype=_DOUBLE))
    x = torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2
    return torch.addmm(bias, x, weight.t(), beta=0.5, alpha=3.0)


def _bmm():
    weight = nn.Parameter(torch.randn(3, 6, 5, dtype=_DOUBLE))
    return torch.bmm(torch.randn(3, 4, 6, dtype=_DOUBLE, requires_grad=True) * 2, weight)


def _convolution():
    conv = nn.Conv2d(3, 4, 3, stride=2, padding=1).double()
    return conv(torch.randn(2, 3, 9, 9, dtype=_DOUBLE, requires_grad=True) * 2)


def _layer_norm():
    norm = nn.LayerNorm(6).double()
    return norm(torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2)


def _batch_norm_training():
    norm = nn.BatchNorm2d(3).double()
    return norm(torch.randn(4, 3, 5, 5, dtype=_DOUBLE, requires_grad=True) * 2)


def _batch_norm_eval():
    norm = nn.BatchNorm1d(6).double().eval()
    norm.running_mean.uniform_(-1, 1)
    norm.running_var.uniform_(0.5, 2)
    return norm(torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2)


def _group_norm():
    norm = nn.GroupNorm(2, 4).double()
    return norm(torch.randn(3, 4, 5, dtype=_DOUBLE, requires_grad=True) * 2)


def _group_norm_channels_last():
    norm = nn.GroupNorm(2, 4).double()
    image = torch.randn(2, 4, 5, 5, dtype=_DOUBLE).to(memory_format=torch.channels_last).requires_grad_()
    return norm(image * 2)


def _mul():
    scale = nn.Parameter(torch.randn(6, dtype=_DOUBLE))
    return (torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2) * scale


def _add_scaled():
    shift = nn.Parameter(torch.randn(6, dtype=_DOUBLE))
    return torch.add(torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2, shift, alpha=0.25)


CASES = {
    "linear-3d": _linear_3d,
    "linear-2d": _linear_2d,
    "mm-weight-right": _mm_weight_right,
    "mm-transposed-weight-left": _mm_transposed_weight_left,
    "addmm-scaled": _addmm_scaled,
    "bmm": _bmm,
    "convolution": _convolution,
    "layer-norm": _layer_norm,
    "batch-norm-training": _batch_norm_training,
    "batch-norm-eval": _batch_norm_eval,
    "group-norm": _group_norm,
    "group-norm-channels-last": _group_norm_channels_last,
    "mul": _mul,
    "add-scaled": _add_scaled,
}


def _intermediate(output: torch.Tensor):
    """The Node that consumes a parameter-side edge, walking down views (a 3-D Linear's reshape)."""
    node = output.grad_fn
    while type(node).__name__ in {"ViewBackward0", "UnsafeViewBackward0"}:
        node = node.next_functions[0][0]
    return node


def _weight_side(node) -> list[int]:
    """next_functions entries that lead to a parameter without passing a Node that reaches the input."""
    wanted = []
    for input_nr, (producer, _) in enumerate(node.next_functions):
        if producer is None:
            continue
        stack, reaches_input = [producer], False
        while stack:
            current = stack.pop()
            if type(current).__name__ == "AccumulateGrad":
                reaches_input |= not isinstance(current.variable, nn.Parameter)
            stack.extend(next_node for next_node, _ in current.next_functions if next_node is not None)
        if not reaches_input:
            wanted.append(input_nr)
    return wanted


@pytest.mark.parametrize("name", sorted(CASES))
def test_formula_matches_the_node_in_value_and_layout(name):
    output = CASES[name]()
    node = _intermediate(output)
    wanted = _weight_side(node)
    assert wanted, "the case must have a weight-side edge"
    metadata = node._input_metadata
    grads = [torch.randn(tuple(meta.shape), dtype=meta.dtype) for meta in metadata]
    rule = prepare(node, wanted)
    assert rule is not None, f"no rule for {type(node).__name__}"
    expected = node(*grads)
    expected = (expected,) if isinstance(expected, torch.Tensor) else expected
    for input_nr, actual in zip(wanted, rule(grads), strict=True):
        reference = expected[input_nr]
        torch.testing.assert_close(actual, reference, rtol=1e-12, atol=1e-12)
        if actual.shape == reference.shape:
            assert actual.stride() == reference.stride(), (
                f"input_nr {input_nr}: layout differs from the Node's"
            )


def test_a_saved_tensor_changed_in_place_after_prepare_is_refused():
    weight = nn.Parameter(torch.randn(6, 5, dtype=_DOUBLE))
    activation = torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2
    output = activation @ weight
    rule = prepare(output.grad_fn, [1])
    with torch.no_grad():
        activation.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        rule([torch.ones(4, 5, dtype=_DOUBLE)])


def test_ops_without_a_formula_and_checkpointed_tensors_get_none():
    weight = nn.Parameter(torch.randn(6, dtype=_DOUBLE))
    output = torch.atan2(torch.randn(6, dtype=_DOUBLE, requires_grad=True), weight)
    assert prepare(output.grad_fn, [1]) is None
    with torch.autograd.graph.saved_tensors_hooks(lambda tensor: tensor, lambda tensor: tensor):
        hooked = (torch.randn(4, 6, dtype=_DOUBLE, requires_grad=True) * 2) @ nn.Parameter(
            torch.randn(6, 5, dtype=_DOUBLE)
        )
    assert prepare(hooked.grad_fn, [1]) is None
