"""graphkit's drop-ins against PyTorch's own: ``stage_backward_input`` / ``stage_backward_weight`` on the
caller's side, ``GradientEdge`` stage outputs, and ``PipelineStage(dw_builder=...)``.

The ``dw_builder`` tests follow PyTorch's ``test_custom_dw_with_fb_schedule`` (test_schedule.py) and
``test_custom_dw_errors`` (test_stage.py) in ``test/distributed/pipelining``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge
from torch.distributed.pipelining import _backward as torch_backward
from torch.distributed.pipelining import schedules as torch_schedules

from graphkit import backward_input, backward_weight
from graphkit.graph.tensors import GraphkitInputError
from graphkit.pipelining import PipelineStage, stage_backward_input, stage_backward_weight
from graphkit.pipelining.stage_backward import split_input_gradients

pytestmark = pytest.mark.usefixtures("world_of_one")


def _stage(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 4)).double()


def _input() -> torch.Tensor:
    return torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _cotangent() -> torch.Tensor:
    return torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))


def _full(stage: nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    reference = copy.deepcopy(stage)
    x = _input().requires_grad_()
    reference(x).backward(_cotangent())
    return x.grad, [parameter.grad for parameter in reference.parameters()]


# --- GradientEdge stage outputs ---------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["split_input_gradients", "stage_backward_input", "backward_input"])
def test_b_and_w_from_gradient_edge_outputs_are_a_full_backwards(entry: str) -> None:
    stage = _stage()
    expected_input, expected_params = _full(stage)
    x = _input().requires_grad_()
    output = stage(x)
    edge = get_gradient_edge(output)
    del output  # released, as a newer PyTorch stage does after sending it
    if entry == "backward_input":
        state = backward_input([edge], [_cotangent()], [x])
        grad = state.input_grads[0]
        backward_weight(state)
    elif entry == "split_input_gradients":
        (grad,), state = split_input_gradients([edge], [_cotangent()], [x])
        assert state is not None
        backward_weight(state)
    else:
        (grad,), groups = stage_backward_input([edge], [_cotangent()], [x], stage.parameters())
        stage_backward_weight(stage.parameters(), groups)
    assert torch.equal(grad, expected_input)
    for parameter, expected in zip(stage.parameters(), expected_params, strict=True):
        assert torch.equal(parameter.grad, expected)


def test_gradient_edge_and_tensor_outputs_mix_and_a_released_output_without_grad_is_none() -> None:
    torch.manual_seed(0)
    first, second = nn.Linear(5, 4).double(), nn.Linear(5, 4).double()
    x = _input().requires_grad_()
    reference_x = x.detach().clone().requires_grad_()
    (first(reference_x) + 2 * second(reference_x)).backward(_cotangent())
    expected = [parameter.grad.clone() for parameter in [*first.parameters(), *second.parameters()]]
    for parameter in [*first.parameters(), *second.parameters()]:
        parameter.grad = None
    a, b = first(x), 2 * second(x)
    grads, state = split_input_gradients(
        [get_gradient_edge(a), b, None], [_cotangent(), _cotangent(), None], [x]
    )
    backward_weight(state)
    assert torch.equal(grads[0], reference_x.grad)
    for parameter, value in zip([*first.parameters(), *second.parameters()], expected, strict=True):
        assert torch.equal(parameter.grad, value)


def test_a_stage_output_graphkit_cannot_use_is_a_clear_error_never_a_none_gradient() -> None:
    stage = _stage()
    x = _input().requires_grad_()
    output = stage(x)
    with pytest.raises(GraphkitInputError, match="stage output 0 is a str"):
        split_input_gradients(["not an output"], [_cotangent()], [x])
    with pytest.raises(GraphkitInputError, match="stage output 1 is a int"):
        stage_backward_input([output, 3], [_cotangent(), None], [x], stage.parameters())
    with pytest.raises(GraphkitInputError, match="GradientEdge"):
        split_input_gradients([get_gradient_edge(output)], None, [x])
    with pytest.raises(GraphkitInputError, match="shape"):
        split_input_gradients([get_gradient_edge(output)], [torch.ones(2, 2)], [x])


def test_the_drop_ins_errors_are_also_the_types_pytorchs_functions_raise_with_its_words() -> None:
    from graphkit.pipelining.stage_backward import OutputGradientsRequiredError, StageBackwardInputError

    stage = _stage()
    x = _input().requires_grad_()
    # as PyTorch's test_stage_backward_input_edge_requires_output_grads (test/distributed/pipelining)
    with pytest.raises(AssertionError, match="requires output gradients") as raised:
        stage_backward_input([get_gradient_edge(stage(x))], None, [x], stage.parameters())
    assert type(raised.value) is OutputGradientsRequiredError and isinstance(raised.value, GraphkitInputError)
    # a cotangent of the wrong shape: PyTorch's function wraps its backward's error in a RuntimeError
    with pytest.raises(RuntimeError, match="Failed to run stage backward input"):
        torch_backward.stage_backward_input([stage(x)], [torch.ones(2, 2)], [x], stage.parameters())
    with pytest.raises(RuntimeError, match="Failed to run stage backward input") as raised:
        stage_backward_input([stage(x)], [torch.ones(2, 2)], [x], stage.parameters())
    assert type(raised.value) is StageBackwardInputError and isinstance(raised.value, GraphkitInputError)
    assert "cotangent for output" in str(raised.value) and "shape (2, 2)" in str(raised.value)


# --- the drop-ins on the caller's side, as PyTorch's ------------------------------------------------


@pytest.mark.parametrize("grad_before", [False, True])
def test_drop_ins_write_input_grad_detach_outputs_and_return_what_pytorchs_do(grad_before: bool) -> None:
    results = {}
    for name, backward_in, backward_w in [
        ("torch", torch_backward.stage_backward_input, torch_backward.stage_backward_weight),
        ("graphkit", stage_backward_input, stage_backward_weight),
    ]:
        stage = _stage()
        if grad_before:
            for parameter in stage.parameters():
                parameter.grad = torch.ones_like(parameter)
        x = _input().requires_grad_()
        if grad_before:
            x.grad = torch.full_like(x, 0.5)
        output = stage(x)
        grads, groups = backward_in([output], [_cotangent()], [x, "kwarg"], stage.parameters())
        assert output.grad_fn is None and not output.requires_grad  # detached in place
        assert grads[1] is None
        returned = backward_w(stage.parameters(), groups, retain_graph=True)
        results[name] = (grads[0], x.grad, returned, [parameter.grad for parameter in stage.parameters()])
    torch_result, graphkit_result = results["torch"], results["graphkit"]
    assert torch.equal(graphkit_result[0], torch_result[0])
    assert torch.equal(graphkit_result[1], torch_result[1])
    assert (graphkit_result[1] is graphkit_result[0]) == (torch_result[1] is torch_result[0])
    assert [value is None for value in graphkit_result[2]] == [value is None for value in torch_result[2]]
    for ours, theirs in zip(graphkit_result[2], torch_result[2], strict=True):
        assert ours is None or torch.allclose(ours, theirs, rtol=0, atol=1e-12)
    for ours, theirs in zip(graphkit_result[3], torch_result[3], strict=True):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-12)


def test_w_with_retain_graph_keeps_the_graph_for_another_backward_and_the_state_stays_single_use() -> None:
    from graphkit.split.backward import SplitError

    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(4, 4, dtype=torch.float64))
    x = _input()[:, :4].clone().requires_grad_()
    scaled = weight.exp()  # a weight-only Node that saves its result
    output = x @ scaled
    grads, groups = stage_backward_input([output], [torch.ones_like(output)], [x], [weight])
    stage_backward_weight([weight], groups, retain_graph=True)
    once = weight.grad.clone()
    scaled.backward(torch.ones_like(scaled))  # runs through the weight-only Node W ran through
    assert weight.grad is not None and not torch.equal(weight.grad, once)
    with pytest.raises(SplitError, match="already used"):
        stage_backward_weight([weight], groups)


# --- PipelineStage(dw_builder=...) as PyTorch's ------------------------------------------------------


class _CustomState:
    """PyTorch's test's state: each ``dw_builder()`` call builds a runner; the runners count their calls."""

    def __init__(self) -> None:
        self.built = 0
        self.ran = 0

    def dw_builder(self):
        self.built += 1

        def dw_runner() -> None:
            self.ran += 1

        return dw_runner


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).sum()


@pytest.mark.parametrize("schedule_class", [torch_schedules.ScheduleGPipe, torch_schedules.Schedule1F1B])
def test_custom_dw_with_fb_schedule(schedule_class: type) -> None:
    microbatches = 4
    model = _stage()
    reference = copy.deepcopy(model)
    state = _CustomState()
    stage = PipelineStage(model, 0, 1, torch.device("cpu"), dw_builder=state.dw_builder)
    schedule = schedule_class(stage, microbatches, loss_fn=_loss, scale_grads=False)
    x = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    target = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    schedule.step(x, target=target)
    assert state.built == state.ran == microbatches  # a schedule without W actions runs each at once
    for chunk, chunk_target in zip(x.chunk(microbatches), target.chunk(microbatches), strict=True):
        _loss(reference(chunk), chunk_target).backward()
    for parameter, expected in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-12, atol=1e-12)


def test_custom_dw_with_a_zero_bubble_schedule_runs_the_runners_in_w_and_input_gradients_are_exact() -> None:
    microbatches = 4
    torch.manual_seed(0)
    layers = [nn.Linear(5, 5).double() for _ in range(2)]
    reference = copy.deepcopy(nn.Sequential(*layers))
    states = [_CustomState(), _CustomState()]
    stages = [
        PipelineStage(layer, index, 2, torch.device("cpu"), dw_builder=state.dw_builder)
        for index, (layer, state) in enumerate(zip(layers, states, strict=True))
    ]
    schedule = torch_schedules.ScheduleInterleavedZeroBubble(
        stages, microbatches, loss_fn=_loss, scale_grads=False
    )
    x = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    target = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    schedule.step(x, target=target)
    for state in states:
        assert state.built == state.ran == microbatches
    for chunk, chunk_target in zip(x.chunk(microbatches), target.chunk(microbatches), strict=True):
        _loss(reference(chunk), chunk_target).backward()
    # stage 0's gradients are exact only if stage 1's I sent it exact input gradients
    for parameter, expected in zip(
        [p for layer in layers for p in layer.parameters()], reference.parameters(), strict=True
    ):
        torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-12, atol=1e-12)


def test_custom_dw_errors() -> None:
    stage = PipelineStage(_stage(), 0, 1, torch.device("cpu"), dw_builder=lambda: None)
    stage.has_backward = True  # as a schedule with a loss sets it
    with pytest.raises(AssertionError, match="backward_one_chunk"):
        stage.backward_weight_one_chunk(bwd_chunk_id=0)
