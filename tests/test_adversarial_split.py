"""The split backward on graphs built to break it: Node post-hooks, module full backward hooks, inference mode.

Every case either equals PyTorch's own full backward (in float64, on a second, identically seeded copy) or
is refused with an error that says what is wrong and how to fix it - never a silent wrong gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphkit.graph.tensors import GraphkitInputError
from graphkit.measure.verification import verify_split
from graphkit.split.backward import SplitError, backward_full, backward_input, backward_weight
from tests import models


class Scale(torch.autograd.Function):
    """``x * weight`` (weight broadcast over rows), a custom Function whose Node is an intermediate."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        return grad * weight, (grad * x).sum(0)


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


def _fed_only_missing_gradients(plan: models.RandomModelPlan) -> set[int]:
    """Values computed from parameters alone that ``StopsSecond`` (directly, or through one op) gives no
    gradient: W roots their Nodes with zeros it turns back into missing gradients, after the tensor hooks
    of these values ran (the limit docs/concepts.md states)."""
    first_op = plan.num_inputs + len(plan.param_shapes)
    stopped = {op.operands[1] for op in plan.ops if op.variant == "custom_stops_second"}
    stopped |= {
        operand
        for position, op in enumerate(plan.ops)
        if first_op + position in stopped
        for operand in op.operands
    }
    return stopped


class _HookedRandomModel(nn.Module):
    """A random model (tests/models.py) whose values get tensor hooks that scale their gradient, or
    ``retain_grad``, as drawn; its parameters get scaling hooks too (registered on each copy)."""

    def __init__(self, inner: nn.Module, value_hooks: dict[int, float | None]) -> None:
        super().__init__()
        self.inner = inner
        self.value_hooks = value_hooks
        self.retained: list[torch.Tensor] = []

    def forward(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        plan = self.inner.plan
        values = [inputs[f"x{index}"] for index in range(plan.num_inputs)]
        values.extend(getattr(self.inner, name) for name in self.inner._param_attributes)
        self.retained = []
        for op in plan.ops:
            value = models._apply(op, [values[index] for index in op.operands])
            if value.requires_grad and len(values) in self.value_hooks:
                factor = self.value_hooks[len(values)]
                if factor is None:
                    value.retain_grad()
                    self.retained.append(value)
                else:
                    # a full backward passes a hook None where the gradient is missing
                    value.register_hook(lambda grad, factor=factor: None if grad is None else grad * factor)
            values.append(value)
        return tuple(values[index] for index in plan.outputs)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_tensor_hooks_anywhere_in_random_models_give_the_full_backwards_gradients(data):
    inner, inputs = models.random_model(data, custom_functions=data.draw(st.booleans()))
    inner = inner.double()
    count = inner.plan.num_inputs + len(inner.plan.param_shapes) + len(inner.plan.ops)
    factor = st.one_of(st.none(), st.sampled_from([0.5, -2.0, 3.0]))
    value_hooks = data.draw(st.dictionaries(st.integers(0, count - 1), factor, max_size=4))
    for value in _fed_only_missing_gradients(inner.plan):  # W hands their Nodes zeros (docs/concepts.md)
        value_hooks.pop(value, None)
    parameter_hooks = data.draw(st.lists(st.sampled_from([None, 0.25, -1.0]), min_size=4, max_size=4))
    inputs = {name: t.detach().double().requires_grad_(t.requires_grad) for name, t in inputs.items()}

    def run(split: bool):
        model = _HookedRandomModel(copy.deepcopy(inner), value_hooks)
        for (_, parameter), scale in zip(model.inner.named_parameters(), parameter_hooks, strict=False):
            if scale is not None:
                parameter.register_hook(lambda grad, scale=scale: None if grad is None else grad * scale)
        fresh = {name: t.detach().clone().requires_grad_(t.requires_grad) for name, t in inputs.items()}
        outputs = model(**fresh)
        generator = torch.Generator().manual_seed(0)
        grads = [torch.randn(out.shape, generator=generator, dtype=out.dtype) for out in outputs]
        pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True) if out.requires_grad]
        if split:
            state = backward_input([out for out, _ in pairs], [grad for _, grad in pairs], fresh)
            backward_weight(state)
            input_grads = dict(zip(fresh, state.input_grads, strict=True))
        else:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
            input_grads = {name: tensor.grad for name, tensor in fresh.items()}
        retained = [tensor.grad for tensor in model.retained]
        return _grads(model), input_grads, retained

    expected, expected_inputs, expected_retained = run(False)
    actual, actual_inputs, actual_retained = run(True)
    _assert_same(expected, actual)
    _assert_same(expected_inputs, actual_inputs)
    _assert_same(dict(enumerate(expected_retained)), dict(enumerate(actual_retained)))


def test_a_parameter_frozen_after_the_forward_gets_no_gradient_as_in_a_full_backward():
    # PyTorch's AccumulateGrad skips a leaf that no longer requires grad; the split must do the same in W
    def run(split: bool) -> dict:
        model, x, cotangent = _two_layers()
        output = model(x)
        model[0].weight.requires_grad_(False)
        if split:
            backward_weight(backward_input(output, cotangent, x))
        else:
            output.backward(cotangent)
        return _grads(model)

    expected = run(False)
    assert expected["0.weight"] is None and expected["0.bias"] is not None
    _assert_same(expected, run(True))
