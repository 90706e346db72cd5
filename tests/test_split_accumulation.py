"""W accumulates into ``.grad`` as a full backward does, and B + W run a full backward's kernels once each.

- A fresh gradient reaches an empty ``.grad`` of a large parameter (``HAND_OVER_BYTES``) the way
  AccumulateGrad takes it in a full backward: taken over (``.grad`` is the very tensor the kernel wrote)
  wherever a full backward's is, never copied - also a Linear's bias (summed over rows as the engine sums
  it) and a weight used without a transpose (``addmm(bias, x, weight)``, GPT-2's Conv1D). A gradient
  something else still refers to (the stage input's gradient) is copied, never shared.
- Nothing B computed is computed again in W: the operators B and W run together are those of a full
  backward, each as often (a TorchDispatchMode counts them), save views, detaches, a scalar root, copies
  into ``.grad`` (of small parameters), and the copy B keeps of a captured gradient that is the caller's
  own cotangent.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from graphkit.split.backward import HAND_OVER_BYTES, backward_input, backward_weight

COPIES = ("new_empty_strided", "copy_", "clone", "empty_like", "empty_strided")
"""Operators a copy of a gradient runs (AccumulateGrad's ``clone_obey_contract``, or a clone)."""
BOOKKEEPING = ("detach", "view", "t", "alias", "zeros")
"""Operators that compute nothing: views, detaches, and the scalar roots of W's host Nodes."""


class _Operators(TorchDispatchMode):
    """Counts each operator called, and notes which operator wrote each storage last."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.writer: dict[int, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.counts[name] += 1
        if name not in BOOKKEEPING:
            for tensor in result if isinstance(result, (tuple, list)) else (result,):
                if isinstance(tensor, torch.Tensor):
                    self.writer[tensor.untyped_storage().data_ptr()] = name
        return result


class _Conv1D(nn.Module):
    """GPT-2's Conv1D: ``addmm(bias, x, weight)``, the weight used without a transpose."""

    def __init__(self, inputs: int, outputs: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(inputs, outputs) * 0.02)
        self.bias = nn.Parameter(torch.randn(outputs) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


def _conv1d_stage() -> tuple[nn.Module, torch.Tensor]:
    stage = nn.Sequential(_Conv1D(256, 512), nn.GELU(), nn.LayerNorm(512), _Conv1D(512, 256))
    return stage, torch.randn(16, 256)


def _linear_stage() -> tuple[nn.Module, torch.Tensor]:
    # the first bias holds HAND_OVER_BYTES: W sums its rows and hands it over
    return nn.Sequential(nn.Linear(16, 32768), nn.Tanh(), nn.Linear(32768, 16)), torch.randn(4, 16)


def _encoder_stage() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(2, 8, 32)


STAGES = {"conv1d": _conv1d_stage, "linear": _linear_stage, "encoder": _encoder_stage}
LARGE_PARAMETERS = {"conv1d": 2, "linear": 3}
"""Per stage with parameters of at least HAND_OVER_BYTES, how many it has."""


def _run(stage: nn.Module, x: torch.Tensor, split: bool) -> tuple[_Operators, torch.Tensor | None]:
    x = x.clone().requires_grad_()
    output = stage(x)
    cotangent = torch.randn(output.shape, generator=torch.Generator().manual_seed(0))
    with _Operators() as operators:
        if split:
            state = backward_input(output, cotangent, x)
            del output
            backward_weight(state)
            return operators, state.input_grads[0]
        output.backward(cotangent)
    return operators, x.grad


@pytest.mark.parametrize("name", sorted(LARGE_PARAMETERS))
@pytest.mark.parametrize("hooked", [False, True])
def test_w_takes_fresh_gradients_over_as_a_full_backward_does(name: str, hooked: bool) -> None:
    torch.manual_seed(0)
    stage, x = STAGES[name]()
    reference = copy.deepcopy(stage)
    if hooked:  # AccumulateGrad then expects one more reference (its post hooks')
        for module in (stage, reference):
            next(module.parameters()).register_post_accumulate_grad_hook(lambda parameter: None)
    full, _ = _run(reference, x, split=False)
    split, _ = _run(stage, x, split=True)
    large = 0
    for (parameter_name, parameter), expected in zip(
        stage.named_parameters(), reference.parameters(), strict=True
    ):
        assert torch.equal(parameter.grad, expected.grad), parameter_name
        if parameter.numel() * parameter.element_size() < HAND_OVER_BYTES:
            continue  # W may copy a small one (cheaper than handing it over)
        large += 1
        full_writer = full.writer[expected.grad.untyped_storage().data_ptr()]
        split_writer = split.writer[parameter.grad.untyped_storage().data_ptr()]
        assert full_writer not in COPIES, parameter_name  # the oracle: a full backward takes them over
        assert split_writer == full_writer, parameter_name
    assert large == LARGE_PARAMETERS[name]


def test_a_gradient_the_stage_input_also_receives_is_copied_never_shared() -> None:
    # x + p passes the same gradient to x and p: W must not make p.grad the caller's input gradient
    parameter = nn.Parameter(torch.zeros(64, 1024))
    x = torch.randn(64, 1024, requires_grad=True)
    cotangent = torch.randn(64, 1024)
    state = backward_input(torch.tanh(x + parameter), cotangent, x)
    backward_weight(state)
    (input_grad,) = state.input_grads
    assert torch.equal(parameter.grad, input_grad)
    assert parameter.grad.untyped_storage().data_ptr() != input_grad.untyped_storage().data_ptr()
    input_grad.mul_(0)  # the caller's to change
    assert parameter.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(STAGES))
def test_b_and_w_run_each_kernel_of_a_full_backward_once(name: str) -> None:
    torch.manual_seed(0)
    stage, x = STAGES[name]()
    full, _ = _run(copy.deepcopy(stage), x, split=False)
    split, _ = _run(stage, x, split=True)
    ignored = (*BOOKKEEPING, "new_empty_strided", "copy_")  # copies into the .grad of small parameters
    computing = lambda counts: Counter({op: n for op, n in counts.items() if op not in ignored})  # noqa: E731
    assert computing(full.counts) - computing(split.counts) == Counter()
    # B keeps a copy of a captured gradient that is the caller's cotangent (which the caller may reuse
    # before W): the one operator B + W may add, once per stage output
    assert computing(split.counts) - computing(full.counts) in (Counter(), Counter(clone=1))
