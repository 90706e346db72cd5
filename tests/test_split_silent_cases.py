"""Cases where the split once went silently wrong: each is now exact, or refused before anything runs.

- a non-reentrant checkpoint with ``preserve_rng_state=False`` around dropout (W recomputed with a fresh
  random draw), under both recompute policies, and ``verify_split`` on it;
- ``register_multi_grad_hook(..., mode="all")`` over an input-path and a weight-side tensor (fired once
  per phase with part of the gradients): refused;
- stage-input gradients with other strides than a full backward's ``.grad`` (LSTM over a
  ``PackedSequence``, fft);
- a module full backward hook on a module wholly on the weight side: runs once, in W, exactly (as the
  docs say);
- an activation whose ``.data`` a hook replaces during B, before the Node that saved it runs (restoring
  an offloaded activation): W must read the new data, so the formulas read saved tensors after B's
  engine call, never before;
- a parameter that is a stage output and also feeds intermediates (bfloat16): W hands the output's
  cotangent to its Node first, as a full backward's GraphRoot does.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from graphkit import backward_input, backward_weight, verify_split
from graphkit.split.backward import SplitError


class _DropoutRegion(nn.Module):
    def __init__(self, preserve_rng_state: bool) -> None:
        super().__init__()
        self.inner = nn.Linear(8, 8)
        self.outer = nn.Linear(8, 8)
        self.preserve_rng_state = preserve_rng_state

    def region(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.inner(x), 0.5, training=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = checkpoint(self.region, x, use_reentrant=False, preserve_rng_state=self.preserve_rng_state)
        return self.outer(hidden)


@pytest.mark.parametrize("recompute", ["in-w", "keep-from-b"])
def test_a_checkpoint_without_rng_state_gives_w_the_dropout_mask_b_saw(recompute: str) -> None:
    torch.manual_seed(0)
    stage = _DropoutRegion(preserve_rng_state=False).double()
    reference = copy.deepcopy(stage)
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cotangent = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    torch.manual_seed(10)
    x_reference = x.clone().requires_grad_()
    output = reference(x_reference)
    torch.manual_seed(20)
    output.backward(cotangent)
    after_full = torch.get_rng_state()

    torch.manual_seed(10)
    x_split = x.clone().requires_grad_()
    output = stage(x_split)
    torch.manual_seed(20)
    state = backward_input(output, cotangent, x_split, recompute=recompute)
    backward_weight(state)
    assert torch.equal(state.input_grads[0], x_reference.grad)
    for parameter, expected in zip(stage.parameters(), reference.parameters(), strict=True):
        assert torch.equal(parameter.grad, expected.grad)
    assert torch.equal(torch.get_rng_state(), after_full)  # the random stream moved on as in a full backward


@pytest.mark.parametrize("preserve_rng_state", [True, False])
@pytest.mark.parametrize("input_requires_grad", [True, False])
@pytest.mark.parametrize("recompute", ["in-w", "keep-from-b"])
def test_verify_split_reports_checkpointed_dropout_exact_under_both_policies(
    recompute: str, input_requires_grad: bool, preserve_rng_state: bool
) -> None:
    torch.manual_seed(0)
    stage = _DropoutRegion(preserve_rng_state).double()
    x = torch.randn(4, 8, dtype=torch.float64).requires_grad_(input_requires_grad)
    report = verify_split(stage, x, recompute=recompute)
    assert report.ok, report


def _multi_hook_stage() -> tuple[nn.Linear, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4, requires_grad=True)
    hidden = layer(x)  # on the input path
    scaled = layer.weight * 2  # on the weight side
    return layer, x, hidden, scaled, hidden @ scaled


def test_a_multi_grad_hook_over_both_sides_is_refused_before_it_fires() -> None:
    _, x, hidden, scaled, output = _multi_hook_stage()
    calls = []
    torch.autograd.graph.register_multi_grad_hook((hidden, scaled), calls.append, mode="all")
    with pytest.raises(SplitError, match="register_multi_grad_hook"):
        backward_input(output, torch.ones_like(output), x)
    assert calls == []
    assert torch._C._will_engine_execute_node.__module__ is None or "graphkit" not in str(
        torch._C._will_engine_execute_node
    )  # the engine query is PyTorch's own again


def test_multi_grad_hooks_over_one_side_fire_once_with_a_full_backwards_gradients() -> None:
    calls: dict[str, list] = {}
    for run in ("split", "full"):
        _, x, hidden, scaled, output = _multi_hook_stage()
        calls[run] = []
        hidden_tanh, scaled_exp = hidden.tanh(), scaled.exp()
        output = output + hidden_tanh @ scaled_exp
        torch.autograd.graph.register_multi_grad_hook((hidden, hidden_tanh), calls[run].append, mode="all")
        torch.autograd.graph.register_multi_grad_hook((scaled, scaled_exp), calls[run].append, mode="all")
        if run == "split":
            backward_weight(backward_input(output, torch.ones_like(output), x))
        else:
            output.backward(torch.ones_like(output))
    assert len(calls["split"]) == len(calls["full"]) == 2

    def by_shape(grads: list) -> tuple[int, ...]:
        return tuple(grads[0].shape)

    for ours, theirs in zip(
        sorted(calls["split"], key=by_shape), sorted(calls["full"], key=by_shape), strict=True
    ):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def _packed_lstm(lstm: nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    packed = nn.utils.rnn.pack_padded_sequence(x, [3, 2], batch_first=True)
    output, _ = lstm(packed)
    return nn.utils.rnn.pad_packed_sequence(output, batch_first=True)[0]


@pytest.mark.parametrize(
    ("name", "shape"),
    [("packed_lstm", (2, 3, 4)), ("irfft", (5, 3)), ("fft2", (4, 6)), ("rfft_dim0", (8, 3))],
)
def test_input_gradients_have_a_full_backwards_strides(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    lstm = nn.LSTM(4, 5, batch_first=True).double()
    stage = {
        "packed_lstm": lambda x: _packed_lstm(lstm, x),
        "irfft": lambda x: torch.fft.irfft(x * 2, dim=0),
        "fft2": lambda x: torch.fft.fft2(x).real,
        "rfft_dim0": lambda x: torch.fft.rfft(x, dim=0).abs(),
    }[name]
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    output = stage(x)
    cotangent = torch.randn_like(output)
    state = backward_input(output, cotangent, x)
    backward_weight(state)
    x_reference = x.detach().clone().requires_grad_()
    stage(x_reference).backward(cotangent)
    assert torch.equal(state.input_grads[0], x_reference.grad)
    assert state.input_grads[0].stride() == x_reference.grad.stride()


def test_a_full_backward_hook_on_a_module_wholly_on_the_weight_side_runs_once_in_w() -> None:
    torch.manual_seed(0)
    layer, scale = nn.Linear(4, 4).double(), nn.Linear(4, 4).double()
    bias = nn.Parameter(torch.randn(4, dtype=torch.float64))
    parameters = [*layer.parameters(), *scale.parameters(), bias]
    seen: list[torch.Tensor] = []
    scale.register_full_backward_hook(lambda module, grad_input, grad_output: seen.append(grad_output[0]))
    results = []
    for split in (False, True):
        seen.clear()
        for parameter in parameters:
            parameter.grad = None
        x = torch.randn(
            2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
        ).requires_grad_()
        output = layer(x) * scale(bias * 2)  # scale's one input depends on a parameter alone
        if split:
            state = backward_input(output, torch.ones_like(output), x)
            assert seen == []  # not in B
            backward_weight(state)
            grad = state.input_grads[0]
        else:
            output.backward(torch.ones_like(output))
            grad = x.grad
        results.append((grad, [parameter.grad.clone() for parameter in parameters], list(seen)))
    (full_grad, full_params, full_seen), (split_grad, split_params, split_seen) = results
    assert torch.equal(split_grad, full_grad)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(split_params, full_params, strict=True))
    assert len(split_seen) == len(full_seen) == 1 and torch.equal(split_seen[0], full_seen[0])


@pytest.mark.parametrize("restore", ["scaled", "offloaded"])
def test_an_activation_replaced_during_b_reaches_w_as_in_a_full_backward(restore: str) -> None:
    def run(split: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        first, second = nn.Linear(4, 5), nn.Linear(5, 3)
        inputs = torch.randn(6, 4, requires_grad=True)
        hidden = torch.tanh(first(inputs))
        kept = hidden.data.clone()
        output = second(hidden)
        if restore == "offloaded":
            hidden.data = torch.empty(0)  # offloaded after the forward: the hook below brings it back

        def hook(_grad: torch.Tensor) -> None:
            hidden.data = kept * 2 if restore == "scaled" else kept

        output.register_hook(hook)
        if split:
            backward_weight(backward_input(output, torch.ones_like(output), inputs))
        else:
            output.backward(torch.ones_like(output))
        return [parameter.grad for parameter in (*first.parameters(), *second.parameters())]

    for split_grad, full_grad in zip(run(True), run(False), strict=True):
        assert torch.equal(split_grad, full_grad)


@pytest.mark.parametrize("tied", ["layer_norm", "multiplication"])
def test_a_parameter_that_is_an_output_and_feeds_intermediates_sums_its_cotangent_first(tied: str) -> None:
    # a full backward's GraphRoot hands the parameter's own cotangent to its AccumulateGrad Node before
    # any intermediate runs; W once added it last, which bfloat16 shows
    torch.manual_seed(0)
    if tied == "layer_norm":
        norm = nn.LayerNorm(8)
        stage = nn.Sequential(nn.Linear(8, 8), norm, nn.Tanh(), nn.Linear(8, 8), norm).to(torch.bfloat16)
        parameter = norm.weight
    else:
        parameter = nn.Parameter(torch.randn(8, dtype=torch.bfloat16))

        def stage(x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x * parameter) * parameter

    cotangents = [torch.randn(64, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16) * 100]
    x = torch.randn(64, 8, dtype=torch.bfloat16)
    torch.autograd.backward([stage(x.clone().requires_grad_()), parameter], cotangents)
    expected = parameter.grad.clone()
    parameter.grad = None
    x_split = x.clone().requires_grad_()
    backward_weight(backward_input([stage(x_split), parameter], cotangents, [x_split]))
    assert torch.equal(parameter.grad, expected)


class _NoGradientToSecond(torch.autograd.Function):
    """``first * second`` whose backward returns None for ``second`` (a straight-through style op)."""

    @staticmethod
    def forward(ctx, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(second)
        return first * second

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        (second,) = ctx.saved_tensors
        return (grad * second if ctx.needs_input_grad[0] else None), None


def _doubled_by_custom_function(materialize: bool) -> tuple[type, list[int]]:
    """A custom Function ``2 * value`` that counts its backward calls (materializing missing gradients as
    zeros unless ``materialize`` is False), and the list of counts."""
    calls: list[int] = []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, value: torch.Tensor) -> torch.Tensor:
            ctx.set_materialize_grads(materialize)
            return value * 2

        @staticmethod
        def backward(ctx, grad: torch.Tensor | None) -> torch.Tensor | None:
            calls.append(1)
            return None if grad is None else grad * 2

    return Double, calls


def _missing_gradient_stage(kind: str, materialize: bool) -> tuple[Any, list[nn.Parameter], list[int]]:
    """A stage whose weight-side input of ``_NoGradientToSecond`` comes from a parameter through ``kind``:
    a custom Function (``custom``), a custom Function then an input-path ``mul`` that receives no
    gradient at all (``custom_then_mul``), or C++ ops only (``builtin``); plus a Linear that gets a real
    gradient."""
    torch.manual_seed(0)
    Double, calls = _doubled_by_custom_function(materialize)
    scale = nn.Parameter(torch.randn(4, dtype=torch.float64))
    layer = nn.Linear(4, 4).double()

    def stage(x: torch.Tensor) -> torch.Tensor:
        hidden = layer(x)
        if kind == "builtin":
            second = (scale * 2).exp()
        else:
            second = Double.apply(scale)
            if kind == "custom_then_mul":
                second = hidden * second
        return torch.tanh(_NoGradientToSecond.apply(hidden, second))

    return stage, [scale, *layer.parameters()], calls


@pytest.mark.parametrize("materialize", [True, False])
@pytest.mark.parametrize("kind", ["custom", "custom_then_mul", "builtin"])
def test_a_weight_side_input_given_no_gradient_leaves_grad_as_a_full_backward_does(
    kind: str, materialize: bool
) -> None:
    # a full backward runs the parameter's Nodes on a missing gradient: a custom Function materializes
    # it as zeros (``.grad`` becomes zeros) unless set_materialize_grads(False); C++ Nodes pass None on
    stage, parameters, calls = _missing_gradient_stage(kind, materialize)
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cotangent = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    x_full = x.clone().requires_grad_()
    stage(x_full).backward(cotangent)
    expected = [None if parameter.grad is None else parameter.grad.clone() for parameter in parameters]
    full_calls = len(calls)
    for parameter in parameters:
        parameter.grad = None
    calls.clear()
    x_split = x.clone().requires_grad_()
    state = backward_input(stage(x_split), cotangent, x_split)
    assert parameters[0].grad is None
    backward_weight(state)
    assert torch.equal(state.input_grads[0], x_full.grad)
    assert len(calls) == full_calls  # the custom Function's backward ran as often as in a full backward
    zero_grad = kind != "builtin" and materialize
    assert (expected[0] is not None) == zero_grad  # the oracle itself: zeros only through materializing
    for parameter, grad in zip(parameters, expected, strict=True):
        if grad is None:
            assert parameter.grad is None
        else:
            assert torch.equal(parameter.grad, grad)


def test_a_missing_gradient_meets_a_real_one_on_the_same_weight_side_node() -> None:
    # the parameter's custom Function gets a real gradient through another use: W must not hand it a
    # missing one (nor zeros) instead
    Double, calls = _doubled_by_custom_function(True)
    torch.manual_seed(0)
    scale = nn.Parameter(torch.randn(4, dtype=torch.float64))

    def stage(x: torch.Tensor) -> torch.Tensor:
        doubled = Double.apply(scale)
        return _NoGradientToSecond.apply(x, doubled) + x * doubled

    x = torch.randn(3, 4, dtype=torch.float64)
    x_full = x.clone().requires_grad_()
    stage(x_full).sum().backward()
    expected, scale.grad = scale.grad.clone(), None
    x_split = x.clone().requires_grad_()
    backward_weight(backward_input(stage(x_split), torch.ones(3, 4, dtype=torch.float64), x_split))
    assert torch.equal(scale.grad, expected) and expected.abs().sum() > 0
    assert len(calls) == 2
