"""``backward_weight(state, flush_bytes=N)`` hands the weight gradients to the engine in several calls:
never splitting a sum.

By default W runs one engine call; the tests here mostly pass ``flush_bytes=0``, which makes W call the
engine at every flush point of the plan, and check the gradients bit for bit against PyTorch's full
backward, the flush points against hand-worked graphs, and the number of engine calls.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from torch import nn
from torch.autograd.graph import register_multi_grad_hook

from graphkit.graph import _autograd
from graphkit.models import zoo
from graphkit.split import backward as split_backward
from graphkit.split.backward import backward_input, backward_weight
from graphkit.split.backward_plan import weight_flush_points


def _grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone() for name, p in module.named_parameters()}


def _fresh(inputs):
    if isinstance(inputs, dict):
        return {name: t.detach().clone().requires_grad_(t.requires_grad) for name, t in inputs.items()}
    return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)


def _call(module: nn.Module, inputs):
    outputs = module(**inputs) if isinstance(inputs, dict) else module(*inputs)
    if isinstance(outputs, dict):
        outputs = tuple(outputs.values())
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [output for output in outputs if output.requires_grad]


def _full_and_split(module: nn.Module, inputs, flush_bytes: int | None = 0, steps: int = 2):
    """Full backward on one copy, B then W on another (W flushing at ``flush_bytes``), ``steps`` times each
    (so ``.grad`` accumulates); returns both gradient dicts and the roots of each W engine call."""
    reference = copy.deepcopy(module)
    calls = []
    original = _autograd.run_engine_backward

    def counting(*args, **kwargs):
        calls.append(len(args[0]))
        return original(*args, **kwargs)

    for _ in range(steps):
        outputs = _call(reference, _fresh(inputs))
        torch.autograd.backward(outputs, [torch.ones_like(output) for output in outputs])
        fresh = _fresh(inputs)
        outputs = _call(module, fresh)
        state = backward_input(outputs, [torch.ones_like(output) for output in outputs], fresh)
        with mock.patch.object(_autograd, "run_engine_backward", counting):
            backward_weight(state, flush_bytes=flush_bytes)
    return _grads(reference), _grads(module), calls


def _assert_bitwise(expected: dict, actual: dict) -> None:
    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        assert (grad is None) == (actual[name] is None), name
        if grad is not None:
            assert torch.equal(actual[name], grad), name


class _Sequential(nn.Module):
    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _mlp(dtype=torch.float32) -> tuple[nn.Module, dict]:
    torch.manual_seed(0)
    module = _Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)).to(dtype)
    return module, {"x": torch.randn(5, 8, dtype=dtype, requires_grad=True)}


def _tied(dtype=torch.float32) -> tuple[nn.Module, dict]:
    # layer 0 used first and last: its weight gets two contributions, from the last and the first
    # intermediate W reaches, with layer 1 between them
    torch.manual_seed(0)
    first, middle = nn.Linear(16, 16), nn.Linear(16, 16)
    module = _Sequential(first, middle, first).to(dtype)
    return module, {"x": torch.randn(7, 16, dtype=dtype, requires_grad=True)}


def test_an_mlp_may_flush_after_every_intermediate_and_its_gradients_are_bitwise_those_of_a_full_backward():
    module, inputs = _mlp()
    expected, actual, calls = _full_and_split(module, inputs)
    _assert_bitwise(expected, actual)
    assert calls == [2, 2, 2] * 2  # weight and bias of one layer per call, for each of the two steps


def test_by_default_w_runs_one_engine_call_and_a_multi_grad_hook_fires_once():
    # 1 MiB weights: any flush threshold up to SUGGESTED_FLUSH_BYTES would split these calls
    torch.manual_seed(0)
    module = _Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 512))
    inputs = {"x": torch.randn(4, 512, requires_grad=True)}
    fired = []
    register_multi_grad_hook(
        tuple(module.parameters()), lambda grads: fired.append(sum(g is not None for g in grads))
    )
    expected, actual, calls = _full_and_split(module, inputs, flush_bytes=None, steps=1)
    _assert_bitwise(expected, actual)
    assert calls == [6]
    assert fired == [6]  # W of the module the hook is on (its full-backward twin is a copy without it)


def test_with_flush_bytes_a_multi_grad_hook_fires_once_per_engine_call_as_documented():
    torch.manual_seed(0)
    module = _Sequential(nn.Linear(512, 512), nn.Linear(512, 512), nn.Linear(512, 512))
    fired = []
    register_multi_grad_hook(
        tuple(module.parameters()), lambda grads: fired.append(sum(g is not None for g in grads))
    )
    x = torch.randn(4, 512, requires_grad=True)
    outputs = module(x)
    state = backward_input(outputs, torch.ones_like(outputs), x)
    backward_weight(state, flush_bytes=split_backward.SUGGESTED_FLUSH_BYTES // 8)
    assert fired == [2, 2, 2]


@pytest.mark.parametrize("value", [-1, 1.5, "8MiB"])
def test_a_flush_threshold_that_is_not_a_byte_count_is_refused(value):
    module, inputs = _mlp()
    outputs = module(**inputs)
    state = backward_input(outputs, torch.ones_like(outputs), inputs)
    with pytest.raises(ValueError, match="flush_bytes"):
        backward_weight(state, flush_bytes=value)
    backward_weight(state)  # the state is still usable


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tied_layer_keeps_every_gradient_of_its_parameters_in_one_engine_call(dtype):
    module, inputs = _tied(dtype)
    expected, actual, calls = _full_and_split(module, inputs)
    # in bfloat16 any other order or grouping of the two contributions to the tied weight shows
    _assert_bitwise(expected, actual)
    assert calls == [6, 6]  # the tied layer is fed by the first and the last intermediate: no flush point


def test_flush_points_of_hand_worked_plans():
    # intermediates at positions 0, 1, 2 feeding weight-only parts: {10}, {11, 12}, {13}; edges of the
    # weight-only subgraph join 12 with 13 (producer, consumer, output_nr, input_nr)
    intermediates = [
        (0, ((1, 10, 0),)),
        (1, ((1, 11, 0), (2, 12, 0))),
        (2, ((1, 13, 0),)),
    ]
    weight_only = bytearray(20)
    for index in (10, 11, 12, 13, 14):
        weight_only[index] = 1
    assert weight_flush_points(intermediates, weight_only, []) == {0, 1, 2}
    joined = [(12, 14, 0, 0), (13, 14, 0, 1)]  # 14 consumes both: one part fed at positions 1 and 2
    assert weight_flush_points(intermediates, weight_only, joined) == {0, 2}
    # an edge into the input path (5 is not weight-only) joins nothing
    assert weight_flush_points(intermediates, weight_only, [(10, 5, 0, 0), (13, 5, 0, 0)]) == {0, 1, 2}
    assert weight_flush_points([], weight_only, []) == frozenset()


def test_post_accumulate_grad_hooks_and_tensor_hooks_fire_once_per_parameter_when_w_flushes():
    module, inputs = _tied()
    accumulated: list[str] = []
    seen: list[str] = []
    for name, parameter in module.named_parameters():
        parameter.register_post_accumulate_grad_hook(lambda _p, name=name: accumulated.append(name))
        parameter.register_hook(lambda grad, name=name: seen.append(name))
    fresh = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    outputs = module(**fresh)
    state = backward_input(outputs, torch.ones_like(outputs), fresh)
    backward_weight(state, flush_bytes=0)
    names = sorted(name for name, _ in module.named_parameters())
    assert sorted(accumulated) == names and sorted(seen) == names


class _ParameterOnlyPart(nn.Module):
    """Adds ``second.weight.sum()`` (a part depending on a parameter alone) to the output, or returns it
    as an output of its own (``separate``)."""

    def __init__(self, separate: bool) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)
        self.separate = separate

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.tanh(self.second(torch.tanh(self.first(x))))
        if self.separate:
            return hidden, self.second.weight.sum()
        return hidden + self.second.weight.sum()


def test_a_parameter_only_part_is_flushed_with_the_layer_of_its_parameter():
    torch.manual_seed(0)
    expected, actual, calls = _full_and_split(
        _ParameterOnlyPart(separate=False), {"x": torch.randn(3, 4, requires_grad=True)}
    )
    _assert_bitwise(expected, actual)
    # the sum's Node and second's weight.t() both feed second.weight: one call with second's bias
    assert calls == [3, 2] * 2


def test_a_parameter_only_output_keeps_w_in_one_engine_call():
    torch.manual_seed(0)
    expected, actual, calls = _full_and_split(
        _ParameterOnlyPart(separate=True), {"x": torch.randn(3, 4, requires_grad=True)}
    )
    _assert_bitwise(expected, actual)
    assert calls == [5, 5]  # the output's own root joins the one call of each step


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_every_zoo_model_flushing_at_every_point_is_bitwise_a_full_backward(name):
    module, inputs = zoo.build(name)
    expected, actual, calls = _full_and_split(module, inputs, steps=1)
    _assert_bitwise(expected, actual)
    assert calls and sum(calls) >= len(calls)


def test_a_multi_grad_hook_on_the_one_weight_side_tensor_fires_in_w_as_in_a_full_backward():
    # W's engine call then has one root, the hooked tensor's own Node: without a second root the engine
    # says that Node will not run, and a mode="all" hook expects nothing and never fires
    fired = {}
    for mode in ("full", "split"):
        torch.manual_seed(0)
        layer = nn.Linear(8, 8, bias=False)
        x = torch.randn(4, 8, requires_grad=True)
        transposed = layer.weight.t()
        fired[mode] = []
        register_multi_grad_hook(
            [transposed], lambda grads, log=fired[mode]: log.append(grads[0].clone()), mode="all"
        )
        output = torch.tanh(x @ transposed)
        if mode == "full":
            output.backward(torch.ones_like(output))
        else:
            backward_weight(backward_input(output, torch.ones_like(output), x))
    assert len(fired["full"]) == len(fired["split"]) == 1
    assert torch.equal(fired["full"][0], fired["split"][0])
