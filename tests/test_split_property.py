"""Split backward on random models: B then W equals PyTorch's full backward on every model hypothesis draws.

The generator (tests/models.py) mixes linear and elementwise ops, reductions, chunks, transposes, detached
branches and in-place ops, and (in half the draws) custom Functions that compute only what
``ctx.needs_input_grad`` asks for (and some that return None for a weight-side argument computed by
another custom Function from a parameter, which a full backward still runs on a missing gradient: the
parameter's ``.grad`` becomes zeros, or stays None without materializing), with parameters used several
times, tied under two names and returned as outputs, over inputs of which some require grad. B + W must cost exactly a full backward's FLOPs, custom
Functions included: graphkit sets their ``needs_input_grad`` per phase.
"""

from __future__ import annotations

import copy

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from graphkit.split.backward import backward_input, backward_weight
from graphkit.split.checkpointing import Recompute
from tests.models import random_model


def _float64(module, inputs):
    module = module.double()
    inputs = {
        name: tensor.detach().double().requires_grad_(tensor.requires_grad) for name, tensor in inputs.items()
    }
    return module, inputs


def _run(module, inputs):
    fresh = {
        name: tensor.detach().clone().requires_grad_(tensor.requires_grad) for name, tensor in inputs.items()
    }
    outputs = [tensor for tensor in module(**fresh)]
    generator = torch.Generator().manual_seed(0)
    grads = [torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) for tensor in outputs]
    return fresh, outputs, grads


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_split_equals_full_backward_on_random_models(data):
    module, inputs = _float64(*random_model(data, custom_functions=data.draw(st.booleans())))
    reference = copy.deepcopy(module)

    fresh, outputs, grads = _run(reference, inputs)
    pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True) if out.requires_grad]
    with FlopCounterMode(display=False) as full_counter:
        torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
    expected_inputs = {name: tensor.grad for name, tensor in fresh.items()}

    fresh, outputs, grads = _run(module, inputs)
    grads = [grad if out.requires_grad else None for out, grad in zip(outputs, grads, strict=True)]
    with FlopCounterMode(display=False) as b_counter:
        state = backward_input(outputs, grads, fresh)
    # W in one engine call, or (flush threshold 0) in one call per flush point of the plan
    flush_bytes = data.draw(st.sampled_from([None, 0]), label="flush bytes")
    with FlopCounterMode(display=False) as w_counter:
        backward_weight(state, flush_bytes=flush_bytes)

    for (name, parameter), (_, expected) in zip(
        module.named_parameters(), reference.named_parameters(), strict=True
    ):
        if expected.grad is None:
            assert parameter.grad is None, name
        else:
            assert parameter.grad is not None, f"{name} received no gradient"
            torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-10, atol=1e-12, msg=name)
    for (name, _), grad in zip(fresh.items(), state.input_grads, strict=True):
        if expected_inputs[name] is None:
            assert grad is None, f"{name} should receive no gradient"
        else:
            torch.testing.assert_close(grad, expected_inputs[name], rtol=1e-10, atol=1e-12, msg=name)
    assert b_counter.get_total_flops() + w_counter.get_total_flops() == full_counter.get_total_flops()


class _CheckpointedWhole(torch.nn.Module):
    """The random model as one region under non-reentrant activation checkpointing; counts its forwards."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.forwards = 0

    def forward(self, **inputs):
        def region(**arguments):
            self.forwards += 1
            return self.inner(**arguments)

        return checkpoint(region, use_reentrant=False, **inputs)


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from(list(Recompute)))
def test_checkpointed_random_models_are_exact_and_recomputed_at_most_once_per_phase(data, recompute):
    module, inputs = _float64(*random_model(data))
    reference = copy.deepcopy(module)  # the oracle runs without checkpointing
    fresh, outputs, grads = _run(reference, inputs)
    pairs = [(out, grad) for out, grad in zip(outputs, grads, strict=True) if out.requires_grad]
    torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
    expected_inputs = {name: tensor.grad for name, tensor in fresh.items()}

    stage = _CheckpointedWhole(module)
    fresh, outputs, grads = _run(stage, inputs)
    grads = [grad if out.requires_grad else None for out, grad in zip(outputs, grads, strict=True)]
    stage.forwards = 0
    state = backward_input(outputs, grads, fresh, recompute=recompute)
    in_b = stage.forwards
    del outputs
    backward_weight(state)
    # at most once in B and once in W; keeping B's recomputation: at most once in all (W recomputes
    # only where B did not, as in a stage whose inputs need no gradient)
    assert in_b <= 1 and stage.forwards - in_b <= 1
    assert stage.forwards <= (2 if recompute is Recompute.IN_W else 1)
    for (name, parameter), (_, expected) in zip(
        module.named_parameters(), reference.named_parameters(), strict=True
    ):
        if expected.grad is None:
            assert parameter.grad is None, name
        else:
            torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-10, atol=1e-12, msg=name)
    for (name, _), grad in zip(fresh.items(), state.input_grads, strict=True):
        if expected_inputs[name] is None:
            assert grad is None, name
        else:
            torch.testing.assert_close(grad, expected_inputs[name], rtol=1e-10, atol=1e-12, msg=name)
