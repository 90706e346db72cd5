"""Non-reentrant activation checkpointing under the split: recomputations counted, gradients against a full
backward (float64), FLOPs and memory between B and W for both recompute policies."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import GraphExecGroup, checkpoint

from graphkit.measure.benchmark import memory_kept
from graphkit.measure.flops import FlopCounter
from graphkit.measure.verification import verify_split
from graphkit.split import checkpointing
from graphkit.split.backward import backward_input, backward_weight
from graphkit.split.checkpointing import Recompute
from tests.opaque_models import FORWARDS, CheckpointedStage


def _stage(**options):
    torch.manual_seed(0)
    return CheckpointedStage(**options).double()


def _inputs():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    grad = torch.randn(5, 8, generator=generator, dtype=torch.float64)
    return x, grad


def _full_backward(stage):
    """The oracle: torch.autograd.backward on a copy; gradients, recomputations, FLOPs."""
    stage = copy.deepcopy(stage)
    x, grad = _inputs()
    x.requires_grad_()
    out = stage(x)
    FORWARDS["count"] = 0
    with FlopCounter() as counter:
        out.backward(grad)
    grads = {name: p.grad for name, p in stage.named_parameters()}
    return grads, x.grad, FORWARDS["count"], counter.get_total_flops()


def _split(stage, recompute=Recompute.IN_W):
    """B then W, the stage outputs dropped in between, as a pipeline does."""
    x, grad = _inputs()
    x.requires_grad_()
    out = stage(x)
    FORWARDS["count"] = 0
    with FlopCounter() as b_counter:
        state = backward_input(out, grad, x, recompute=recompute)
    b_recomputations = FORWARDS["count"]
    del out
    retained, _ = memory_kept(state)
    with FlopCounter() as w_counter:
        backward_weight(state)
    return {
        "grads": {name: p.grad for name, p in stage.named_parameters()},
        "input_grad": state.input_grads[0],
        "b": b_recomputations,
        "w": FORWARDS["count"] - b_recomputations,
        "b_flops": b_counter.get_total_flops(),
        "w_flops": w_counter.get_total_flops(),
        "retained_bytes": retained,
    }


def _assert_exact(expected, actual):
    assert expected.keys() == actual.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, rtol=1e-12, atol=1e-12, msg=name)


def _recomputation_flops():
    """FLOPs of recomputing the four blocks once: the checkpointed full backward less the plain one
    (PyTorch stops a recomputation once the last saved tensor is back, before the block's last Linear)."""
    return _full_backward(_stage())[3] - _full_backward(_stage(checkpointed=False))[3]


def test_in_w_policy_recomputes_each_block_once_per_phase_with_exact_gradients():
    stage = _stage()
    expected, expected_input, full_recomputations, full_flops = _full_backward(stage)
    result = _split(stage, Recompute.IN_W)
    _assert_exact(expected, result["grads"])
    torch.testing.assert_close(result["input_grad"], expected_input, rtol=1e-12, atol=1e-12)
    assert full_recomputations == 4
    # at most twice over B + W: once for B, once more for W (8 forwards for the 4 blocks)
    assert (result["b"], result["w"]) == (4, 4)
    # FLOPs: a full backward plus W's recomputation of the blocks, nothing else
    assert _recomputation_flops() > 0
    assert result["b_flops"] + result["w_flops"] == full_flops + _recomputation_flops()


def test_keep_from_b_policy_recomputes_each_block_once_in_all():
    stage = _stage()
    expected, _, _, full_flops = _full_backward(stage)
    result = _split(stage, Recompute.KEEP_FROM_B)
    _assert_exact(expected, result["grads"])
    assert (result["b"], result["w"]) == (4, 0)
    assert result["b_flops"] + result["w_flops"] == full_flops


def test_in_w_keeps_only_the_checkpoint_inputs_between_b_and_w():
    in_w = _split(_stage(), Recompute.IN_W)["retained_bytes"]
    keep = _split(_stage(), Recompute.KEEP_FROM_B)["retained_bytes"]
    plain = _split(_stage(checkpointed=False))["retained_bytes"]
    # in W: the four block inputs (5 x 8 float64 each) and the captured gradients, nothing recomputed
    block_inputs = 4 * 5 * 8 * 8
    # keeping B's recomputation holds what the W phase's Nodes saved, as without checkpointing, and the
    # regions' inputs; without checkpointing W reads no block input (each block's LayerNorm, which
    # saved it, had its weight gradients computed in B)
    assert keep == plain + block_inputs
    assert in_w < keep
    assert in_w >= block_inputs
    stage = _stage()
    x, grad = _inputs()
    out = stage(x.requires_grad_())
    state = backward_input(out, grad, x)
    del out
    assert state._checkpoints is not None
    kept = state._checkpoints.tensors()
    assert sum(tensor.numel() * tensor.element_size() for tensor in kept) == block_inputs
    backward_weight(state)


def test_nothing_recomputed_stays_in_the_checkpoint_frames_after_w():
    stage = _stage()
    x, grad = _inputs()
    out = stage(x.requires_grad_())
    state = backward_input(out, grad, x, recompute="keep-from-b")
    regions = state._checkpoints
    frames = list(regions.frames)
    assert len(frames) == 4
    assert all(frame.recomputed for frame in frames)  # B's recomputation, kept for W
    backward_weight(state)
    assert all(not frame.recomputed for frame in frames)
    assert regions.recomputations == {"b": 4, "w": 0}


def test_a_bad_recompute_policy_is_refused_with_the_choices():
    stage = _stage()
    x, grad = _inputs()
    out = stage(x.requires_grad_())
    with pytest.raises(ValueError, match="'in-w', 'keep-from-b'"):
        backward_input(out, grad, x, recompute="later")


def test_a_callers_graph_exec_group_is_restored_and_does_not_change_the_counts():
    stage = _stage()
    expected, *_ = _full_backward(stage)
    group = GraphExecGroup()
    with group:
        result = _split(stage)
        assert torch._C._get_graph_exec_group() is group
    _assert_exact(expected, result["grads"])
    assert (result["b"], result["w"]) == (4, 4)


def test_checkpoint_debug_mode_is_found_and_recomputed_once():
    # checkpoint(debug=True) wraps the unpack hook, and its recomputation context can be entered only
    # once (torch/utils/checkpoint.py): B's recomputation is kept for W whatever the policy
    stage = _stage(debug=True)
    expected, *_ = _full_backward(stage)
    result = _split(stage, Recompute.IN_W)
    _assert_exact(expected, result["grads"])
    assert (result["b"], result["w"]) == (4, 0)


@pytest.mark.parametrize("recompute", list(Recompute))
def test_a_weight_only_op_inside_a_checkpointed_region_is_recomputed_once_in_w(recompute):
    # W / W.norm() lies on the weight-only path inside the region: W's second engine call unpacks it
    # under the same group as the direct Node calls, so the region is still recomputed once in W
    calls = {"count": 0}
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(6, 4, dtype=torch.float64))
    bias = nn.Parameter(torch.randn(6, dtype=torch.float64))

    def region(x):
        calls["count"] += 1
        return torch.tanh(nn.functional.linear(x, weight / weight.norm(), bias)) * 2

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 6, dtype=torch.float64)
    checkpoint(region, x, use_reentrant=False).backward(grad)
    expected = (weight.grad.clone(), bias.grad.clone(), x.grad.clone())
    weight.grad = bias.grad = None
    fresh = x.detach().requires_grad_()
    out = checkpoint(region, fresh, use_reentrant=False)
    calls["count"] = 0
    state = backward_input(out, grad, fresh, recompute=recompute)
    assert calls["count"] == 1
    del out
    backward_weight(state)
    assert calls["count"] == (2 if recompute is Recompute.IN_W else 1)
    for actual, reference in zip((weight.grad, bias.grad, state.input_grads[0]), expected, strict=True):
        torch.testing.assert_close(actual, reference, rtol=1e-12, atol=1e-12)


def test_verify_counts_the_flops_of_a_checkpointed_stage():
    report = verify_split(_stage(), (torch.randn(5, 8, requires_grad=True),), dtype=torch.float64)
    assert report.ok, report.table()
    assert "flops_note" not in report.extra
    assert report.flops["b"] + report.flops["w"] == report.flops["full"] + _recomputation_flops()


def test_pinned_private_details_of_torch_utils_checkpoint():
    """graphkit relies on these (graphkit/split/checkpointing.py): fail loudly when PyTorch changes them."""
    import torch.utils.checkpoint as module

    for name in ("_CheckpointFrame", "_Handle", "_Holder", "_StopRecomputationError", "CheckpointFunction"):
        assert hasattr(module, name), name
    assert hasattr(torch._C, "_get_graph_exec_group") and hasattr(torch._C, "_set_graph_exec_group")
    linear = nn.Linear(3, 3)
    out = checkpoint(linear, torch.randn(2, 3, requires_grad=True), use_reentrant=False)
    saved = out.grad_fn._raw_saved_mat1
    frame = checkpointing.checkpoint_frame(saved)
    assert isinstance(frame, module._CheckpointFrame)
    assert isinstance(saved.data, module._Holder) and isinstance(saved.data.handles, dict)
    for attribute in (
        "recompute_fn",
        "recomputed",
        "is_recomputed",
        "recomp_counter",
        "weak_holders",
        "saved_args",
    ):
        assert hasattr(frame, attribute), attribute
    assert any(reference() is saved.data for reference in frame.weak_holders)


@pytest.mark.parametrize("recompute", list(Recompute))
def test_stage_compute_passes_the_recompute_policy_on(recompute):
    from graphkit.split.stage_compute import StageCompute

    stage = _stage()
    expected, *_ = _full_backward(stage)
    compute = StageCompute(stage, recompute=recompute)
    x, grad = _inputs()
    compute.forward(0, {"x": x.requires_grad_()})
    FORWARDS["count"] = 0
    compute.backward_input(0, {"output": grad})
    compute.backward_weight(0)
    assert FORWARDS["count"] == (8 if recompute is Recompute.IN_W else 4)
    _assert_exact(expected, {name: p.grad for name, p in stage.named_parameters()})
    with pytest.raises(ValueError, match="recompute must be one of"):
        StageCompute(stage, recompute="never")


class _HonoursNeedsInputGrad(torch.autograd.Function):
    """``x @ weight`` computing only what ``ctx.needs_input_grad`` asks for; counts forwards and records
    the flags of each backward."""

    forwards = 0
    seen: list = []

    @staticmethod
    def forward(ctx, x, weight):
        _HonoursNeedsInputGrad.forwards += 1
        ctx.save_for_backward(x, weight)
        return x @ weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        _HonoursNeedsInputGrad.seen.append(tuple(ctx.needs_input_grad))
        grad_x = grad @ weight.t() if ctx.needs_input_grad[0] else None
        grad_weight = x.t() @ grad if ctx.needs_input_grad[1] else None
        return grad_x, grad_weight


class _CheckpointedCustomFunction(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Parameter(torch.randn(8, 8, dtype=torch.float64))
        self.second = nn.Parameter(torch.randn(8, 8, dtype=torch.float64))

    def block(self, h):
        return torch.tanh(_HonoursNeedsInputGrad.apply(torch.sin(h), self.first)) @ self.second

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=False)


@pytest.mark.parametrize(("recompute", "forwards_in_w"), [("in-w", 1), ("keep-from-b", 0)])
def test_a_custom_function_inside_a_checkpoint_is_asked_per_phase_and_recomputed_as_the_policy_says(
    recompute, forwards_in_w
):
    torch.manual_seed(0)
    stage = _CheckpointedCustomFunction()
    reference = copy.deepcopy(stage)
    x, grad = _inputs()
    reference_x = x.clone().requires_grad_()
    reference(reference_x).backward(grad)
    x.requires_grad_()
    out = stage(x)
    _HonoursNeedsInputGrad.forwards, _HonoursNeedsInputGrad.seen = 0, []
    state = backward_input(out, grad, x, recompute=recompute)
    assert (_HonoursNeedsInputGrad.forwards, _HonoursNeedsInputGrad.seen) == (1, [(True, False)])
    del out
    backward_weight(state)
    assert _HonoursNeedsInputGrad.forwards == 1 + forwards_in_w
    assert _HonoursNeedsInputGrad.seen == [(True, False), (False, True)]  # B: the input path; W: the weight
    torch.testing.assert_close(state.input_grads[0], reference_x.grad, rtol=1e-12, atol=1e-12)
    for parameter, expected in zip(stage.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(parameter.grad, expected.grad, rtol=1e-12, atol=1e-12)
    # verify_split counts the custom Function's W call (made outside the engine) for its Node: it does
    # each half once, so it repeats nothing
    report = verify_split(_CheckpointedCustomFunction(), (x.detach().requires_grad_(),), recompute=recompute)
    assert report.ok
    [custom] = [cost for cost in report.opaque if cost.op == "_HonoursNeedsInputGrad"]
    assert custom.flops["w"] > 0 and custom.flops["b"] > 0
    assert custom.repeated == 0 and custom.flops["b"] + custom.flops["w"] == custom.flops["full"]
