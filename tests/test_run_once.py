"""Reentrant checkpoints and torch.compile'd regions under the split: run once, in B, and exact against a
full backward (float64), with recomputations and FLOPs counted."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphkit.measure.flops import FlopCounter
from graphkit.split.backward import backward_input, backward_weight
from tests.opaque_models import FORWARDS, CompiledStage, ReentrantStage


def _data(requires_grad: bool = True):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=generator, dtype=torch.float64).requires_grad_(requires_grad)
    return x, torch.randn(5, 8, generator=generator, dtype=torch.float64)


def _full(module, requires_grad: bool = True):
    module = copy.deepcopy(module)
    x, grad = _data(requires_grad)
    out = module(x)
    FORWARDS["count"] = 0
    with FlopCounter() as counter:
        out.backward(grad)
    grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    return grads, x.grad, FORWARDS["count"], counter.get_total_flops()


def _split(module, requires_grad: bool = True):
    x, grad = _data(requires_grad)
    out = module(x)
    FORWARDS["count"] = 0
    with FlopCounter() as b_counter, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = backward_input(out, grad, x if requires_grad else None)
    after_b = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    b_calls = FORWARDS["count"]
    del out
    with FlopCounter() as w_counter:
        backward_weight(state)
    return {
        "grads": {name: p.grad for name, p in module.named_parameters() if p.grad is not None},
        "after_b": after_b,
        "input_grad": state.input_grads[0] if requires_grad else None,
        "warnings": [str(record.message) for record in caught],
        "b": b_calls,
        "w": FORWARDS["count"] - b_calls,
        "flops": (b_counter.get_total_flops(), w_counter.get_total_flops()),
    }


def _assert_exact(expected, actual):
    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=1e-12, atol=1e-12, msg=name)


def test_reentrant_checkpoints_give_exact_gradients_and_their_weights_get_them_in_b_once():
    torch.manual_seed(0)
    stage = ReentrantStage().double()
    expected, expected_input, full_calls, full_flops = _full(stage)
    result = _split(stage)
    _assert_exact(expected, result["grads"])
    torch.testing.assert_close(result["input_grad"], expected_input, rtol=1e-12, atol=1e-12)
    assert any("reentrant activation checkpoint" in message for message in result["warnings"])
    # the blocks' parameters got their gradients in B, complete; W adds nothing to them
    in_blocks = {name for name in expected if name.startswith("blocks.")}
    assert set(result["after_b"]) == in_blocks
    _assert_exact({name: expected[name] for name in in_blocks}, result["after_b"])
    # each region recomputed once, in B; no FLOP twice
    assert full_calls == 4 and (result["b"], result["w"]) == (4, 0)
    assert sum(result["flops"]) == full_flops


def _tanh_product(h: torch.Tensor, weight: torch.Tensor, inner: nn.Linear) -> torch.Tensor:
    return torch.tanh(inner(h) @ weight)


class ExplicitWeightStage(nn.Module):
    """A reentrant region that takes a parameter as an argument (a weight-side edge of its Node) and
    uses another one from its closure."""

    def __init__(self) -> None:
        super().__init__()
        self.before = nn.Linear(8, 8)
        self.inner = nn.Linear(8, 8)
        self.weight = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(_tanh_product, self.before(x), self.weight, self.inner, use_reentrant=True)


def test_a_reentrant_region_with_a_weight_argument_gives_it_the_gradient_from_b_exactly_once():
    torch.manual_seed(0)
    stage = ExplicitWeightStage().double()
    expected, expected_input, _, full_flops = _full(stage)
    result = _split(stage)
    _assert_exact(expected, result["grads"])
    torch.testing.assert_close(result["input_grad"], expected_input, rtol=1e-12, atol=1e-12)
    assert "weight" not in result["after_b"]  # the argument's gradient waits for W, like any weight
    assert sum(result["flops"]) == full_flops


def test_a_reentrant_checkpoint_in_a_stage_without_inputs_runs_in_w():
    torch.manual_seed(0)
    stage = ReentrantStage().double()
    expected, _, _, full_flops = _full(stage, requires_grad=False)
    result = _split(stage, requires_grad=False)
    _assert_exact(expected, result["grads"])
    assert (result["b"], result["w"]) == (0, 4)
    assert sum(result["flops"]) == full_flops


class _NeedsInputGradReading(torch.autograd.Function):
    """Computes only what ctx.needs_input_grad asks for; records the flags each backward saw."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        _NeedsInputGradReading.seen.append(tuple(ctx.needs_input_grad))
        grad_x = grad @ weight.t() if ctx.needs_input_grad[0] else None
        grad_weight = x.t() @ grad if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


def test_inside_a_reentrant_region_a_custom_function_is_asked_for_every_gradient_once():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)

    def region(h):
        return torch.tanh(_NeedsInputGradReading.apply(h, weight))

    out = checkpoint(region, x * 2, use_reentrant=True)
    grad = torch.randn_like(out)
    _NeedsInputGradReading.seen = []
    with pytest.warns(UserWarning, match="reentrant"):
        state = backward_input(out, grad, x)
    # the nested backward is a full one over the recomputed region: both gradients, in B
    assert _NeedsInputGradReading.seen == [(True, True)]
    assert weight.grad is not None
    backward_weight(state)
    assert _NeedsInputGradReading.seen == [(True, True)]  # W does not run the region again
    reference = weight.detach().clone().requires_grad_()
    reference_x = x.detach().clone().requires_grad_()
    torch.tanh((reference_x * 2) @ reference).backward(grad)
    torch.testing.assert_close(weight.grad, reference.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(state.input_grads[0], reference_x.grad, rtol=1e-12, atol=1e-12)


# --- torch.compile'd submodules ---------------------------------------------------------------------------
def _compiled_node(out: torch.Tensor):
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if type(node).__name__ == "CompiledFunctionBackward":
            return node
        stack.extend(producer for producer, _ in node.next_functions)
    raise AssertionError("no compiled region in the graph")


def _check_compiled_stage(backend: str, dtype: torch.dtype, tolerance: float) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    stage = CompiledStage(backend).to(dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=generator).to(dtype)
    grad = torch.randn(5, 8, generator=generator).to(dtype)
    # a full backward first: the compiled backward is then built with donated buffers, which PyTorch
    # refuses under retain_graph=True (what B needs)
    reference_input = x.clone().requires_grad_()
    out = stage(reference_input)
    node_class = _compiled_node(out)._forward_cls
    with FlopCounter() as full_counter:
        out.backward(grad)
    assert node_class.metadata.bw_donated_idxs, "the compiled backward should donate buffers"
    expected = {name: p.grad.clone() for name, p in stage.named_parameters() if p.grad is not None}
    stage.zero_grad(set_to_none=True)
    split_input = x.clone().requires_grad_()
    out = stage(split_input)
    with FlopCounter() as b_counter:
        state = backward_input(out, grad, split_input)
    assert all(p.grad is None for p in stage.parameters())
    del out
    with FlopCounter() as w_counter:
        backward_weight(state)
    actual = {name: p.grad for name, p in stage.named_parameters() if p.grad is not None}
    assert actual.keys() == expected.keys()
    for name, reference in expected.items():
        torch.testing.assert_close(actual[name], reference, rtol=tolerance, atol=tolerance, msg=name)
    torch.testing.assert_close(state.input_grads[0], reference_input.grad, rtol=tolerance, atol=tolerance)
    # the compiled backward runs once, in B (it computes its weight gradients there too): no FLOP twice
    assert b_counter.get_total_flops() + w_counter.get_total_flops() == full_counter.get_total_flops()


def test_a_compiled_submodule_with_donated_buffers_gives_exact_gradients():
    _check_compiled_stage("aot_eager", torch.float64, 1e-12)


@pytest.mark.slow
def test_an_inductor_compiled_submodule_gives_exact_gradients():
    _check_compiled_stage("inductor", torch.float32, 1e-5)


def test_overlapping_b_calls_restore_the_checkpoint_check_once_the_last_one_ends() -> None:
    """Two threads inside B with a reentrant checkpoint, the first to start ending first: PyTorch's
    ``_is_checkpoint_valid`` is relaxed while either runs and is PyTorch's own again afterwards."""
    import threading

    from graphkit.split.run_once import _checkpoint_valid

    original = torch.autograd._is_checkpoint_valid
    first_inside, second_inside, first_left = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with _checkpoint_valid():
            first_inside.set()
            second_inside.wait(timeout=30)
        first_left.set()

    def second() -> None:
        first_inside.wait(timeout=30)
        with _checkpoint_valid():
            second_inside.set()
            first_left.wait(timeout=30)
            seen["relaxed after the first left"] = torch.autograd._is_checkpoint_valid()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert seen == {"relaxed after the first left": True}
    assert torch.autograd._is_checkpoint_valid is original
