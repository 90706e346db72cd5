"""Split backward (B then W) against an independent oracle: PyTorch's own full backward.

The oracle is ``torch.autograd.backward`` on a deep copy of the model run on the same inputs; graphkit's
``backward_full`` is not used as the reference anywhere here.
"""

from __future__ import annotations

import copy
import os
from unittest import mock

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import graphkit
from graphkit.graph.tensors import flatten_tensors, unflatten_like
from graphkit.models import zoo
from graphkit.split import backward as split
from graphkit.split.backward import GraphFreedError, SplitError, backward_input, backward_weight

# scripts/gpu_check.sh runs these tests with GRAPHKIT_TEST_DEVICE=cuda; CI runs them on the CPU.
DEVICE = torch.device(os.environ.get("GRAPHKIT_TEST_DEVICE", "cpu"))


def _call(module, inputs):
    return module(**inputs) if isinstance(inputs, dict) else module(*inputs)


def _fresh(inputs):
    def copy_one(tensor):
        return tensor.detach().clone().requires_grad_(tensor.requires_grad)

    if isinstance(inputs, dict):
        return {name: copy_one(tensor) for name, tensor in inputs.items()}
    return tuple(copy_one(tensor) for tensor in inputs)


def _cotangents(outputs, seed=0):
    generator = torch.Generator().manual_seed(seed)
    flat = flatten_tensors(outputs)
    grads = [
        torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype).to(tensor.device)
        if tensor.requires_grad
        else None
        for _, tensor in flat
    ]
    return grads[0] if isinstance(outputs, torch.Tensor) else unflatten_like(outputs, grads)


def _oracle(module, inputs, seed=0):
    """Full backward with plain torch.autograd: parameter grads by name and input grads by position."""
    module = copy.deepcopy(module)
    inputs = _fresh(inputs)
    outputs = _call(module, inputs)
    grads = _cotangents(outputs, seed)
    pairs = [
        (tensor, grad)
        for (_, tensor), (_, grad) in zip(_flat(outputs), _flat(grads, keep_none=True), strict=True)
        if tensor.requires_grad and grad is not None
    ]
    torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    params = {name: p.grad for name, p in module.named_parameters()}
    input_grads = [t.grad for _, t in _flat(inputs)]
    return params, input_grads


def _flat(value, keep_none=False):
    if keep_none and not isinstance(value, torch.Tensor):
        # flatten_tensors skips None; rebuild the positions from the outputs' structure instead
        return [(str(i), item) for i, item in enumerate(_leaves(value))]
    return flatten_tensors(value)


def _leaves(value):
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value] if value is None or isinstance(value, torch.Tensor) else []


def _split(module, inputs, seed=0):
    module = copy.deepcopy(module)
    inputs = _fresh(inputs)
    outputs = _call(module, inputs)
    with FlopCounterMode(display=False) as b_counter:
        state = backward_input(outputs, _cotangents(outputs, seed), inputs)
    with FlopCounterMode(display=False) as w_counter:
        backward_weight(state)
    params = {name: p.grad for name, p in module.named_parameters()}
    return params, list(state.input_grads), b_counter.get_total_flops(), w_counter.get_total_flops()


def _assert_same(expected, actual, rtol=1e-10):
    assert expected.keys() == actual.keys()
    for name in expected:
        if expected[name] is None:
            assert actual[name] is None, f"{name} should receive no gradient"
        else:
            assert actual[name] is not None, f"{name} received no gradient"
            torch.testing.assert_close(actual[name], expected[name], rtol=rtol, atol=1e-12, msg=name)


def _float64(name):
    """A zoo model and its inputs in float64 on DEVICE."""
    module, inputs = zoo.build(name)
    module = module.to(device=DEVICE, dtype=torch.float64)

    def convert(tensor):
        moved = tensor.to(DEVICE, torch.float64) if tensor.is_floating_point() else tensor.to(DEVICE)
        return moved.detach().requires_grad_(tensor.requires_grad)

    if isinstance(inputs, dict):
        return module, {k: convert(v) for k, v in inputs.items()}
    return module, tuple(convert(v) for v in inputs)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_split_equals_full_backward_on_every_zoo_model(name):
    module, inputs = _float64(name)
    expected_params, expected_inputs = _oracle(module, inputs)
    params, input_grads, _, _ = _split(module, inputs)
    _assert_same(expected_params, params)
    for expected, actual in zip(expected_inputs, input_grads, strict=True):
        if expected is None:
            assert actual is None
        else:
            torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(set(zoo.MODELS) - {"custom_function"}))
def test_b_plus_w_flops_equal_full_backward_flops(name):
    module, inputs = _float64(name)
    fresh_module, fresh_inputs = copy.deepcopy(module), _fresh(inputs)
    outputs = _call(fresh_module, fresh_inputs)
    with FlopCounterMode(display=False) as full_counter:
        pairs = _pairs(outputs)
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    _, _, b_flops, w_flops = _split(module, inputs)
    assert b_flops + w_flops == full_counter.get_total_flops()


def _pairs(outputs):
    grads = _cotangents(outputs)
    flat_outputs = _flat(outputs)
    flat_grads = _flat(grads)
    return [(t, g) for (_, t), (_, g) in zip(flat_outputs, flat_grads, strict=True) if t.requires_grad]


class PhaseAwareMatmul(torch.autograd.Function):
    """x @ w whose backward computes only what ``ctx.needs_input_grad`` asks for, and records it."""

    phases: list[tuple[bool, ...]] = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        PhaseAwareMatmul.phases.append(tuple(ctx.needs_input_grad))
        grad_x = grad @ w.t() if ctx.needs_input_grad[0] else None
        grad_w = x.t() @ grad if ctx.needs_input_grad[1] else None
        return grad_x, grad_w


class PhaseAwareModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 6)
        self.weight = nn.Parameter(torch.randn(6, 5))

    def forward(self, x):
        return PhaseAwareMatmul.apply(torch.tanh(self.first(x)), self.weight)


def test_custom_function_sees_each_phase_in_needs_input_grad_and_split_wastes_no_flops():
    torch.manual_seed(0)
    module = PhaseAwareModel().double()
    inputs = (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),)
    PhaseAwareMatmul.phases.clear()
    expected_params, _ = _oracle(module, inputs)
    assert PhaseAwareMatmul.phases == [(True, True)]
    PhaseAwareMatmul.phases.clear()
    params, _, b_flops, w_flops = _split(module, inputs)
    assert PhaseAwareMatmul.phases == [(True, False), (False, True)]  # B: the input path; W: the weight
    _assert_same(expected_params, params)
    outputs = _call(copy.deepcopy(module), _fresh(inputs))
    with FlopCounterMode(display=False) as counter:
        torch.autograd.backward(outputs, _cotangents(outputs))
    assert b_flops + w_flops == counter.get_total_flops()


def test_backward_full_asks_a_custom_function_for_every_gradient():
    module = PhaseAwareModel().double()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    PhaseAwareMatmul.phases.clear()
    graphkit.backward_full(module(x), torch.ones(3, 5, dtype=torch.float64), x)
    assert PhaseAwareMatmul.phases == [(True, True)]


def test_current_phase_is_gone_with_a_message_that_says_what_replaces_it():
    for name in ("current_phase", "Phase"):
        with pytest.raises(AttributeError, match="needs_input_grad"):
            getattr(graphkit, name)
        with pytest.raises(AttributeError, match="needs_input_grad"):
            getattr(graphkit.split, name)


def test_gradients_accumulate_over_four_microbatches_like_a_full_backward():
    torch.manual_seed(0)
    module, _ = _float64("gpt_stage")
    reference, split_model = copy.deepcopy(module), copy.deepcopy(module)
    generator = torch.Generator().manual_seed(3)
    for microbatch in range(4):
        hidden = torch.randn(2, 8, 32, generator=generator, dtype=torch.float64).to(DEVICE)
        ref_in = hidden.clone().requires_grad_()
        out = reference(ref_in)
        grad = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(DEVICE)
        out.backward(grad)
        split_in = hidden.clone().requires_grad_()
        state = backward_input(split_model(split_in), grad, split_in)
        torch.testing.assert_close(state.input_grads[0], ref_in.grad, rtol=1e-10, atol=1e-12)
        backward_weight(state)
        assert split_in.grad is None, "the B phase returns input gradients without touching .grad"
        del microbatch
    _assert_same(
        dict(reference.named_parameters()) and {n: p.grad for n, p in reference.named_parameters()},
        {n: p.grad for n, p in split_model.named_parameters()},
    )


def test_microbatches_in_zero_bubble_order_b_b_w_w():
    module, _ = _float64("mlp")
    reference, split_model = copy.deepcopy(module), copy.deepcopy(module)
    xs = [torch.randn(4, 16, dtype=torch.float64, device=DEVICE) for _ in range(2)]
    for x in xs:
        reference(x.clone().requires_grad_()).sum().backward()
    states = []
    for x in xs:
        leaf = x.clone().requires_grad_()
        states.append(backward_input(split_model(leaf).sum(), None, leaf))
    for state in states:
        backward_weight(state)
    _assert_same(
        {n: p.grad for n, p in reference.named_parameters()},
        {n: p.grad for n, p in split_model.named_parameters()},
    )


def test_post_accumulate_grad_hooks_fire_once_per_parameter_per_weight_phase():
    module, inputs = _float64("chain")  # one weight used three times
    module_shared, inputs_shared = _float64("shared_late")
    for model, model_inputs in ((module, inputs), (module_shared, inputs_shared)):
        calls: dict[str, int] = {}
        handles = [
            parameter.register_post_accumulate_grad_hook(
                lambda _parameter, name=name, calls=calls: calls.__setitem__(name, calls.get(name, 0) + 1)
            )
            for name, parameter in model.named_parameters()
        ]
        try:
            fresh = _fresh(model_inputs)
            outputs = _call(model, fresh)
            state = backward_input(outputs, _cotangents(outputs), fresh)
            assert calls == {}, "no parameter is touched in the B phase"
            backward_weight(state)
            assert calls == {name: 1 for name, _ in model.named_parameters()}
        finally:
            for handle in handles:
                handle.remove()


def test_unused_parameters_are_left_untouched():
    module, inputs = _float64("param_only_output")
    unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
    module.register_parameter("not_used", unused)
    unused.grad = torch.full((3,), 7.0, dtype=torch.float64)
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    state = backward_input(outputs, _cotangents(outputs), fresh)
    backward_weight(state)
    assert torch.equal(unused.grad, torch.full((3,), 7.0, dtype=torch.float64))


def test_stage_zero_with_integer_inputs_does_nothing_in_b_and_everything_in_w():
    module, inputs = _float64("gpt")
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    with FlopCounterMode(display=False) as counter:
        state = backward_input(outputs, _cotangents(outputs), fresh)
    assert counter.get_total_flops() == 0
    assert all(parameter.grad is None for parameter in module.parameters())
    assert state.input_grads == (None,)
    backward_weight(state)
    expected, _ = _oracle(*_float64("gpt"))
    _assert_same(expected, {n: p.grad for n, p in module.named_parameters()})


def test_restricting_params_leaves_the_others_alone_and_computes_nothing_for_them():
    module, inputs = _float64("mlp")
    fresh = _fresh(inputs)
    first = list(module.parameters())[:2]
    outputs = _call(module, fresh)
    with FlopCounterMode(display=False) as counter:
        backward_weight(backward_input(outputs, _cotangents(outputs), fresh, params=first))
    # B: both input-gradient matmuls (4*16*32 and 4*32*8 multiply-adds); W: the first layer's weight only
    assert counter.get_total_flops() == 2 * (4 * 32 * 8) + 2 * (4 * 16 * 32) * 2
    expected, _ = _oracle(module, inputs)
    names = [name for name, p in module.named_parameters() if any(p is q for q in first)]
    for name, parameter in module.named_parameters():
        if name in names:
            torch.testing.assert_close(parameter.grad, expected[name])
        else:
            assert parameter.grad is None


def _weight_only_product_graph(with_bias: bool):
    """tanh(x @ (w1 * w2) @ w3 + bias), float64: w1 * w2 is a weight-only Node reaching two leaves."""
    generator = torch.Generator().manual_seed(0)
    w1, w2, w3 = (
        torch.randn(3, 3, dtype=torch.float64, generator=generator, requires_grad=True) for _ in "123"
    )
    bias = torch.randn(3, dtype=torch.float64, generator=generator, requires_grad=True) if with_bias else None
    x = torch.randn(4, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    cotangent = torch.randn(4, 3, dtype=torch.float64, generator=generator)

    def forward() -> torch.Tensor:
        product = x @ (w1 * w2) @ w3
        return torch.tanh(product if bias is None else product + bias)

    return forward, x, cotangent, [w1, w2, w3] if bias is None else [w1, w2, w3, bias]


@pytest.mark.parametrize("left_out_by", ["params", "requires_grad", None])
def test_a_weight_only_node_that_also_feeds_a_left_out_parameter_leaves_that_parameter_alone(left_out_by):
    # W's engine call starts above w1 * w2, so it must still be told which leaves to accumulate into
    # when w2 is left out; with nothing left out it runs without inputs= (a full backward is the oracle)
    forward, x, cotangent, (w1, w2, w3, bias) = _weight_only_product_graph(with_bias=True)
    expected = torch.autograd.grad(forward(), [w1, w3, bias, x, w2], cotangent)
    output = forward()
    if left_out_by == "params":
        state = backward_input(output, cotangent, x, params=[w1, w3, bias])
    else:
        if left_out_by == "requires_grad":
            w2.requires_grad_(False)
        state = backward_input(output, cotangent, x)
    backward_weight(state)
    if left_out_by is None:
        assert torch.equal(w2.grad, expected[4])
    else:
        assert w2.grad is None
    computed = [w1.grad, w3.grad, bias.grad, state.input_grads[0]]
    for actual, wanted in zip(computed, expected[:4], strict=True):
        assert torch.equal(actual, wanted)


@pytest.mark.parametrize("left_out", [False, True])
def test_without_the_private_engine_entry_the_split_falls_back_to_the_public_calls(left_out):
    # a PyTorch without torch.autograd.graph._engine_run_backward: B and W use torch.autograd.grad and
    # torch.autograd.backward (inputs=None where W's call needs none)
    forward, x, cotangent, (w1, w2, w3) = _weight_only_product_graph(with_bias=False)
    expected = torch.autograd.grad(forward(), [w1, w3, x, w2], cotangent)
    output = forward()
    with mock.patch.object(torch.autograd.graph, "_engine_run_backward", None):
        state = backward_input(output, cotangent, x, params=[w1, w3] if left_out else None)
        backward_weight(state)
    assert torch.equal(w1.grad, expected[0])
    assert torch.equal(w3.grad, expected[1])
    assert torch.equal(state.input_grads[0], expected[2])
    assert w2.grad is None if left_out else torch.equal(w2.grad, expected[3])


def test_weight_phase_twice_is_an_error():
    module, inputs = _float64("mlp")
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    state = backward_input(outputs, _cotangents(outputs), fresh)
    backward_weight(state)
    with pytest.raises(SplitError, match="already used"):
        backward_weight(state)


def test_weight_phase_without_a_state_is_an_error():
    with pytest.raises(SplitError, match="run backward_input"):
        backward_weight(None)


def test_input_phase_on_a_freed_graph_is_a_clear_error():
    module, inputs = _float64("mlp")
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    outputs.backward(torch.ones_like(outputs))
    with pytest.raises(GraphFreedError, match="run the forward again"):
        backward_input(outputs, torch.ones_like(outputs), fresh)


def test_scalar_loss_needs_no_grad_outputs_but_a_tensor_output_does():
    module, inputs = _float64("mlp")
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    with pytest.raises(graphkit.GraphkitInputError, match="scalar losses"):
        backward_input(outputs, None, fresh)
    with pytest.raises(graphkit.GraphkitInputError, match="shape"):
        backward_input(outputs, torch.ones(1), fresh)


class FailingInWeightPhase(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:  # W: only the weight's gradient is asked for
            raise ValueError("boom in W")
        return grad @ w.t(), x.t() @ grad


def test_hooks_are_removed_when_a_custom_backward_raises(monkeypatch):
    registered, removed = [], []

    def counting(original):
        def register(node, hook):
            handle = original(node, hook)
            registered.append(handle)

            class Tracked:
                def remove(self):
                    removed.append(handle)
                    handle.remove()

                def __getattr__(self, name):
                    return getattr(handle, name)

            return Tracked()

        return register

    monkeypatch.setattr(split, "_register_prehook", counting(split._register_prehook))
    monkeypatch.setattr(split, "_register_posthook", counting(split._register_posthook))
    weight = nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    out = FailingInWeightPhase.apply(torch.tanh(x), weight)
    state = backward_input(out, torch.ones_like(out), x)
    # left after B: one hook on the output's Node that notes another backward before W
    assert registered and len(registered) - len(removed) == 1
    with pytest.raises(ValueError, match="boom in W"):
        backward_weight(state)
    assert len(removed) == len(registered) >= 2  # W itself registers no hook
    assert out.grad_fn.needs_input_grad == (True, True), "restored after the failed W"
    assert state.used
    # the graph still works after the failure: no stale hook changes a later full backward
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(
        weight.grad, torch.tanh(x).detach().t() @ torch.ones(2, 3, dtype=torch.float64)
    )


def test_multi_output_intermediate_sends_each_gradient_to_its_own_output():
    # In float32 on CPU nn.LSTM is one MkldnnRnnLayer node per layer with outputs (out, h, c): a
    # multi-output intermediate whose weight-side edges lead straight to the weights.
    module, inputs = zoo.build("lstm")
    graph = graphkit.trace(module, *inputs)[1]
    groups = graphkit.param_groups(graph)
    multi_output = [g for g in groups if graphkit.GroupFlag.MULTI_OUTPUT_INTERMEDIATE in g.flags]
    assert multi_output, "the float32 LSTM should have a multi-output intermediate"
    expected_params, expected_inputs = _oracle(module, inputs)
    params, input_grads, _, _ = _split(module, inputs)
    for name in expected_params:
        torch.testing.assert_close(params[name], expected_params[name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(input_grads[0], expected_inputs[0], rtol=1e-5, atol=1e-6)


def test_modifying_a_saved_activation_between_b_and_w_is_an_error():
    layer = nn.Linear(4, 3).double()
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    hidden = torch.tanh(x)
    out = layer(hidden)
    state = backward_input(out, torch.ones_like(out), x)
    del out
    with torch.no_grad():
        hidden.mul_(2)  # the Linear's saved input
    with pytest.raises(RuntimeError, match="modified in place"):
        backward_weight(state)


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_split_plan_agrees_with_the_closures_of_the_captured_graph(name):
    # backward_input computes the split on node indices; graphkit.analysis.closures on the networkx graph.
    # Both walk the same graph in the same order, so index i is node "n{i}".
    from torch.autograd.graph import get_gradient_edge

    from graphkit.analysis.closures import intermediates
    from graphkit.graph.autograd_graph import capture
    from graphkit.graph.walk import walk_nodes
    from graphkit.split.backward_plan import plan_of

    module, inputs = zoo.build(name)
    outputs = _call(module, inputs)
    tensors = [t for _, t in flatten_tensors(outputs)]
    tensors = [t for t in tensors if t.requires_grad]
    stage_inputs = [t for _, t in flatten_tensors(inputs) if t.requires_grad]
    input_nodes = {get_gradient_edge(t).node for t in stage_inputs}
    plan = plan_of(walk_nodes([get_gradient_edge(t).node for t in tensors], input_nodes), input_nodes)
    graph = capture(tensors, inputs=stage_inputs)
    expected = intermediates(graph)
    assert {f"n{index}" for index, _ in plan.intermediates} == set(expected)
    for index, edges in plan.intermediates:
        assert [(nr, f"n{target}", out) for nr, target, out in edges] == [
            (e.input_nr, e.target, e.target_output_nr) for e in expected[f"n{index}"].weight_side_edges
        ]


def test_tensor_hooks_that_change_an_intermediate_gradient_are_honoured():
    # A user hook on an intermediate's output (gradient scaling, clipping) changes what flows into the
    # intermediate; the W phase must see the changed gradient, as the full backward does.
    torch.manual_seed(0)
    layer = nn.Linear(4, 3).double()

    def run(backward):
        model = copy.deepcopy(layer)
        x = torch.randn(
            2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        ).requires_grad_()
        hidden = model(x)
        hidden.register_hook(lambda grad: grad * 3.0)
        out = torch.tanh(hidden)
        backward(out, x)
        return {name: p.grad for name, p in model.named_parameters()}

    expected = run(lambda out, x: out.backward(torch.ones_like(out)))
    actual = run(lambda out, x: backward_weight(backward_input(out, torch.ones_like(out), x)))
    _assert_same(expected, actual)


def _split_and_full(build, grad_seed=0):
    """Run ``build() -> (module, inputs dict)`` twice: full backward and B then W; return both grads."""
    results = []
    for use_split in (False, True):
        module, inputs = build()
        outputs = module(**inputs)
        grad = torch.randn(
            outputs.shape, generator=torch.Generator().manual_seed(grad_seed), dtype=outputs.dtype
        )
        if use_split:
            backward_weight(backward_input(outputs, grad, inputs))
        else:
            outputs.backward(grad)
        results.append({name: p.grad for name, p in module.named_parameters()})
    return results


def test_a_tensor_hook_on_a_parameter_sees_and_changes_the_real_gradient():
    seen: list[float] = []

    def build():
        torch.manual_seed(0)
        layer = nn.Linear(4, 3).double()
        layer.bias.register_hook(lambda grad: (seen.append(grad.abs().sum().item()), grad * 10)[1])
        return layer, {"input": torch.randn(2, 4, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    assert len(seen) == 2 and seen[0] == pytest.approx(seen[1]) and seen[0] > 0
    _assert_same(expected, actual)


def test_microbatches_with_data_dependent_inner_shapes_share_no_stale_shapes():
    # the number of weight rows gathered depends on the data: same structure, different inner shapes
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(8, 6, dtype=torch.float64))
    for rows in ([0, 1, 2, 3], [4, 5]):
        x = torch.randn(len(rows), 6, dtype=torch.float64, requires_grad=True)
        out = x * weight[torch.tensor(rows)]
        weight.grad = None
        backward_weight(backward_input(out, torch.ones_like(out), x))
        expected = torch.zeros(8, 6, dtype=torch.float64)
        expected[torch.tensor(rows)] = x.detach()
        torch.testing.assert_close(weight.grad, expected)


def test_reusing_the_cotangent_buffer_or_scaling_the_input_gradient_before_w_changes_nothing():
    torch.manual_seed(0)
    layer = nn.Linear(4, 3).double()
    reference = copy.deepcopy(layer)
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    buffer = torch.randn(2, 3, dtype=torch.float64)
    reference(x.detach().requires_grad_()).backward(buffer.clone())
    out = layer(x) + 0.0  # x + b style: the input gradient is the captured gradient itself
    state = backward_input(out, buffer, x)
    buffer.copy_(torch.randn(2, 3, dtype=torch.float64))  # the pipeline receives the next microbatch
    state.input_grads[0].mul_(0.5)  # the caller scales what it sends
    backward_weight(state)
    _assert_same(
        {name: p.grad for name, p in reference.named_parameters()},
        {name: p.grad for name, p in layer.named_parameters()},
    )


def test_activation_checkpointing_is_recomputed_once_per_phase():
    from torch.utils.checkpoint import checkpoint

    calls = {"count": 0}

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            calls["count"] += 1
            return self.second(torch.tanh(self.first(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    def build():
        torch.manual_seed(0)
        return Model().double(), {"x": torch.randn(3, 4, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    _assert_same(expected, actual)
    module, inputs = build()
    out = module(**inputs)
    calls["count"] = 0
    state = backward_input(out, torch.ones_like(out), inputs)
    assert calls["count"] == 1
    backward_weight(state)
    assert calls["count"] == 2


def test_a_sparse_parameter_gets_its_sparse_gradient():
    torch.manual_seed(0)
    dense = torch.randn(5, 4, dtype=torch.float64)
    dense[dense.abs() < 0.7] = 0
    sparse = nn.Parameter(dense.to_sparse())
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    out = torch.sparse.mm(sparse, torch.tanh(x))
    backward_weight(backward_input(out, torch.ones_like(out), x))
    reference = nn.Parameter(dense.to_sparse())
    torch.sparse.mm(reference, torch.tanh(x.detach())).backward(torch.ones_like(out))
    assert sparse.grad.layout == torch.sparse_coo
    torch.testing.assert_close(sparse.grad.to_dense(), reference.grad.to_dense())


def test_a_stage_input_that_is_not_a_leaf_is_warned_about():
    base = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    hidden = base * 2
    layer = nn.Linear(4, 3).double()
    out = layer(hidden)
    with pytest.warns(UserWarning, match="not a leaf"):
        state = backward_input(out, torch.ones_like(out), hidden)
    backward_weight(state)
    assert base.grad is None


def test_a_custom_function_node_survives_the_outputs_being_dropped_between_b_and_w():
    # A pipeline drops the stage outputs after B; the W phase still calls the custom Function's Node.
    import gc

    module, inputs = _float64("custom_function")
    expected, _ = _oracle(module, inputs)
    fresh = _fresh(inputs)
    outputs = _call(module, fresh)
    state = backward_input(outputs, _cotangents(outputs), fresh)
    del outputs
    gc.collect()
    backward_weight(state)
    _assert_same(expected, {name: p.grad for name, p in module.named_parameters()})


def test_a_hook_on_a_weight_only_tensor_sees_the_real_gradient_in_w():
    # W.t() lies on the weight-only path: the W phase roots the engine there with the formula's
    # gradient, so a hook on it sees (and may change) what the full backward gives it
    seen: list[torch.Tensor] = []

    class Transposed(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 4, dtype=torch.float64))

        def forward(self, input):
            transposed = self.weight.t()
            transposed.register_hook(lambda grad: (seen.append(grad.clone()), grad * 2)[1])
            return torch.tanh(input @ transposed)

    def build():
        torch.manual_seed(0)
        return Transposed(), {"input": torch.randn(5, 4, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    assert len(seen) == 2 and seen[1].abs().sum() > 0
    torch.testing.assert_close(seen[1], seen[0], rtol=1e-12, atol=0)
    _assert_same(expected, actual)


def test_one_parameter_fed_by_many_formulas_receives_their_sum_in_one_engine_call():
    from graphkit.measure.benchmark import count_engine_calls

    def build():
        torch.manual_seed(0)
        shared = nn.Linear(6, 6).double()
        model = nn.Sequential(shared, nn.Tanh(), shared, nn.Tanh(), shared)
        return model, {"input": torch.randn(4, 6, dtype=torch.float64, requires_grad=True)}

    expected, _ = _split_and_full(build)
    module, inputs = build()
    outputs = module(**inputs)
    grad = torch.randn(outputs.shape, generator=torch.Generator().manual_seed(0), dtype=outputs.dtype)
    state = backward_input(outputs, grad, inputs)
    with count_engine_calls() as calls:
        backward_weight(state)
    assert calls == [1]
    _assert_same(expected, {name: p.grad for name, p in module.named_parameters()})


def test_hooks_in_w_get_gradients_that_require_no_grad():
    # the formulas run outside the engine; like the engine, they must not record an autograd graph
    for use_split in (False, True):
        torch.manual_seed(0)
        layer = nn.Linear(5, 3).double()
        seen = []
        layer.weight.register_hook(seen.append)
        x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
        y = layer(x)
        grad = torch.ones_like(y)
        if use_split:
            backward_weight(backward_input(y, grad, [x]))
        else:
            y.backward(grad)
        assert len(seen) == 1 and not seen[0].requires_grad and seen[0].grad_fn is None


def test_complex_output_with_a_real_parameter_gets_the_real_part():
    # PyTorch's add/addmm backward take the real part for a real input and conjugate alpha/beta
    def build(op):
        def make():
            torch.manual_seed(0)
            module = nn.Module()
            module.bias = nn.Parameter(torch.randn(3, dtype=torch.float64))
            module.scale = nn.Parameter(torch.randn(3, dtype=torch.complex128))
            module.forward = lambda input: op(input, module)
            return module, {"input": torch.randn(4, 3, dtype=torch.complex128, requires_grad=True)}

        return make

    ops = [
        lambda x, m: torch.fft.fft(x.real) + m.bias,
        lambda x, m: torch.add(x, m.scale, alpha=1j),
        lambda x, m: torch.addmm(m.scale, x, torch.ones(3, 3, dtype=torch.complex128), beta=1j),
    ]
    for op in ops:
        expected, actual = _split_and_full(build(op))
        _assert_same(expected, actual)


def test_contributions_to_one_parameter_are_summed_in_the_order_of_a_full_backward():
    # in bfloat16 the order of a sum shows: W must add the contributions as the full backward does
    def build():
        torch.manual_seed(0)
        module = nn.Module()
        module.scale = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
        module.forward = lambda input: (
            input * module.scale + input**2 * module.scale + input**3 * module.scale
        )
        return module, {"input": torch.randn(16, 64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    assert torch.equal(actual["scale"], expected["scale"])


def test_the_state_does_not_keep_input_path_tensors_alive():
    import gc
    import weakref

    torch.manual_seed(0)
    first, second = nn.Parameter(torch.randn(16, 16)), nn.Parameter(torch.randn(16, 16))
    x = torch.randn(8, 16, requires_grad=True)
    exponent = (x @ first).exp()  # saved by ExpBackward0 only: the input path, not W
    output = exponent.sin() @ second  # MmBackward0 saves sin(...) for second's gradient
    alive = weakref.ref(exponent)
    state = backward_input(output, torch.randn_like(output), [x])
    del exponent, output
    gc.collect()
    assert alive() is None, "a held activation's grad_fn kept the input path's graph alive"
    assert all(tensor.grad_fn is None for tensor in state.held_tensors())
    backward_weight(state)


def test_a_hook_on_a_weight_only_tensor_fed_by_a_node_without_formula_sees_the_real_gradient():
    # atan2 has no formula: W calls its Node, then roots the engine at W.t() with the result, so the
    # hook and retain_grad on W.t() see the real gradient, as in a full backward
    seen: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []

    class Angle(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))

        def forward(self, input):
            transposed = self.weight.t()
            transposed.retain_grad()
            transposed.register_hook(lambda grad: (seen.append(grad.clone()), grad * 2)[1])
            kept.append(transposed)
            return torch.atan2(input, transposed) + input @ transposed

    def build():
        torch.manual_seed(0)
        return Angle(), {"input": torch.randn(4, 4, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    _assert_same(expected, actual)
    torch.testing.assert_close(seen[1], seen[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(kept[1].grad, kept[0].grad, rtol=1e-12, atol=0)


def test_node_calls_compute_only_weight_side_outputs():
    # baddbmm has no formula: W calls its Node, which must compute batch2's gradient and not batch1's
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(3, 16, 8, dtype=torch.float64))
    bias = torch.zeros(3, 4, 8, dtype=torch.float64)
    x = torch.randn(3, 4, 16, dtype=torch.float64, requires_grad=True)
    output = torch.baddbmm(bias, torch.tanh(x), weight)
    state = backward_input(output, torch.ones_like(output), [x])
    assert state.num_node_calls == 1
    with FlopCounterMode(display=False) as counter:
        backward_weight(state)
    assert counter.get_total_flops() == 2 * 3 * 4 * 16 * 8  # one batched product, not two
    expected = torch.tanh(x).detach().transpose(1, 2) @ torch.ones(3, 4, 8, dtype=torch.float64)
    torch.testing.assert_close(weight.grad, expected)


def test_batch_norm_running_statistics_updated_by_the_next_forward_before_w():
    # zero-bubble order: the next microbatch's forward runs between this one's B and W, updating the
    # running statistics in place; PyTorch's Node ignores that, and so must the W phase's formula
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3)).double()
    first = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    second = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    grads = {}
    for use_split in (False, True):
        module = copy.deepcopy(model)
        output = module(first)
        grad = torch.ones_like(output)
        if use_split:
            state = backward_input(output, grad, [first])
            assert state.num_node_calls == 0, "batch norm has a formula"
            module(second)
            backward_weight(state)
        else:
            module(second)
            output.backward(grad)
        grads[use_split] = {name: p.grad for name, p in module.named_parameters()}
    _assert_same(grads[False], grads[True])


def test_a_sparse_parameter_fed_by_an_op_with_a_formula_gets_its_nodes_gradient():
    # add has a formula, but the sparse parameter's gradient layout is the Node's to choose: W calls it
    def build():
        torch.manual_seed(0)
        module = nn.Module()
        dense = torch.randn(4, 5, dtype=torch.float64) * (torch.rand(4, 5) > 0.5)
        module.shift = nn.Parameter(dense.to_sparse())
        module.forward = lambda input: torch.tanh(input) + module.shift
        return module, {"input": torch.randn(4, 5, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    assert actual["shift"].layout == expected["shift"].layout
    torch.testing.assert_close(actual["shift"].to_dense(), expected["shift"].to_dense())


def test_a_parameter_fed_directly_and_through_the_weight_only_subgraph_sums_in_full_backward_order():
    # 'shift' is the bias of an addmm (fed by the intermediate directly) and, through unsqueeze (a
    # weight-only Node), a factor of a product: its gradient must add both in the full backward's order
    def build():
        torch.manual_seed(0)
        module = nn.Module()
        module.weight = nn.Parameter(torch.randn(64, 64, dtype=torch.bfloat16))
        module.shift = nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
        module.forward = lambda input: (
            torch.addmm(module.shift, input, module.weight) * module.shift.unsqueeze(0) + input
        )
        return module, {"input": torch.randn(16, 64, dtype=torch.bfloat16, requires_grad=True)}

    expected, actual = _split_and_full(build)
    for name in ("weight", "shift"):
        assert torch.equal(actual[name], expected[name]), name


def _shared_view_model(microbatches, use_split):
    # AddBackward0 gives one gradient to two ViewBackward0 Nodes; the adds of b1 and b2 each receive a
    # view of it. A full backward copies them into .grad (the input side still holds them); so must W.
    torch.manual_seed(0)
    scale = nn.Parameter(torch.randn(8, dtype=torch.float64))
    b1 = nn.Parameter(torch.randn(4, 8, dtype=torch.float64))
    b2 = nn.Parameter(torch.randn(4, 8, dtype=torch.float64))
    for index in range(microbatches):
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(4, 8, dtype=torch.float64, generator=generator, requires_grad=True)
        a = x * scale
        y = torch.tanh((torch.tanh(a) + b1).view(32) + (torch.sin(a) + b2).view(32))
        grad = torch.randn(y.shape, dtype=torch.float64, generator=generator)
        if use_split:
            backward_weight(backward_input(y, grad, [x]))
        else:
            y.backward(grad)
    return b1.grad, b2.grad


def test_parameters_fed_views_of_one_gradient_get_gradients_of_their_own():
    for microbatches in (1, 3):
        full_b1, full_b2 = _shared_view_model(microbatches, use_split=False)
        split_b1, split_b2 = _shared_view_model(microbatches, use_split=True)
        assert split_b1.untyped_storage().data_ptr() != split_b2.untyped_storage().data_ptr()
        _assert_same({"b1": full_b1, "b2": full_b2}, {"b1": split_b1, "b2": split_b2})


def test_a_bias_fed_a_slice_of_a_large_gradient_does_not_keep_that_gradient_alive():
    sizes = []
    for use_split in (False, True):
        torch.manual_seed(0)
        scale = nn.Parameter(torch.randn(8))
        bias = nn.Parameter(torch.randn(4, 8))
        x = torch.randn(4, 8, requires_grad=True)
        wide = torch.randn(1000, 8, requires_grad=True)
        scaled = wide * scale  # created first, so W computes its gradient last
        y = torch.tanh(torch.cat([torch.tanh(x) + bias, scaled], 0))
        grad = torch.randn_like(y)
        if use_split:
            backward_weight(backward_input(y, grad, [x, wide]))
        else:
            y.backward(grad)
        sizes.append(bias.grad.untyped_storage().nbytes())
    assert sizes == [4 * 8 * 4, 4 * 8 * 4]


def test_a_parameter_only_output_cotangent_reused_before_w_changes_nothing():
    def run(use_split):
        torch.manual_seed(0)
        weight = nn.Parameter(torch.randn(4, 5, dtype=torch.float64))
        bias = nn.Parameter(torch.randn(5, dtype=torch.float64))
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        y = torch.tanh(x @ weight + bias)
        penalty = (bias * 2).tanh()  # depends on a parameter alone
        grads = [torch.randn_like(y), torch.randn_like(penalty)]
        if use_split:
            state = backward_input([y, penalty], grads, [x])
            for grad in grads:
                grad.fill_(1e3)  # receive buffers reused for the next microbatch
            backward_weight(state)
        else:
            torch.autograd.backward([y, penalty], grads)
        return {"weight": weight.grad, "bias": bias.grad}

    _assert_same(run(False), run(True))


def test_a_parameter_that_stops_requiring_grad_before_w_is_a_clear_error_and_the_state_survives():
    torch.manual_seed(0)
    layer = nn.Linear(4, 5).double()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tanh(layer(x))
    grad = torch.randn_like(y)
    expected = torch.autograd.grad(y, [layer.weight, layer.bias], grad, retain_graph=True)
    state = backward_input(y, grad, [x])
    layer.bias.requires_grad_(False)
    with pytest.raises(SplitError, match=r"shape \(5,\) stopped requiring grad"):
        backward_weight(state)
    assert layer.weight.grad is None and not state.used
    layer.bias.requires_grad_(True)
    backward_weight(state)
    _assert_same({"w": expected[0], "b": expected[1]}, {"w": layer.weight.grad, "b": layer.bias.grad})


def test_retrying_a_w_phase_that_a_hook_broke_says_what_happened():
    torch.manual_seed(0)
    layer = nn.Linear(4, 5)
    layer.bias.register_hook(lambda grad: (_ for _ in ()).throw(ValueError("hook failed")))
    x = torch.randn(3, 4, requires_grad=True)
    y = layer(x)
    state = backward_input(y, torch.ones_like(y), [x])
    with pytest.raises(ValueError, match="hook failed"):
        backward_weight(state)
    with pytest.raises(SplitError, match=r"already ran and failed \(ValueError: hook failed\)"):
        backward_weight(state)


def test_a_custom_function_that_receives_no_gradient_still_gives_its_parameter_one():
    # a full backward runs the custom backward on zeros (materialized grads); its parameter gets zeros
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, p):
            ctx.save_for_backward(x, p)
            return x * p

        @staticmethod
        def backward(ctx, grad):
            x, p = ctx.saved_tensors
            return grad * p, (grad * x).sum(0) + 1.0  # + 1: a gradient even from a zero cotangent

    class Stop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    def build():
        torch.manual_seed(0)
        module = nn.Module()
        module.scale = nn.Parameter(torch.randn(5, dtype=torch.float64))
        module.bias = nn.Parameter(torch.randn(5, dtype=torch.float64))
        module.forward = lambda input: torch.tanh(Stop.apply(Scale.apply(input, module.scale)) + module.bias)
        return module, {"input": torch.randn(3, 5, dtype=torch.float64, requires_grad=True)}

    expected, actual = _split_and_full(build)
    assert torch.equal(expected["scale"], torch.ones(5, dtype=torch.float64))
    _assert_same(expected, actual)


def test_wrapper_tensor_subclass_parameters_and_cotangents_are_split_like_plain_tensors():
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")

    def run(use_split):
        torch.manual_seed(0)
        scale = nn.Parameter(two_tensor.TwoTensor(torch.randn(5), torch.randn(5)))
        x = torch.randn(3, 5, requires_grad=True)
        y = torch.tanh(x * scale)
        grad = two_tensor.TwoTensor(torch.randn(3, 5), torch.randn(3, 5))
        if use_split:
            state = backward_input(y, grad, [x])
            input_grad = state.input_grads[0]
            backward_weight(state)
        else:
            y.backward(grad)
            input_grad = x.grad
        return scale.grad.a, scale.grad.b, input_grad.a, input_grad.b

    for expected, actual in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def test_a_parameter_fed_directly_and_through_a_view_sums_in_full_backward_order():
    # 'bias' is the bias of two addmm (fed directly) and, through view (a weight-only Node), an
    # addend in between: three contributions whose bfloat16 sum shows any change of order
    def build(seed):
        def make():
            generator = torch.Generator().manual_seed(seed)
            module = nn.Module()
            module.weight = nn.Parameter(torch.randn(64, 64, generator=generator).to(torch.bfloat16) * 0.1)
            module.bias = nn.Parameter(torch.randn(64, generator=generator).to(torch.bfloat16))

            def forward(input):
                hidden = torch.tanh(nn.functional.linear(input, module.weight, module.bias))
                hidden = torch.tanh(hidden + module.bias.view(1, 64))
                return torch.tanh(nn.functional.linear(hidden, module.weight, module.bias))

            module.forward = forward
            input = torch.randn(32, 64, generator=generator).to(torch.bfloat16).requires_grad_()
            return module, {"input": input}

        return make

    for seed in range(4):
        expected, actual = _split_and_full(build(seed), grad_seed=seed)
        for name in ("weight", "bias"):
            assert torch.equal(actual[name], expected[name]), (seed, name)


def test_hooks_on_a_parameter_fed_directly_and_through_a_view_see_the_full_backward_gradient():
    def run(use_split):
        torch.manual_seed(0)
        weight = nn.Parameter(torch.randn(6, 6, dtype=torch.float64))
        bias = nn.Parameter(torch.randn(6, dtype=torch.float64))
        seen, accumulated = [], []
        bias.register_hook(lambda grad: seen.append(grad.clone()) or grad * 3)
        bias.register_post_accumulate_grad_hook(lambda parameter: accumulated.append(parameter.grad.clone()))
        for step in range(2):
            x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
            hidden = torch.tanh(nn.functional.linear(x, weight, bias) + bias.view(1, 6))
            y = torch.tanh(nn.functional.linear(hidden, weight, bias))
            grad = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(step))
            if use_split:
                backward_weight(backward_input(y, grad, [x]))
            else:
                y.backward(grad)
        return seen, accumulated, bias.grad

    full, split_run = run(False), run(True)
    assert len(split_run[0]) == len(full[0]) == 2 and len(split_run[1]) == len(full[1]) == 2
    for expected, actual in zip(
        full[0] + full[1] + [full[2]], split_run[0] + split_run[1] + [split_run[2]], strict=True
    ):
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


# --- custom Functions see the phase in ctx.needs_input_grad ------------------------------------------------
class HonestScale(torch.autograd.Function):
    """``x * scale``, computing only the gradients ``ctx.needs_input_grad`` asks for."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        x, scale = ctx.saved_tensors
        grad_x = grad * scale if ctx.needs_input_grad[0] else None
        grad_scale = (grad * x).sum(0) if ctx.needs_input_grad[1] else None
        return grad_x, grad_scale


def _full_then_split(build, inputs_requiring_grad):
    """Parameter and input gradients of a full backward and of B then W, each on a fresh forward."""
    results = []
    for split_run in (False, True):
        parameters, inputs, output = build()
        grad = torch.randn(output.shape, generator=torch.Generator().manual_seed(1), dtype=output.dtype)
        if split_run:
            state = backward_input(output, grad, inputs)
            backward_weight(state)
            input_grads = state.input_grads
        else:
            input_grads = torch.autograd.grad(output, inputs, grad, retain_graph=True) if inputs else ()
            output.backward(grad)
        results.append(([p.grad for p in parameters], list(input_grads)))
    return results


def test_a_custom_function_whose_first_argument_is_weight_only_gives_the_embedding_its_gradient():
    def build():
        torch.manual_seed(0)
        embedding = nn.Parameter(torch.randn(10, 4, dtype=torch.float64))
        scale = nn.Parameter(torch.randn(4, dtype=torch.float64))
        return [embedding, scale], [], HonestScale.apply(embedding[torch.tensor([1, 2, 3])], scale)

    (expected, _), (got, _) = _full_then_split(build, False)
    for reference, split_grad in zip(expected, got, strict=True):
        assert split_grad is not None
        torch.testing.assert_close(split_grad, reference, rtol=1e-12, atol=0)


def test_a_custom_function_mixing_the_input_path_and_a_weight_expression_is_exact():
    calls = []

    class Recording(HonestScale):
        @staticmethod
        def backward(ctx, grad):
            calls.append(tuple(ctx.needs_input_grad))
            return HonestScale.backward(ctx, grad)

    def build():
        torch.manual_seed(0)
        weight = nn.Parameter(torch.randn(4, dtype=torch.float64))
        x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
        return [weight], [x], Recording.apply(torch.tanh(x), weight * 2)

    (expected, expected_inputs), (got, got_inputs) = _full_then_split(build, True)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=0)
    torch.testing.assert_close(got_inputs[0], expected_inputs[0], rtol=1e-12, atol=0)
    assert calls[-2:] == [(True, False), (False, True)]


def test_two_threads_running_split_backwards_see_only_their_own_phase():
    import threading

    errors: list[str] = []

    def worker(seed):
        for step in range(30):
            torch.manual_seed(seed * 1000 + step)
            weight = nn.Parameter(torch.randn(4, dtype=torch.float64))
            x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
            if seed == 0:  # this thread runs ordinary backwards: every gradient is asked for
                out = HonestScale.apply(torch.tanh(x), weight)
                grad_x, grad_w = torch.autograd.grad(out, (x, weight), torch.ones_like(out))
                if grad_x is None or grad_w is None:
                    errors.append("a plain torch.autograd.grad saw a phase")
                continue
            out = HonestScale.apply(torch.tanh(x), weight)
            state = backward_input(out, torch.ones_like(out), x)
            backward_weight(state)
            expected = (torch.tanh(x).detach()).sum(0)
            if weight.grad is None or not torch.allclose(weight.grad, expected, rtol=1e-12, atol=0):
                errors.append(f"thread {seed} step {step}: wrong weight gradient")
            expected_x = weight.detach() * (1 - torch.tanh(x.detach()) ** 2)
            if not torch.allclose(state.input_grads[0], expected_x.expand(3, 4), rtol=1e-12, atol=0):
                errors.append(f"thread {seed} step {step}: wrong input gradient")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []


# --- cotangents matched by key -----------------------------------------------------------------------------
def test_dict_cotangents_are_matched_to_outputs_by_key_also_nested():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(3, dtype=torch.float64))
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    ga, gb, gc = (torch.randn(3, dtype=torch.float64) for _ in range(3))
    y = x * weight
    outputs = {"a": [y, 2 * y], "b": 3 * y}
    state = backward_input(outputs, {"b": gc, "a": [ga, gb]}, [x])
    backward_weight(state)
    cotangent = ga + 2 * gb + 3 * gc
    torch.testing.assert_close(state.input_grads[0], cotangent * weight.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(weight.grad, cotangent * x.detach(), rtol=1e-12, atol=0)
    y = x * weight
    with pytest.raises(graphkit.GraphkitInputError, match=r"no cotangent for \['a'\].*\['c'\]"):
        backward_input({"a": y, "b": 3 * y}, {"c": ga, "b": gb}, [x])


# --- another backward between B and W ----------------------------------------------------------------------
@pytest.mark.parametrize("between", ["ordinary backward", "retained backward", "second B"])
def test_another_backward_between_b_and_w_is_refused_instead_of_counted_twice(between):
    torch.manual_seed(0)
    layer = nn.Linear(3, 3).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    grad = torch.ones_like(out)
    state = backward_input(out, grad, [x])
    if between == "second B":
        other = backward_input(out, grad, [x])
        backward_weight(other)  # the later state is the one that counts
    else:
        out.backward(grad, retain_graph=between == "retained backward")
    expected = (grad.t() @ x.detach()).clone()
    torch.testing.assert_close(layer.weight.grad, expected, rtol=1e-12, atol=0)
    with pytest.raises(GraphFreedError, match="another backward ran from"):
        backward_weight(state)
    torch.testing.assert_close(layer.weight.grad, expected, rtol=1e-12, atol=0)  # counted once


def test_a_state_dropped_without_w_removes_its_hooks():
    import gc

    layer = nn.Linear(3, 3).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    out = layer(x)
    state = backward_input(out, torch.ones_like(out), [x])
    handles = list(state._watch_handles)
    assert handles
    del state
    gc.collect()
    out.backward(torch.ones_like(out))  # an ordinary backward afterwards, as if graphkit never ran
    torch.testing.assert_close(layer.weight.grad, torch.ones(3, 2, dtype=torch.float64) @ x.detach())


# --- saved tensors modified in place between B and W -------------------------------------------------------
def _eval_batch_norm_stage() -> nn.Module:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).double()
    with torch.no_grad():
        module[1].running_var.uniform_(0.5, 2)
    return module.eval()


@pytest.mark.parametrize("modified", ["running_var", "weight"])
def test_an_eval_batch_norm_tensor_changed_in_place_before_w_raises_like_a_full_backward(modified):
    # a hook on the batch norm's weight keeps its reductions in W (B would run the hook twice), so W
    # reads the batch norm's saved tensors and must refuse changed ones
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    module = _eval_batch_norm_stage()
    out = module(x)
    with torch.no_grad():
        getattr(module[1], modified).mul_(2)  # another microbatch's update, an optimizer step
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(torch.ones_like(out))  # the oracle refuses too
    module = _eval_batch_norm_stage()
    module[1].weight.register_hook(lambda grad: grad)
    out = module(x)
    state = backward_input(out, torch.ones_like(out), [x])
    assert state._computed_in_b == []
    with torch.no_grad():
        getattr(module[1], modified).mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        backward_weight(state)


@pytest.mark.parametrize("modified", ["running_var", "weight"])
def test_an_eval_batch_norm_changed_in_place_after_b_keeps_the_gradients_b_finished(modified):
    # without hooks, B computes the batch norm's weight and bias gradients in its own Node call, from
    # the tensors as they were then; W reads nothing of the batch norm, so a change after B is harmless
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(5, 4, dtype=torch.float64)
    oracle = _eval_batch_norm_stage()
    oracle(x).backward(cotangent)
    module = _eval_batch_norm_stage()
    state = backward_input(module(x), cotangent, [x])
    assert len(state._computed_in_b) == 2  # the batch norm's weight and bias
    with torch.no_grad():
        getattr(module[1], modified).mul_(2)
    backward_weight(state)
    for name, parameter in oracle.named_parameters():
        assert torch.equal(module.get_parameter(name).grad, parameter.grad), name
    assert torch.equal(state.input_grads[0], x.grad)


# --- a Tensor-subclass stage input --------------------------------------------------------------------------
class _Tagged(torch.Tensor):
    pass


def test_a_tensor_subclass_stage_input_gets_its_gradient_and_is_no_weight():
    torch.manual_seed(0)
    layer = nn.Linear(3, 4).double()
    data = torch.randn(2, 3, dtype=torch.float64)
    grad = torch.randn(2, 4, dtype=torch.float64)
    x = data.as_subclass(_Tagged).requires_grad_()
    state = backward_input(layer(x), grad, [x])
    backward_weight(state)
    assert state.input_grads[0] is not None
    torch.testing.assert_close(state.input_grads[0].as_subclass(torch.Tensor), grad @ layer.weight.detach())
    torch.testing.assert_close(layer.weight.grad, grad.t() @ data, rtol=1e-12, atol=0)
    assert x.grad is None


# --- set_materialize_grads(False) and non-differentiable outputs -------------------------------------------
class _NotMaterialized(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, weight)
        return x * weight, x + weight

    @staticmethod
    def backward(ctx, grad_product, grad_sum):
        x, weight = ctx.saved_tensors
        if grad_product is None and grad_sum is None:
            return None, None
        grad_product = torch.zeros_like(x) if grad_product is None else grad_product
        grad_sum = torch.zeros_like(x) if grad_sum is None else grad_sum
        return grad_product * weight + grad_sum, grad_product * x + grad_sum


class _Stop(torch.autograd.Function):
    """Identity whose backward passes no gradient on (None)."""

    @staticmethod
    def forward(ctx, tensor):
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


class _WithIndex(torch.autograd.Function):
    """``x * weight`` and a non-differentiable float index; the backward adds the index's gradient."""

    shapes: list = []

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        index = (x * weight).argmax(-1, keepdim=True).to(x.dtype).expand_as(x).clone()
        ctx.mark_non_differentiable(index)
        return x * weight, index

    @staticmethod
    def backward(ctx, grad, grad_index):
        _WithIndex.shapes.append(tuple(grad_index.shape))
        x, weight = ctx.saved_tensors
        return grad * weight + grad_index, grad * x + grad_index


@pytest.mark.parametrize("case", ["not materialized", "non-differentiable output"])
def test_gradients_a_custom_function_receives_in_w_are_those_of_a_full_backward(case):
    def build():
        torch.manual_seed(0)
        weight = nn.Parameter(torch.randn(3, dtype=torch.float64))
        x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
        hidden = torch.tanh(x)
        if case == "not materialized":
            product, _ = _NotMaterialized.apply(hidden, weight)
            return [weight], [x], _Stop.apply(product) + hidden  # the Function receives no gradient
        product, _ = _WithIndex.apply(hidden, weight)
        return [weight], [x], product

    _WithIndex.shapes.clear()
    (expected, expected_inputs), (got, got_inputs) = _full_then_split(build, True)
    if case == "not materialized":
        assert expected[0] is None and got[0] is None, "a full backward leaves .grad None"
    else:
        torch.testing.assert_close(got[0], expected[0], rtol=1e-12, atol=0)
        assert set(_WithIndex.shapes) == {(2, 3)}, "the index's zero gradient has its shape in every phase"
    torch.testing.assert_close(got_inputs[0], expected_inputs[0], rtol=1e-12, atol=0)


def test_a_backward_of_another_loss_from_inside_the_stage_between_b_and_w_adds_up():
    def run(split_run):
        torch.manual_seed(0)
        first, second = nn.Linear(3, 3).double(), nn.Linear(3, 2).double()
        x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
        hidden = torch.tanh(first(x))
        out = second(hidden)
        grad = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        if split_run:
            state = backward_input(out, grad, [x])
            hidden.pow(2).sum().backward(retain_graph=True)  # an auxiliary loss on an activation
            backward_weight(state)
        else:
            torch.autograd.backward([out, hidden.pow(2).sum()], [grad, None])
        return [first.weight.grad, first.bias.grad, second.weight.grad]

    for expected, got in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
