"""The split backward on graphs built to break it: Node post-hooks, module full backward hooks, inference mode.

Every case either equals PyTorch's own full backward (in float64, on a second, identically seeded copy) or
is refused with an error that says what is wrong and how to fix it - never a silent wrong gradient.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graphkit.graph.tensors import GraphkitInputError
from graphkit.split.backward import SplitError, backward_full, backward_input, backward_weight
from graphkit.split.verification import verify_split


def _grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone() for name, p in module.named_parameters()}


def _assert_same(expected: dict, actual: dict) -> None:
    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        assert (grad is None) == (actual[name] is None), name
        if grad is not None:
            torch.testing.assert_close(actual[name], grad, rtol=1e-12, atol=1e-12, msg=name)


def _two_layers() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).double()
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    return model, x, torch.randn(5, 2, dtype=torch.float64)


def _scale_post_hook(grad_inputs: tuple, _grad_outputs: tuple) -> tuple:
    return tuple(None if grad is None else grad * 2 for grad in grad_inputs)


@pytest.mark.parametrize("op", ["addmm", "mul", "custom_function"])
def test_a_post_hook_on_an_intermediate_node_is_refused_instead_of_skipped_for_the_weights(op):
    # Node.register_hook sees (and may replace) every gradient the Node computes; B computes only its
    # input-side ones and W its weight-side ones, so the hook could never change the weights' gradients
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            return x * weight

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            return grad * weight, (grad * x).sum(0)

    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(4, dtype=torch.float64))
    matrix = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    hidden = {"addmm": lambda: torch.addmm(weight, x, matrix), "mul": lambda: x * weight}.get(
        op, lambda: Scale.apply(x, weight)
    )()
    hidden.grad_fn.register_hook(_scale_post_hook)
    with pytest.raises(SplitError, match=r"register_hook.*tensor\.register_hook"):
        backward_input(hidden.tanh(), torch.ones(5, 4, dtype=torch.float64), x)
    assert weight.grad is None and matrix.grad is None
    hidden.tanh().backward(torch.ones(5, 4, dtype=torch.float64))  # the graph is intact: no hook left behind


def test_a_module_full_backward_hook_on_a_module_fed_a_weight_only_tensor_is_refused():
    # PyTorch implements module hooks with a post-hook on the Node that stands for the module's inputs:
    # with one input computed from parameters alone, that Node is an intermediate
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x, position):
            return self.linear(x) + position

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = Block()
            self.position = nn.Parameter(torch.randn(4))

        def forward(self, x):
            return self.block(x, self.position * 2)

    torch.manual_seed(0)
    model = Model().double()
    model.block.register_full_backward_hook(lambda module, grad_input, grad_output: grad_input)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(SplitError, match="full backward hook"):
        backward_input(model(x), torch.ones(5, 4, dtype=torch.float64), x)


def test_post_hooks_on_nodes_that_are_not_intermediates_run_as_in_a_full_backward():
    # on the input path only (B runs it) or on the weight side only (W's engine call runs it)
    def run(split: bool) -> tuple[dict, list]:
        model, x, cotangent = _two_layers()
        seen: list[int] = []
        weight_view = model[2].weight.t()
        weight_view.grad_fn.register_hook(lambda grad_inputs, _: (grad_inputs[0] * 3,))
        hidden = torch.tanh(model[0](x))
        hidden.grad_fn.register_hook(lambda grad_inputs, _: seen.append(len(grad_inputs)))
        output = torch.addmm(model[2].bias, hidden, weight_view)
        if split:
            backward_weight(backward_input(output, cotangent, x))
        else:
            output.backward(cotangent)
        return _grads(model), seen

    (expected, expected_seen), (actual, actual_seen) = run(False), run(True)
    _assert_same(expected, actual)
    assert actual_seen == expected_seen == [1]


def test_verify_split_counts_flops_of_opaque_intermediates_without_refusing_its_own_hooks():
    # verify_split watches custom Functions with post-hooks of its own (FLOPs per Node): not a user's
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            ctx.save_for_backward(x, weight)
            return x * weight

        @staticmethod
        def backward(ctx, grad):
            x, weight = ctx.saved_tensors
            return grad * weight, (grad * x).sum(0)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4))

        def forward(self, x):
            return Scale.apply(x, self.weight).tanh()

    report = verify_split(Model(), (torch.randn(5, 4, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    assert report.opaque, "the custom Function is an opaque Node"


def test_b_and_w_under_inference_mode_give_the_full_backwards_gradients():
    # PyTorch's own backward runs under torch.inference_mode(); the split must too (or say why not)
    model, x, cotangent = _two_layers()
    with torch.inference_mode():
        model(x.detach())  # an unrelated inference forward in the same block
    output = model(x)
    with torch.inference_mode():
        output.backward(cotangent, retain_graph=True)
    expected, expected_input = _grads(model), x.grad.clone()
    model.zero_grad(set_to_none=True)
    with torch.inference_mode():
        state = backward_input(output, cotangent, x)
        backward_weight(state)
    _assert_same(expected, _grads(model))
    torch.testing.assert_close(state.input_grads[0], expected_input, rtol=1e-12, atol=1e-12)
    model[0].weight.grad.add_(1)  # a normal tensor: usable by an optimizer outside inference mode


@pytest.mark.parametrize("phase", ["split", "full"])
def test_params_given_as_a_generator_restrict_like_a_list(phase):
    # model.parameters() is a generator: read once, it must not leave the parameters without gradients
    def run(params_of):
        model, x, cotangent = _two_layers()
        output = model(x)
        if phase == "split":
            backward_weight(backward_input(output, cotangent, x, params=params_of(model)))
        else:
            backward_full(output, cotangent, x, params=params_of(model))
        return _grads(model)

    expected = run(lambda model: list(model[0].parameters()))
    assert expected["0.weight"] is not None and expected["2.weight"] is None
    _assert_same(expected, run(lambda model: model[0].parameters()))


@pytest.mark.parametrize("phase", ["split", "full"])
def test_params_holding_a_tensor_that_is_not_a_leaf_is_refused(phase):
    # W accumulates into leaves only: a computed tensor in params would silently get nothing
    model, x, cotangent = _two_layers()
    scaled = model[0].weight * 2
    output = model[2](torch.tanh(torch.nn.functional.linear(x, scaled, model[0].bias)))
    run = backward_input if phase == "split" else backward_full
    with pytest.raises(GraphkitInputError, match="not a leaf"):
        run(output, cotangent, x, params=[scaled, model[2].weight])
